"""The admission coalesce door, decided with a fake clock."""
from __future__ import annotations

import pytest

from tailgate.config import KnobError, parse_admit_coalesce_ms
from tailgate.engine.door import CoalesceDoor

T = 1000.0
W = 0.25  # exact in binary, so T + W - T == W


def door(max_prompts=4):
    return CoalesceDoor(W, max_prompts)


def test_an_idle_roster_opens_and_clears_the_timer():
    d = door()
    d.since = T - 5
    assert d.decide(1, 0, 8, T) == (True, "idle") and d.since is None


def test_an_empty_queue_opens():
    d = door()
    assert d.opens(0, 4, 8, T) and d.since is None


def test_a_shallow_batch_opens():
    d = door()
    assert d.decide(1, 1, 8, T) == (True, "shallow") and d.since is None  # (1+1)*2 = 4 < 8


def test_a_deep_under_cohort_batch_closes_and_pins_the_timer():
    d = door()
    assert not d.opens(1, 3, 8, T) and d.since == T
    assert not d.opens(1, 3, 8, T + 0.001) and d.since == T


def test_a_full_cohort_opens_and_clears():
    d = door()
    assert not d.opens(1, 4, 8, T)
    assert d.decide(4, 4, 8, T + 0.01) == (True, "cohort") and d.since is None  # cohort min(4, 4)


def test_an_elapsed_window_opens_no_earlier_than_the_window():
    d = door()
    assert not d.opens(1, 3, 8, T)
    assert not d.opens(1, 3, 8, T + W - 1e-6)
    assert d.decide(1, 3, 8, T + W) == (True, "window") and d.since is None


def test_a_full_roster_opens_for_a_capacity_bounded_cohort_of_one():
    assert door().decide(1, 8, 8, T) == (True, "cohort")  # cohort max(1, 0) = 1


def test_freed_slots_rederive_the_cohort():
    d = door()
    assert d.opens(2, 6, 8, T)  # cohort min(4, 2) = 2
    assert not d.opens(2, 5, 8, T) and d.since == T  # cohort min(4, 3) = 3


def test_the_cohort_follows_max_prompts():
    d = door(max_prompts=8)
    assert not d.opens(4, 8, 16, T)
    assert d.opens(8, 8, 16, T)


@pytest.mark.parametrize("raw,ms", [(None, None), ("", None), ("0", None), ("off", None), (" OFF ", None),
                                    ("300", 300), ("1", 1), ("2000", 2000), (" 20 ", 20)])
def test_the_door_grammar_parses(raw, ms):
    assert parse_admit_coalesce_ms(raw) == ms


@pytest.mark.parametrize("raw", ["5000", "abc", "0x", "2001", "-1", "1.5", "on"])
def test_the_door_grammar_refuses_naming_knob_value_and_grammar(raw):
    with pytest.raises(KnobError) as e:
        parse_admit_coalesce_ms(raw)
    msg = str(e.value)
    assert "TAILGATE_ADMIT_COALESCE_MS" in msg and repr(raw) in msg and "off | N ms, 1 <= N <= 2000" in msg
