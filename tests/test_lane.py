"""The side lane (ASYNC_PREFILL=cpu:N) on the real Gemma 3 270M: one prefill beside the live batch."""

from __future__ import annotations

import threading

import pytest

from tailgate.config import KnobError, resolve
from tailgate.engine.request import Finished, Rejected, Scheduled, Token
from tailgate.model.runtime import serial
from harness import Harness, ids


@pytest.fixture(scope="module")
def gemma(loaded):
    return loaded("gemma3-270m")


def lane_harness(gemma, **knobs) -> Harness:
    return Harness(gemma, dtype="fp32", DECODE_SLOTS="4", ASYNC_PREFILL="cpu:1", **knobs)


def gate_the_lane(h: Harness, fail: bool = False) -> threading.Event:
    """Hold every lane prefill until the returned event is set (then run it, or raise): the
    tests decide when the lane finishes instead of racing it."""
    lane = h.sched.executor.lane
    step, opened = lane._step, threading.Event()

    def gated(segments):
        assert opened.wait(120), "the test never opened the lane"
        if fail:
            raise RuntimeError("injected lane failure")
        return step(segments)

    lane._step = gated
    return opened


def a_live_stream_and_a_held_flight(h: Harness, salt: int, fail: bool = False, live_tokens: int = 200):
    """A live stream, then an arrival that goes to the (held) lane: (lane opener, live, flying)."""
    opened = gate_the_lane(h, fail)
    live = h.submit(ids(20, salt), max_tokens=live_tokens)
    assert h.wait(lambda: len(h.tokens(live)) >= 1)
    flying = h.submit(ids(100, salt + 1), max_tokens=4)
    assert h.wait(lambda: h.sched.flight is not None and h.scheduled_step(flying) is not None)
    return opened, live, flying


def tokens_of(h, r, since_step: int) -> int:
    return sum(1 for evs in h.steps[since_step:] for e in evs if isinstance(e, Token) and e.request_id == r.id)


def test_a_lane_prefill_is_token_exact_vs_the_synchronous_path(gemma, rig):
    r = rig("gemma3-270m", "fp32")
    live_prompt, long_prompt = ids(20, 11), ids(600, 12)  # 600 rows cross the 512-token sliding window
    want = [serial.generate(r.runner, r.book, p, 8) for p in (live_prompt, long_prompt)]
    with lane_harness(gemma) as h:
        live = h.submit(live_prompt, max_tokens=60)
        assert h.wait(lambda: len(h.tokens(live)) >= 1)
        newcomer = h.submit(long_prompt, max_tokens=8)
        assert h.wait(lambda: h.done(newcomer))
        assert h.tokens(newcomer) == want[1] and h.tokens(live)[:8] == want[0]
        assert h.of(newcomer, Token)[0].cause == "lane"
        assert h.sched.metrics.lane_prefills == 1
        engine_cancel_and_wait(h, live)  # its other 52 tokens prove nothing here


def test_an_arrival_into_an_idle_engine_takes_the_synchronous_path(gemma):
    with lane_harness(gemma) as h:
        first = h.submit(ids(30, 13), max_tokens=3)
        assert h.wait(lambda: h.done(first))
        assert h.of(first, Token)[0].cause == "prefill" and h.sched.metrics.lane_prefills == 0


def test_intake_stops_while_the_lane_runs_and_decode_keeps_stepping(gemma):
    with lane_harness(gemma) as h:
        opened, live, flying = a_live_stream_and_a_held_flight(h, 14)
        after = h.submit(ids(30, 16), max_tokens=4)
        start = h.scheduled_step(flying)
        assert h.wait(lambda: tokens_of(h, live, start) >= 3)  # decode keeps stepping...
        assert not h.of(after, Scheduled) and h.sched.flight is not None  # ...while intake waits
        opened.set()
        assert h.wait(lambda: h.done(flying) and h.done(after))
        assert h.scheduled_step(after) > h.scheduled_step(flying)
        engine_cancel_and_wait(h, live)


def engine_cancel_and_wait(h, r):
    h.engine.abort(r)
    assert h.wait(lambda: h.done(r))


def test_a_cancel_in_flight_exits_cleanly_through_the_join(gemma):
    with lane_harness(gemma) as h:
        opened, live, flying = a_live_stream_and_a_held_flight(h, 17)
        h.engine.abort(flying)
        start = len(h.steps)
        assert h.wait(lambda: tokens_of(h, live, start) >= 2)
        assert not h.done(flying)  # its pages are still under the lane's writes
        opened.set()
        assert h.wait(lambda: h.done(flying))
        assert h.of(flying, Finished)[0].reason == "abort" and not h.of(flying, Token)
        engine_cancel_and_wait(h, live)
    # Harness.close asserted that every page went back


def test_a_failed_lane_prefill_fails_only_its_request(gemma):
    with lane_harness(gemma) as h:
        opened, live, doomed = a_live_stream_and_a_held_flight(h, 19, fail=True, live_tokens=30)
        opened.set()
        assert h.wait(lambda: h.done(doomed) and h.done(live))
        assert (
            h.of(doomed, Finished)[0].reason == "error" and "injected lane failure" in h.of(doomed, Finished)[0].message
        )
        assert h.of(live, Finished)[0].reason == "length" and len(h.tokens(live)) == 30


def test_an_out_of_vocabulary_id_fails_only_that_request_and_the_lane_keeps_serving(gemma):
    with lane_harness(gemma) as h:
        live = h.submit(ids(20, 21), max_tokens=60)
        assert h.wait(lambda: len(h.tokens(live)) >= 1)
        bad = h.submit([2, gemma.spec.vocab_size + 5, 7], max_tokens=4)
        good = h.submit(ids(40, 22), max_tokens=4)
        assert h.wait(lambda: h.done(bad) and h.done(good))
        assert "outside the vocabulary" in h.of(bad, Rejected)[0].reason
        assert len(h.tokens(good)) == 4 and h.sched.metrics.lane_prefills == 1
        engine_cancel_and_wait(h, live)


@pytest.mark.parametrize(
    "value",
    ["1", "true", "on", "green", "green:0", "green:100", "green:x", "cpu", "cpu:0", "cpu:2", "cpu:-1", "shared:1"],
)
def test_every_lane_value_outside_the_grammar_refuses(value):
    with pytest.raises(KnobError, match=f"TAILGATE_ASYNC_PREFILL={value!r}.*accepted:"):
        resolve(lambda n: value if n == "ASYNC_PREFILL" else None, cores=2)


@pytest.mark.parametrize("lane", ["shared", "green:50", "cpu:1"])
@pytest.mark.parametrize("door", ["300", "auto"])
def test_the_door_and_any_lane_refuse_together_naming_the_door(lane, door):
    knobs = {"ASYNC_PREFILL": lane, "ADMIT_COALESCE_MS": door}
    with pytest.raises(KnobError, match="TAILGATE_ADMIT_COALESCE_MS.*the door could only delay it"):
        resolve(knobs.get, cores=2)


def test_the_cuda_lanes_refuse_on_a_build_without_them_and_cpu_lanes_leave_a_core():
    for v in ("shared", "green:50"):
        with pytest.raises(KnobError, match="CUDA stream"):
            resolve(lambda n: v if n == "ASYNC_PREFILL" else None, cores=2)
    assert resolve(lambda n: "CPU:3" if n == "ASYNC_PREFILL" else None, cores=4).async_prefill == "cpu:3"
    for off in ("off", "0", "false", "", None):
        assert resolve(lambda n: off if n == "ASYNC_PREFILL" else None, cores=2).async_prefill is None
    with pytest.raises(KnobError, match="needs at least 2 cores"):
        resolve(lambda n: "cpu:1" if n == "ASYNC_PREFILL" else None, cores=1)
