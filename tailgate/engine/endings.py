"""How requests end outside a step's tokens: cancelled ones retire at the top of a plan (live rows
and walkers always; queued ones when `Engine.abort` flagged the queue), and the fatal path fails
everything. Functions over the scheduler's state; the ending itself is `Scheduler.end`, the one
every ending calls."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .admission import admissible, pop
from .request import Status

if TYPE_CHECKING:
    from .plan import StepPlan
    from .scheduler import Scheduler


def retire_cancelled(s: Scheduler, plan: StepPlan) -> None:
    for r in [r for r in (*s.roster, *s.walk) if r.cancelled]:
        s.end(r, r.cancel_as, plan=plan)  # pages return at once
    if s.cancels_queued:  # set by Engine.abort: a queued request retires now, not at the queue head
        s.cancels_queued = False
        dead = [r for r in s.queue if r.cancelled]
        if dead:
            s.queue = deque(r for r in s.queue if not r.cancelled)
            for r in dead:
                r.passed = False
                if r.held_at is not None:
                    s.metrics.door_hold.observe(s.clock() - r.held_at)
                    r.held_at = None
                admissible(s, plan, r)  # a cancelled request is never admissible: it finishes here


def fail_all(s: Scheduler, message: str) -> None:
    """Finish every queued and live request with an error and deliver it."""
    if s.flight is not None:  # its pages come back only once the lane worker stops writing them
        r, flight = s.flight
        s.flight = None
        try:
            s.executor.join(flight)
        except Exception:
            pass  # it failed too: its pages are not written any more either
        s.end(r, "error", message)
    for r in [*s.roster, *s.walk]:
        s.end(r, "error", message)
    plan, s.planned = s.planned, None
    r = plan.launch if plan is not None else None  # the lane's leader, planned but not launched
    if r is not None and r.status is Status.IN_FLIGHT:
        s.end(r, "error", message)
    while s.queue:
        s.end(pop(s), "error", message)
    s.deliver()
