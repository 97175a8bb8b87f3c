"""A live engine on the real model, with a step collector (shared by the engine-level gates)."""

from __future__ import annotations

import contextlib
import threading
import time

from tailgate.assemble import build_engine
from tailgate.config import resolve
from tailgate.engine.request import Finished, Rejected, Request, Scheduled, Token
from tailgate.model.runtime import runner as _runner


def ids(n: int, salt: int = 0) -> list[int]:
    """Deterministic prompts of exact length (ids well inside every vocabulary)."""
    return [2] + [1000 + (i * 37 + salt) % 20000 for i in range(n - 1)]


_PREPARED: dict = {}  # (id(raw weights), plan) -> (raw weights, prepared weights)
_real_prepare = _runner.prepare_weights


def _shared_prepare(raw, spec, plan):
    hit = _PREPARED.get((id(raw), plan))
    if hit is None or hit[0] is not raw:
        hit = _PREPARED[(id(raw), plan)] = (raw, _real_prepare(raw, spec, plan))
    return hit[1]


@contextlib.contextmanager
def shared_weights():
    """Runners built inside share one `prepare_weights` result per (model, plan) for the session.
    A runner never writes its weights (KV and scratch are its own), and the lane already reads them
    from two threads at once; rebuilding them per engine (fusing, prepacking, q8 panels: 5-25 s a
    gemma3-270m engine on a busy 2-core host) was most of an engine gate's time. Its own pages,
    KV cache, scheduler and warm-up step stay per engine. The oracle (tests/test_oracle.py) gates
    these same shared weights against HF for the two plans the gates use, so a test that spoiled
    them would fail there; its other plans are built afresh, one at a time."""
    _runner.prepare_weights = _shared_prepare
    try:
        yield
    finally:
        _runner.prepare_weights = _real_prepare


class ManualClock:
    """A clock that moves only when the test moves it (`advance`); starts well away from 0 (a
    request's arrival of 0.0 would read as unset)."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class Harness:
    def __init__(self, loaded, dtype="auto", device="cpu", clock=time.monotonic, **knobs):
        """`clock`: the engine's and scheduler's (e.g. a ManualClock, so a door's window elapses
        when the test says rather than when the host has spent that long)."""
        knobs.setdefault("MAX_CONTEXT", "1024")
        cfg = resolve(lambda name: knobs.get(name))
        with shared_weights():
            self.engine, self.model, self.cfg = build_engine(
                "", cfg, dtype=dtype, device=device, loaded=loaded, clock=clock
            )
        self.sched = self.engine.scheduler
        self.lock = threading.Lock()
        self.steps: list[list] = []
        self.events: dict[str, list] = {}
        self.engine.observers.append(self._on_step)
        self.engine.start()

    def _on_step(self, events):
        with self.lock:
            if events:
                self.steps.append(events)

    def _sink(self, rid):
        def sink(ev):
            with self.lock:
                self.events.setdefault(rid, []).append(ev)

        return sink

    def submit(self, prompt, max_tokens=8, **kw) -> Request:
        r = Request(prompt=list(prompt), max_tokens=max_tokens, **kw)
        r.sink = self._sink(r.id)
        self.engine.submit(r)
        return r

    def of(self, r, kind):
        with self.lock:
            return [e for e in self.events.get(r.id, []) if isinstance(e, kind)]

    def tokens(self, r) -> list[int]:
        return [e.token for e in self.of(r, Token)]

    def done(self, r) -> bool:
        return bool(self.of(r, Finished) or self.of(r, Rejected))

    def scheduled_step(self, r) -> int | None:
        with self.lock:
            for i, evs in enumerate(self.steps):
                if any(isinstance(e, Scheduled) and e.request_id == r.id for e in evs):
                    return i
        return None

    def wait(self, pred, timeout=60.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return True
            if self.engine.error:
                raise self.engine.error
            time.sleep(0.002)
        return pred()

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self):
        """Stop, then check every KV page went back to its pool."""
        self.wait(lambda: not self.sched.has_work(), 120)
        self.engine.stop()
        if self.sched.prefix is not None:  # cached prefixes hold pages by design; let them go first
            self.sched.prefix.clear()
        book = self.sched.book
        assert book.glob.used == 0 and (book.local is None or book.local.used == 0), "KV pages leaked"
