"""The simulated clients: when each request leaves, and what its stream records. Shared by the
single-engine loop (`sim/run.py`) and the fleet's (`sim/fleet.py`).

A request leaves at its offset (`bench serve`'s gamma arrivals, or given ones), or, with at most
`concurrency` in flight (a closed loop), when a client came free: a finish sends that client's
next request at once.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from ..bench.workload import Result, gamma_offsets
from ..engine.request import Finished, Rejected, Scheduled, Token


@dataclass(frozen=True)
class Load:
    """How a simulation's clients send its jobs (the keywords `simulate` and `simulate_fleet`
    take): at `offsets` when given (sorted), else `bench serve`'s gamma arrivals at `rate` with
    `burstiness`; at most `concurrency` in flight (a closed loop); `seed` draws the arrivals and,
    with `jitter` (relative std dev), each step's cost noise."""

    rate: float = float("inf")
    burstiness: float = 1.0
    concurrency: int | None = None
    seed: int = 0
    offsets: list[float] | None = None
    jitter: float = 0.0

    def clients(self, n: int) -> "Clients":
        offsets = self.offsets if self.offsets is not None else gamma_offsets(n, self.rate, self.burstiness, self.seed)
        return Clients(offsets, self.concurrency)


class Clients:
    def __init__(self, offsets: list[float], concurrency: int | None):
        self.offsets = offsets
        self.due: list[tuple[float, int]] = []  # (arrival time, job index) of released requests
        self.free = [0.0] * (concurrency or len(offsets))  # when each client slot came free (a heap)
        self.nxt = 0  # the next job to release
        self.release()

    def release(self) -> None:
        """Every job a free client can send: it arrives at its offset, or when its client came free."""
        while self.nxt < len(self.offsets) and self.free:
            heapq.heappush(self.due, (max(self.offsets[self.nxt], heapq.heappop(self.free)), self.nxt))
            self.nxt += 1

    def next_due(self, by: float) -> tuple[float, int] | None:
        """The earliest released request arriving no later than `by` (taken), else None."""
        if self.due and self.due[0][0] <= by:
            return heapq.heappop(self.due)
        return None

    def sink(self, res: Result, on_scheduled):
        """The event sink of one request: its tokens' times into `res`, `on_scheduled(ev)` at its
        Scheduled, and at its end its verdict, then its client's next request."""
        times = res.chunk_times

        def sink(ev):
            if type(ev) is Token:  # the common case first (once per simulated token)
                times.append(ev.at)
                res.output_tokens += 1
            elif isinstance(ev, Scheduled):
                on_scheduled(ev)
            elif isinstance(ev, (Finished, Rejected)):
                res.success = isinstance(ev, Finished) and ev.reason in ("length", "stop")  # stop: a --chat EOS
                res.finish_reasons.append(ev.reason)
                heapq.heappush(self.free, ev.at)  # a closed-loop client sends its next request at once
                self.release()

        return sink
