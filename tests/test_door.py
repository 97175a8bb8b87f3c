"""The admission coalesce door, decided with a fake clock."""

from __future__ import annotations

import pytest

from tailgate.config import KnobError, parse_admit_coalesce_ms
from tailgate.engine.door import CoalesceDoor, DoorView as V, PricedDoor
from tailgate.engine.step_cost import StepCostModel

T = 1000.0
W = 0.25  # exact in binary, so T + W - T == W


def door(max_prompts=4):
    return CoalesceDoor(W, max_prompts)


def test_an_idle_roster_opens_and_clears_the_timer():
    d = door()
    d.since = T - 5
    assert d.decide(V(1, 0, 8), T) == (True, "idle") and d.since is None


def test_an_empty_queue_opens():
    d = door()
    assert d.decide(V(0, 4, 8), T)[0] and d.since is None


def test_a_shallow_batch_opens():
    d = door()
    assert d.decide(V(1, 1, 8), T) == (True, "shallow") and d.since is None  # (1+1)*2 = 4 < 8


def test_a_deep_under_cohort_batch_closes_and_pins_the_timer():
    d = door()
    assert not d.decide(V(1, 3, 8), T)[0] and d.since == T
    assert not d.decide(V(1, 3, 8), T + 0.001)[0] and d.since == T


def test_a_full_cohort_opens_and_clears():
    d = door()
    assert not d.decide(V(1, 4, 8), T)[0]
    assert d.decide(V(4, 4, 8), T + 0.01) == (True, "cohort") and d.since is None  # cohort min(4, 4)


def test_an_elapsed_window_opens_no_earlier_than_the_window():
    d = door()
    assert not d.decide(V(1, 3, 8), T)[0]
    assert not d.decide(V(1, 3, 8), T + W - 1e-6)[0]
    assert d.decide(V(1, 3, 8), T + W) == (True, "window") and d.since is None


def test_a_full_roster_opens_for_a_capacity_bounded_cohort_of_one():
    assert door().decide(V(1, 8, 8), T) == (True, "cohort")  # cohort max(1, 0) = 1


def test_freed_slots_rederive_the_cohort():
    d = door()
    assert d.decide(V(2, 6, 8), T)[0]  # cohort min(4, 2) = 2
    assert not d.decide(V(2, 5, 8), T)[0] and d.since == T  # cohort min(4, 3) = 3


def test_the_cohort_follows_max_prompts():
    d = door(max_prompts=8)
    assert not d.decide(V(4, 8, 16), T)[0]
    assert d.decide(V(8, 8, 16), T)[0]


# ---- auto: the priced door -------------------------------------------------------------


def taught(decode_s=0.03, row_s=0.0002) -> StepCostModel:
    """A step-cost model that has measured GPU-like steps: 30 ms a decode step whatever its rows,
    0.2 ms a prompt row; through the calls the metered executor makes."""
    m = StepCostModel()
    for n in (1, 2, 4, 8):
        m.observe((0, n, n, 0.0), decode_s)
    for p in (50, 100, 150):
        m.observe((p, 8, 8, 0.0), decode_s + p * row_s)
    return m


def priced(chunk=None, decode_s=0.03, row_s=0.0002):
    """A priced door reading a model that has learned its step costs (`taught`)."""
    return PricedDoor(chunk, taught(decode_s, row_s))


def test_the_door_prices_a_decode_step_and_a_prompt_row_from_the_engines_step_cost_model():
    d = priced()
    decode, row = d.prices(V(1, 8, 16, (50, 1, 90), 1024))
    assert decode == pytest.approx(0.03, rel=1e-3) and row == pytest.approx(0.0002, rel=1e-2)


def test_auto_does_not_hold_before_the_model_has_measured_a_decode_step():
    m = StepCostModel()
    for p in (50, 100, 150):
        m.observe((p, 8, 8, 0.0), 0.03 + p * 0.0002)
    assert m.ready and not PricedDoor(None, m).ready
    assert PricedDoor(None, m).decide(V(1, 8, 16, (1, 50), 1024), T) == (True, "priced")


def test_auto_holds_to_spare_a_stream_about_to_end_a_stall_worth_more_than_the_wait():
    d = priced()
    # 1 token left: a 30 ms hold spares that stream 1024 rows x 0.2 ms = 205 ms of stall; the wait
    # costs 30 ms x 1 pending x 2 (half the slots busy).
    assert d.decide(V(1, 8, 16, (50, 1, 90), 1024), T) == (False, None) and d.since == T
    assert d.best_hold(V(1, 8, 16, (50, 1, 90), 1024), T)[1] == pytest.approx(0.03, rel=1e-3)


def test_auto_holds_no_longer_than_one_decode_step():
    d = priced()
    assert d.decide(V(1, 8, 16, (50, 60), 1024), T) == (True, "priced")  # 1.5 s of wait for 205 ms
    assert d.decide(V(1, 8, 16, (2, 50), 1024), T) == (True, "priced")  # 2 steps: past the cap


def test_auto_prices_the_wait_of_every_pending_request_and_the_slots_load():
    # 3 pending wait 3 x 30 ms, x2 for a half-busy roster = 180 ms, against 768 rows x 0.2 ms = 154 ms saved.
    assert priced().decide(V(3, 8, 16, (1, 50), 768), T) == (True, "priced")
    assert not priced().decide(V(1, 8, 16, (1, 50), 768), T)[0]
    # A nearly full roster (15 of 16): every later request waits too, x16 = 480 ms: no hold.
    assert priced().decide(V(1, 15, 16, (1, 50), 768), T) == (True, "priced")


def test_under_the_walk_a_stream_is_spared_only_the_rounds_it_would_live_through():
    # Chunk 64: a stream 1 token from its end would pay 1 round (64 rows = 13 ms), not 60 ms of wait.
    assert priced(chunk=64).decide(V(1, 8, 16, (1, 50), 1024), T) == (True, "priced")
    # Under the walk it takes several near-ended streams (and dearer rows) to pay for a hold.
    assert not priced(chunk=64, row_s=0.001).decide(V(1, 8, 16, (1, 1, 1, 50), 1024), T)[0]


def test_a_burst_raises_the_price_of_holding_and_a_lull_lowers_it():
    d = priced()
    for i in range(5):
        d.observe_arrival(T + 0.001 * i)  # 1 ms apart
    assert d.rate(T + 0.004) > 500
    assert d.rate(T + 10.0) == pytest.approx(1 / (10.0 - 0.004))  # the lull bounds the gap
    # Expected arrivals during the hold wait too: in a burst a 30 ms hold costs more than it saves.
    assert d.decide(V(1, 8, 16, (1, 90), 1024), T + 0.004) == (True, "priced")


def test_an_auto_hold_that_still_pays_ends_at_its_cap():
    d = priced()
    v = V(1, 8, 16, (1, 90), 1024)
    cap = d.prices(v)[0]  # one predicted decode step of this batch: ~30 ms
    assert cap == pytest.approx(0.03, rel=1e-3)
    assert not d.decide(v, T)[0]
    assert not d.decide(v, T + cap - 1e-6)[0]
    assert d.decide(v, T + cap + 1e-4) == (True, "window") and d.since is None


def test_auto_opens_for_an_idle_roster_and_an_empty_queue():
    d = priced()
    assert d.decide(V(1, 0, 16, (), 1024), T) == (True, "idle")
    assert d.decide(V(0, 8, 16, (2,), 0), T) == (True, None)


@pytest.mark.parametrize(
    "raw,ms",
    [
        (None, None),
        ("", None),
        ("0", None),
        ("off", None),
        ("OFF", None),
        ("auto", "auto"),
        ("AUTO", "auto"),
        ("300", 300),
        ("1", 1),
        ("2000", 2000),
        ("020", 20),
    ],
)
def test_the_door_grammar_parses(raw, ms):
    assert parse_admit_coalesce_ms(raw) == ms


@pytest.mark.parametrize(
    "raw",
    [
        "5000",
        "abc",
        "0x",
        "2001",
        "-1",
        "1.5",
        "on",
        "auto:300",
        "automatic",
        "١٠٠",
        " 100",
        "100 ",
        "+100",
        "1_000",
        " 20 ",
        " OFF ",
        " AUTO ",
        "0 ",
    ],
)
def test_the_door_grammar_refuses_naming_knob_value_and_grammar(raw):
    with pytest.raises(KnobError) as e:
        parse_admit_coalesce_ms(raw)
    msg = str(e.value)
    assert "TAILGATE_ADMIT_COALESCE_MS" in msg and repr(raw) in msg and "off | auto | N ms, 1 <= N <= 2000" in msg
