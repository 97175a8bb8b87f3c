"""The admission coalesce door (TAILGATE_ADMIT_COALESCE_MS): a fixed window, or `auto`, priced.

With a live decode batch, every admission is a mixed step (or a walk of them) that every live
stream's inter-token gap pays. The fixed door holds arrivals up to `window` so one window's
arrivals are admitted in one intake turn (one interruption instead of one per arrival). It prices
the number of interruptions, not their size: gather rules still decide how many prompts share one step.

`auto` (`PricedDoor`) holds only while holding pays, in one currency, seconds:
- What an admission costs the live streams: the pending prompts' rows times the learned price of
  a prompt row, paid by every live stream that is still running when the rows run. The prices
  come from the engine's one step-cost model (`engine/step_cost.py` `StepCostModel`, fitted from
  every measured step; the walk's `ITL_TARGET_MS` budgets with the same fit).
  Under the walk a stream pays only the rounds it is alive for: min(rows, remaining * chunk).
- What holding buys: a stream that finishes before the admission never pays it. The roster's
  remaining tokens times the learned decode step time say when each would finish.
- What holding costs: every pending request waits (TTFT), and so does each arrival during the hold
  (half the hold on average, at the recent arrival rate); while the slots are busy a hold pushes
  back every request behind it too, so the wait is weighted by 1 / (1 - slot occupancy).
Holding for as long as it takes the j streams nearest their end to finish is worth it when their
saved stall exceeds the wait it adds; the door holds while some j is worth it, re-priced every turn,
for at most one decode step per cohort (`AUTO_CAP_STEPS`: longer holds synchronised closed loops).
Why no credit for merging arrivals: with step time linear in rows (floor + rows; `cost_form.py`,
measured on both CPUs), two admissions or one merged admission cost the live streams the same
total stall (the separate case's extra step also yields a token), so merging only reshapes the
gap distribution; the price counts what is actually saved: stalls streams never see.
Until the model is ready and has measured a decode step, `auto` does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass

AUTO_CAP_S = 2.0  # the longest an `auto` hold can run: the fixed grammar's ceiling (2000 ms)
# ...and in decode steps: one. In the simulator (gemma4-12b-sm89, walk off, closed loops of equal
# requests, 5 seeds) holds of up to 2 s paid for themselves on paper but synchronised completions
# into cohorts that are then admitted together: TTFT p50 x2.2 / x4.1 / x2.0 of door off at
# c4 / c8 / c16, against x1.5 / x2.0 / x1.0 with a one-step cap, which also keeps every open-loop
# cell's TTFT p50 and throughput within 1 % of off (docs/benchmarks/door-auto.md).
AUTO_CAP_STEPS = 1


@dataclass(frozen=True)
class DoorView:
    """What the door sees at an intake turn (plain numbers from the scheduler)."""

    pending: int  # requests in the queue
    active: int  # requests holding a slot
    slots: int
    remaining: tuple[int, ...] = ()  # live streams' tokens left (max_tokens bound; EOS only ends them sooner)
    pending_rows: int = 0  # prompt rows of the prompts the next intake would admit
    live_kpairs: float = 0.0  # the live rows' query-key pairs of one decode step / 1000 (their contexts)


def _open_regardless(door, v: DoorView) -> tuple[bool, str | None] | None:
    """Every door opens (and forgets its timer) on an empty queue (nothing to release: reason None)
    and on an empty roster (nothing to protect: "idle"); None otherwise."""
    if v.pending and v.active:
        return None
    door.since = None
    return True, "idle" if v.pending else None


class CoalesceDoor:
    def __init__(self, window_s: float, max_prompts: int):
        self.window = window_s
        self.max_prompts = max_prompts
        self.since: float | None = None  # pinned at the first held turn of the current cohort

    def decide(self, v: DoorView, now: float) -> tuple[bool, str | None]:
        """(open, release reason). Reasons: idle, shallow, cohort, window; None when there is
        nothing to release (empty queue) or the door stays closed."""
        if (early := _open_regardless(self, v)) is not None:
            return early
        if (v.active + v.pending) * 2 < v.slots:  # shallow batch: nothing worth protecting
            self.since = None
            return True, "shallow"
        # The cohort is a capacity bound over the slots free now, floored at one.
        cohort = max(1, min(self.max_prompts, v.slots - v.active))
        if self.since is None:
            self.since = now
        if v.pending >= cohort:
            self.since = None
            return True, "cohort"
        if now - self.since >= self.window:
            self.since = None
            return True, "window"
        return False, None

    def observe_arrival(self, at: float) -> None:
        pass


class PricedDoor:
    """ADMIT_COALESCE_MS=auto: holds while the priced saving beats the priced wait (module doc)."""

    def __init__(
        self, chunk: int | None, costs, cap_s: float = AUTO_CAP_S, cap_steps: float = AUTO_CAP_STEPS, alpha: float = 0.2
    ):
        self.chunk = chunk
        self.cap, self.cap_steps = cap_s, cap_steps
        self.costs = costs  # engine/step_cost.StepCostModel, shared with the walk's budget
        self.since: float | None = None
        self.last_arrival: float | None = None
        self.gap_s: float | None = None  # EWMA of inter-arrival gaps
        self.alpha = alpha

    def observe_arrival(self, at: float) -> None:
        if self.last_arrival is not None and at >= self.last_arrival:
            g = at - self.last_arrival
            self.gap_s = g if self.gap_s is None else self.gap_s + self.alpha * (g - self.gap_s)
        self.last_arrival = at

    def rate(self, now: float) -> float:
        """Arrivals per second, recent: a burst reads high, and a lull longer than the usual gap
        pulls the estimate down at once (the gap since the last arrival is a lower bound)."""
        if self.gap_s is None or self.last_arrival is None:
            return 0.0
        return 1.0 / max(self.gap_s, now - self.last_arrival, 1e-6)

    @property
    def ready(self) -> bool:
        """The model can price both: it is ready and has measured a decode step."""
        return self.costs.ready and self.costs.seen[0] > 0

    def prices(self, v: DoorView) -> tuple[float, float]:
        """(the live batch's decode step, one prompt row's added stall) in seconds, predicted."""
        n = len(v.remaining)
        return (self.costs.predict((0, n, n, v.live_kpairs)), self.costs.coefficients["prompt_row"] * self.costs.pace)

    def _cap(self, d: float) -> float:
        return min(self.cap, self.cap_steps * d)

    def best_hold(self, v: DoorView, now: float) -> tuple[float, float]:
        """(net saving in seconds, hold seconds) of the best hold; (0, 0) when none pays."""
        if not self.ready or not v.remaining or v.pending_rows <= 0:
            return 0.0, 0.0
        d, row = self.prices(v)
        cap = self._cap(d)
        lam = self.rate(now)
        # A hold delays more than the pending requests: while the slots are busy, a later start
        # pushes back every request behind it (queueing: a delay inside a busy period reaches each
        # request of that period, ~1 / (1 - utilisation) of them). Slot occupancy stands in for
        # utilisation: a full roster makes holding all but never pay.
        load = 1.0 / max(1.0 - v.active / v.slots, 1.0 / v.slots)
        best = (0.0, 0.0)
        saved = 0.0
        for j, r in enumerate(sorted(v.remaining), start=1):
            hold = r * d  # the j-th nearest end, in decode steps from now
            if hold > cap:
                break
            rows = v.pending_rows if not self.chunk else min(v.pending_rows, r * self.chunk)
            saved += rows * row
            net = saved - load * (v.pending * hold + lam * hold * hold / 2)
            if net > best[0]:
                best = (net, hold)
        return best

    def decide(self, v: DoorView, now: float) -> tuple[bool, str | None]:
        """(open, release reason). Reasons: idle, priced (no hold pays now), window (a hold that
        still pays ran out its cap)."""
        if (early := _open_regardless(self, v)) is not None:
            return early
        net, _ = self.best_hold(v, now)
        if net <= 0:
            self.since = None
            return True, "priced"
        if self.since is not None and now - self.since >= self._cap(self.prices(v)[0]):  # holding: costs known
            self.since = None
            return True, "window"
        if self.since is None:
            self.since = now
        return False, None


def make_door(ms: int | str | None, max_prompts: int, chunk: int | None, costs=None):
    """The door ADMIT_COALESCE_MS asks for: None (off), a fixed window, or the priced one (which
    reads `costs`, the engine's step-cost model)."""
    if ms is None:
        return None
    if ms == "auto":
        if costs is None:
            raise ValueError("ADMIT_COALESCE_MS=auto prices with the engine's step-cost model: pass it")
        return PricedDoor(chunk, costs)
    return CoalesceDoor(ms / 1000.0, max_prompts)
