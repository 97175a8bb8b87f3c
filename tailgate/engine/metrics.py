"""Engine metrics as plain numbers; the server renders them for Prometheus."""

from __future__ import annotations

import bisect
import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .scheduler import Scheduler

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
# token sampled -> written to its socket: normally well under a millisecond, a step (~40 ms) when
# the write waited for the next step (docs/engine.md "Delivery")
DELIVERY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.12, 0.16, 0.25, 0.5, 1.0, 5.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
# |predicted - actual| / actual of a step's time (ITL_TARGET_MS's fit; issue 26 asks p90 <= 0.15)
ERROR_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)


@dataclass
class Histogram:
    buckets: tuple = LATENCY_BUCKETS
    counts: list = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self):
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += 1
        self.total += v
        self.n += 1

    def observe_all(self, values: list[float]) -> None:
        """`observe` each, in order (the same total to the bit); a run of equal values (a step's
        inter-token gaps mostly are) looks its bucket up once."""
        counts, buckets, total = self.counts, self.buckets, self.total
        last, i = None, 0
        for v in values:
            if v != last:
                i, last = bisect.bisect_left(buckets, v), v
            counts[i] += 1
            total += v
        self.total = total
        self.n += len(values)


@dataclass
class EngineMetrics:
    door_releases: Counter = field(default_factory=Counter)  # reason -> count
    door_hold: Histogram = field(default_factory=Histogram)
    prefill_rows: Histogram = field(default_factory=lambda: Histogram(ROW_BUCKETS))
    decode_rows: Histogram = field(default_factory=lambda: Histogram(ROW_BUCKETS))
    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: Counter = field(default_factory=Counter)  # reason -> count
    preemptions: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries)
    prefix_hits: int = 0  # of which served from it
    lane_prefills: int = 0  # prompts prefilled on the side lane
    # Inter-token gaps by the kind of step that ended them: why the tail is what it is.
    itl_by_cause: dict = field(default_factory=dict)  # cause -> Histogram
    # ITL_TARGET_MS (engine/step_cost.py): the prompt rows each walk round took, how far each
    # step's predicted time was from its measured one, and the fit itself (target_s, the last
    # step's predicted_s / actual_s, one coefficient per cost term). Empty without a target.
    step_prompt_rows: Histogram = field(default_factory=lambda: Histogram(ROW_BUCKETS))
    step_cost_error: Histogram = field(default_factory=lambda: Histogram(ERROR_BUCKETS))
    step_cost: dict = field(default_factory=dict)
    rounds_widened: int = 0  # walk rounds TTFT_TARGET_MS widened past the inter-token price
    rounds_kept_up: int = 0  # priced walk rounds held at the rows that keep every request in decoding

    def gaps(self, cause: str) -> Histogram:
        """The gap histogram of steps of this kind (made at its first gap)."""
        h = self.itl_by_cause.get(cause)  # not setdefault: that builds a Histogram per call
        if h is None:
            h = self.itl_by_cause[cause] = Histogram()
        return h


@dataclass(frozen=True)
class EngineSnapshot:
    """What /metrics shows, copied by the engine thread after each step: the server reads one
    object instead of iterating the scheduler's live queues and counters from another thread."""

    running: int = 0
    waiting: int = 0
    held: int = 0
    kv_usage: float = 0.0
    kv_pages_used: int = 0
    kv_pages_idle: int = 0  # unheld pages the prefix cache keeps (both pools; evicted only on demand)
    recompute_hits: int = 0  # tokens a recompute after preemption found in the prefix cache
    metrics: EngineMetrics = field(default_factory=EngineMetrics)
    steps: tuple = ()  # the last model steps (engine/plan.py StepRecord), oldest first


def snapshot(scheduler: Scheduler, inbox: int = 0) -> EngineSnapshot:
    book = scheduler.book
    return EngineSnapshot(
        running=scheduler.running,
        waiting=inbox + len(scheduler.queue),
        held=scheduler.held,
        kv_usage=round(book.usage(), 6),
        kv_pages_used=book.glob.used + (book.local.used if book.local else 0),
        kv_pages_idle=book.glob.idle + (book.local.idle if book.local else 0),
        recompute_hits=scheduler.prefix.recompute_hits if scheduler.prefix is not None else 0,
        metrics=copy.deepcopy(scheduler.metrics),
        steps=tuple(scheduler.step_log),
    )
