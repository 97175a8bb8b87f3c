"""The dashboard's server-sent-events feed: the engine's published snapshot (counts, KV, prefix
hits, its last model steps) plus inter-token gaps over the last minute (or the `?window=S` seconds a
connection asks for, up to KEEP_S), pushed a few times a second.

Nothing here runs on the engine thread but one `deque.append` per step: `ItlWindow.observe` is an
`Engine.observers` callback that hands the step's event list over as it is (a deque's append and
popleft are atomic, so no lock), and the event loop picks the gaps out of it when a feed next
ticks. The observer is attached by the first dashboard that connects, so a server nobody watches
pays nothing; every other figure is read from `Engine.snapshot`, which the engine thread replaces
whole after each step (no reader ever sees a half-updated one).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from dataclasses import asdict
from itertools import takewhile

from ..engine.request import Token

# 4 pushes a second: the timeline moves smoothly at ~40 ms steps; each push is one snapshot read
# and a few hundred bytes per new step.
PERIOD_S = 0.25
WINDOW_S = 60.0  # "ITL p50/p99 over the last minute": a connection's window unless it asks
# How far back a connection may ask (`?window=S`), and so how long gaps are kept: a client's figures
# are compared with the server's over the same run (`tailgate bench`, socket_tail_arm.sh), and a
# 3B model's W-std arm on 2 cores runs past the minute (AMD EPYC family 25, c4: ~75 s, whose server
# view had covered its last 60 s only). MAX_GAPS bounds what is kept either way.
KEEP_S = 900.0
# Step event lists held between two feed ticks (and before the first tick after attach): at the
# ~10 ms a decode step of a small model takes here, 4096 steps cover 40 s, many ticks' worth.
PENDING_STEPS = 4096
# Gaps kept: 8 streams at 100 tok/s for a minute is 48 000; past that the oldest go, so at such a
# load a window over ~2 minutes holds fewer than it asks (its `n` says how many). A tick sorts its
# window's gaps of each kind on the event loop that writes the streams: a window over the minute is
# for a run's one read (`tailgate bench`), not for a page left open on it.
MAX_GAPS = 100_000


class ItlWindow:
    """Inter-token gaps (engine clock, seconds) of the last KEEP_S, from each Token's own `gap`
    (the engine's measure of the gap that token ended; a stream's first token has none)."""

    def __init__(self):
        self.pending: deque = deque(maxlen=PENDING_STEPS)  # appended on the engine thread
        self.gaps: deque = deque(maxlen=MAX_GAPS)  # (at, gap), event loop only
        self.engine = None

    def attach(self, engine) -> None:
        if self.engine is not engine:
            self.engine = engine
            engine.observers.append(self.pending.append)

    def _drain(self) -> None:
        while self.pending:
            for ev in self.pending.popleft():
                if type(ev) is Token and ev.gap is not None:
                    self.gaps.append((ev.at, ev.gap))

    def _trim(self, now: float) -> None:
        self._drain()
        drop_before(self.gaps, now - KEEP_S)

    def stats(self, now: float, window_s: float = WINDOW_S) -> dict:
        """p50 / p99 / count of the gaps that ended within `window_s` of `now` (engine clock)."""
        self._trim(now)
        return gap_stats(within(self.gaps, now, window_s), window_s)

    def after(self, now: float, at: float | None) -> list[list[float]]:
        """The kept gaps that ended after `at` (all of them for None), as [at, gap] pairs, oldest
        first: what a fleet's front takes each tick to keep its own window (fleet/dashboard.py).
        Read from the newest back, so a tick costs the gaps since the last one."""
        self._trim(now)
        return [[a, g] for a, g in newest(self.gaps, lambda a: at is None or a > at)]


def drop_before(samples: deque, start: float) -> None:
    """Drop the (at, value) samples, oldest first, whose `at` is before `start`."""
    while samples and samples[0][0] < start:
        samples.popleft()


def newest(samples, keep) -> list:
    """The (at, value) samples, oldest first, from the newest back while `keep(at)` holds: a short
    window or a cursor costs its own samples, not every one kept."""
    return list(takewhile(lambda e: keep(e[0]), reversed(samples)))[::-1]


def within(samples, now: float, window_s: float) -> list[float]:
    """The values of the samples whose `at` is within `window_s` of `now`, oldest first."""
    return [v for _, v in newest(samples, lambda a: a >= now - window_s)]


def gap_stats(gaps, window_s: float = WINDOW_S) -> dict:
    """p50 / p99 (nearest rank) and count of some inter-token gaps (seconds) of a window."""
    values = sorted(gaps)
    n = len(values)
    pick = lambda q: values[min(n - 1, int(q * n))] if n else None  # noqa: E731
    return {"n": n, "p50_s": pick(0.50), "p99_s": pick(0.99), "window_s": window_s}


def hello(state) -> dict:
    """The feed's first message: what does not change while the server runs."""
    cfg = asdict(state.cfg) if state.cfg is not None else {}
    return {"model": state.served_name, "knobs": cfg, "kernels": state.kernels or {}}


def tick(state, window: ItlWindow, since: int, window_s: float = WINDOW_S) -> dict:
    """One push: the snapshot's counts, the steps with `seq` above `since`, the gaps of the last
    `window_s`."""
    t = counts(state, since)
    t["itl"] = window.stats(t["now"], window_s)
    # Beside the engine's gaps, the same streams timed where their bytes leave: the gaps between
    # one stream's socket writes (what its client can see) and each token's sampled -> written.
    t["socket_itl"] = recent(state.socket_window, t["now"], window_s)
    t["delivery"] = recent(state.delivery_window, t["now"], window_s)
    return t


def recent(samples, now: float, window_s: float = WINDOW_S) -> dict:
    """gap_stats of the (at, seconds) samples within `window_s` of `now` (those past KEEP_S are
    dropped)."""
    drop_before(samples, now - KEEP_S)
    return gap_stats(within(samples, now, window_s), window_s)


def counts(state, since: int) -> dict:
    """The snapshot's counts and the steps with `seq` above `since`."""
    snap = state.engine.snapshot
    m = snap.metrics
    steps = [s.as_dict() for s in snap.steps if s.seq > since]
    return {
        "now": state.engine.clock(),
        "running": snap.running,
        "waiting": snap.waiting,
        "held": snap.held,
        "kv_usage": snap.kv_usage,
        "kv_pages_used": snap.kv_pages_used,
        "prefix_hits": m.prefix_hits,
        "prefix_queries": m.prefix_queries,
        "preemptions": m.preemptions,
        "steps_total": m.steps,
        "generation_tokens": m.generation_tokens,
        "steps": steps,
    }


def report(state, window: ItlWindow, since: int, after: float | None) -> dict:
    """What a fleet replica answers its front each tick (fleet/dashboard.py merges them): the
    counts and steps, plus the window's gaps that ended after `after`, from which the front works
    out the fleet's own percentiles (so no percentiles here); `error` when the engine has failed."""
    t = counts(state, since)
    t["gaps"] = window.after(t["now"], after)
    t["error"] = None if state.engine.error is None else f"engine failed: {state.engine.error!r}"
    return t


async def events(state, window: ItlWindow, since: int, window_s: float = WINDOW_S):
    """The SSE stream: `event: hello`, then `event: tick` every PERIOD_S until the client leaves
    (Starlette cancels this generator when the connection drops); each tick's percentiles are of
    the last `window_s`."""
    sse = lambda kind, obj: f"event: {kind}\ndata: {json.dumps(obj)}\n\n"  # noqa: E731
    window.attach(state.engine)
    yield sse("hello", hello(state))
    while True:
        if state.engine.error is not None:
            yield sse("error", {"message": f"engine failed: {state.engine.error!r}"})
            return
        t = tick(state, window, since, window_s)
        if t["steps"]:
            since = t["steps"][-1]["seq"]
        yield sse("tick", t)
        await asyncio.sleep(PERIOD_S)
