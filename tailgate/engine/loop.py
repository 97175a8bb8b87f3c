"""The engine loop: one thread owns the scheduler (and through it the model).

Submissions and aborts arrive from other threads through a locked inbox; an idle engine sleeps
on a condition variable until a submission arrives (no spinning). Between steps it waits, bounded,
on the `DeliveryFence` for the streams to write the last step's tokens to their sockets
(docs/engine.md "Delivery": the step's threads take both cores, so bytes not written before the
next step launches leave after it, and a client sees two steps' gap).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable

from .metrics import EngineSnapshot, snapshot
from .request import Event, Request
from .scheduler import Scheduler


class DeliveryFence:
    """Tokens handed to a stream and not yet written to its socket. The engine thread `add`s as it
    delivers a step's events; the event loop's writer calls `done` once the bytes are written (or
    the stream is gone); `wait` blocks the engine, up to a bound, until none is left."""

    def __init__(self):
        self._cv = threading.Condition()
        self._n = 0

    @property
    def pending(self) -> int:
        return self._n

    def add(self, n: int = 1) -> None:
        with self._cv:
            self._n += n

    def done(self, n: int = 1) -> None:
        if n <= 0:
            return
        with self._cv:
            self._n = max(0, self._n - n)
            if not self._n:
                self._cv.notify_all()

    def wait(self, timeout: float) -> bool:
        """True once nothing is pending; False when `timeout` seconds passed first."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._n, timeout)


class Engine:
    def __init__(self, scheduler: Scheduler, clock=time.monotonic):
        self.scheduler = scheduler
        self.clock = clock
        self.probe: dict | None = None  # the start-up probe's measurements (model/kernels/probe.py), for /version
        self.kv: dict | None = None  # what the KV pools hold and why (assemble.kv_report), for /version
        self._cv = threading.Condition()
        self._inbox: list[Request] = []
        self._calls: list[tuple[Callable, Future]] = []  # `call`: work for the engine thread between steps
        self._running = False
        self._thread: threading.Thread | None = None
        self.observers: list[Callable[[list[Event]], None]] = []  # called with each step's events
        self.error: BaseException | None = None
        self.on_death: list[Callable[[BaseException], None]] = []  # e.g. the server exits non-zero
        # The server's streams register each token they must write here; before the next step the
        # engine waits up to `delivery_wait_s` for them (0: never waits). Set by the server.
        self.fence = DeliveryFence()
        self.delivery_wait_s = 0.0
        self.fence_timeouts = 0  # steps launched with tokens still unwritten (the wait ran out)
        # Replaced (never mutated) by the engine thread after every step: readers on other
        # threads see one consistent step boundary (a copy costs ~0.1 ms against 40+ ms steps).
        self.snapshot: EngineSnapshot = snapshot(scheduler)

    def start(self) -> "Engine":
        # Every step runs on this one thread, and nothing that outlives start-up may run OpenMP work
        # (our kernels, torch's parallel ops) on another: libgomp keeps a worker pool per thread that
        # ever opened a parallel region, and once its pools hold more threads than the CPU has, every
        # pool's workers stop spinning between regions (GOMP's throttled spin) and sleep instead.
        # Measured (Llama 3.2 3B's shape, one decode row, AMD EPYC Zen 5, 2 cores, one process): steps
        # from a second thread while the main thread's pool lived 55-56 ms against 46-47 from the
        # main thread; OMP_WAIT_POLICY=passive 55 on either. The server loads on a thread that exits
        # before the first request (its pool goes with it): then this thread's steps match the main
        # thread's (Llama 3.2 1B's shape: 18.8-20.5 ms against 19.1-20.3). docs/runtime.md, "The step".
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="tailgate-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._running = False
            self._cv.notify_all()
        if self._thread:
            self._thread.join(timeout)
        close = getattr(self.scheduler.executor, "close", None)  # e.g. the side lane's worker
        if close is not None and not (self._thread and self._thread.is_alive()):
            close()

    def submit(self, req: Request) -> None:
        """Queue a request; once the engine has died, fail it at once instead of letting it hang."""
        with self._cv:  # stamped under the lock: the inbox's order is the arrivals' order
            req.arrival = req.arrival or self.clock()
            if self.error is None:
                self._inbox.append(req)
                self._cv.notify()
                return
            self.scheduler.submit(req)  # the engine thread is gone: nothing else touches the scheduler
            self.scheduler.fail_all(f"engine failed: {self.error!r}")

    def abort(self, req: Request) -> None:
        """Mark a request cancelled; the engine retires it (and frees its pages) on its next turn."""
        req.cancelled = True
        with self._cv:
            self.scheduler.cancels_queued = True  # a hint: the next turn looks through the queue too
            self._cv.notify()

    def call(self, fn: Callable[[], object]) -> Future:
        """Run `fn()` on the engine thread between two steps (it owns the runner and the page book:
        e.g. an embedding's forward pass, server/embeddings.py); its result or exception lands in
        the returned future."""
        fut: Future = Future()
        with self._cv:
            if self.error is not None:
                fut.set_exception(RuntimeError(f"engine failed: {self.error!r}"))
            else:
                self._calls.append((fn, fut))
                self._cv.notify()
        return fut

    @property
    def waiting(self) -> int:
        with self._cv:
            return len(self._inbox) + len(self.scheduler.queue)

    def _loop(self) -> None:
        sched = self.scheduler
        try:
            while True:
                with self._cv:
                    while self._running and not self._inbox and not self._calls and not sched.has_work():
                        self._cv.wait()
                    if not self._running:
                        return
                    inbox, self._inbox = self._inbox, []
                    calls, self._calls = self._calls, []
                for fn, fut in calls:
                    if fut.set_running_or_notify_cancel():
                        try:
                            fut.set_result(fn())
                        except Exception as e:  # the caller's to report, not the engine's
                            fut.set_exception(e)
                if calls and not inbox and not sched.has_work():
                    continue
                for req in inbox:
                    sched.submit(req)
                events = sched.step(self.clock())
                with self._cv:
                    inbox_now = len(self._inbox)
                self.snapshot = snapshot(sched, inbox_now)
                for obs in self.observers:
                    obs(events)
                if self.delivery_wait_s and self.fence.pending and not self.fence.wait(self.delivery_wait_s):
                    self.fence_timeouts += 1
        except BaseException as e:  # fatal: fail every open request so no client hangs
            with self._cv:
                self.error = e
                late, self._inbox = self._inbox, []
                calls, self._calls = self._calls, []
            for _, fut in calls:
                if fut.set_running_or_notify_cancel():
                    fut.set_exception(RuntimeError(f"engine failed: {e!r}"))
            for req in late:
                sched.submit(req)
            sched.fail_all(f"engine failed: {e!r}")
            for cb in self.on_death:
                cb(e)
            raise
