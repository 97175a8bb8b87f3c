"""The admission coalesce door (TAILGATE_ADMIT_COALESCE_MS).

With a live decode batch, every admission is a mixed step that every live stream's inter-token
gap pays. The door holds arrivals up to `window` so one window's arrivals are admitted in one
intake turn (one interruption instead of one per arrival). It prices the number of
interruptions, not their size: gather rules still decide how many prompts share one step.
"""
from __future__ import annotations


class CoalesceDoor:
    def __init__(self, window_s: float, max_prompts: int):
        self.window = window_s
        self.max_prompts = max_prompts
        self.since: float | None = None  # pinned at the first held turn of the current cohort

    def decide(self, pending: int, active: int, slots: int, now: float) -> tuple[bool, str | None]:
        """(open, release reason). Reasons: idle, shallow, cohort, window; None when there is
        nothing to release (empty queue) or the door stays closed."""
        if pending == 0:
            self.since = None
            return True, None
        if active == 0:
            self.since = None
            return True, "idle"
        if (active + pending) * 2 < slots:  # shallow batch: nothing worth protecting
            self.since = None
            return True, "shallow"
        # The cohort is a capacity bound over the slots free now, floored at one.
        cohort = max(1, min(self.max_prompts, slots - active))
        if self.since is None:
            self.since = now
        if pending >= cohort:
            self.since = None
            return True, "cohort"
        if now - self.since >= self.window:
            self.since = None
            return True, "window"
        return False, None

    def opens(self, pending: int, active: int, slots: int, now: float) -> bool:
        return self.decide(pending, active, slots, now)[0]
