"""The CPU side lane (`ASYNC_PREFILL=cpu:N`): one prefill at a time on a worker thread that owns N
threads, while the engine thread keeps stepping the live batch on the cores that are left.

Why it can work on a CPU at all: torch's OpenMP thread count is per calling thread (an
`omp_set_num_threads` ICV), and so are oneDNN's and our C kernels' parallel regions, so the two
threads get disjoint budgets without a process-wide switch. The engine thread gives up N threads
at launch and takes them back at the join. Both forwards may run at once: the runner holds no
per-step state outside the StepContext it builds, the newcomer writes only the KV pages it
reserved before launch, and ctypes and torch release the GIL for the heavy calls.

Only the forward pass runs on the lane; sampling stays on the engine thread at the join, so the
sampler's per-request state is never touched by two threads.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch


class LaneJob:
    """One prefill in flight: `done()` polls, `logits()` waits for the forward's output (or raises
    its error)."""

    def __init__(self, future: Future, on_join):
        self._future = future
        self._on_join = on_join
        self._joined = False

    def done(self) -> bool:
        return self._future.done()

    def logits(self) -> torch.Tensor:
        try:
            return self._future.result()
        finally:
            if not self._joined:
                self._joined = True
                self._on_join()


class CpuLane:
    def __init__(self, threads: int, step):
        """`step(segments) -> logits` is the runner's forward; the worker runs it with `threads`."""
        self.threads = threads
        self._step = step
        self._pool = ThreadPoolExecutor(
            1, thread_name_prefix="tailgate-lane", initializer=torch.set_num_threads, initargs=(threads,)
        )
        self._engine_threads: int | None = None
        self._busy = threading.Lock()  # one prefill in flight, by construction and by check
        self.launched = 0

    def launch(self, segments) -> LaneJob:
        """Called on the engine thread. Raises RuntimeError when a prefill is already in flight."""
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("the lane already has a prefill in flight")
        self._engine_threads = torch.get_num_threads()
        # The engine thread keeps what the lane does not take (at least one thread).
        torch.set_num_threads(max(1, self._engine_threads - self.threads))
        self.launched += 1
        try:
            fut = self._pool.submit(self._run, segments)
        except BaseException:
            self._join()
            raise
        return LaneJob(fut, self._join)

    @torch.inference_mode()
    def _run(self, segments) -> torch.Tensor:
        return self._step(segments)

    def _join(self) -> None:
        """Back on the engine thread: it gets its whole budget again."""
        torch.set_num_threads(self._engine_threads)
        self._busy.release()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
