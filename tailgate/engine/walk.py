"""The walk: every admitted prompt enters the live batch as a walker, N rows per step.

With the walk off (no MIX_CHUNK_TOKENS, no ITL_TARGET_MS) a round takes every walker's whole
prompt, and every live stream's inter-token gap pays it (a 1024-token prompt is ~2.5 s of one
step on the 2-core EPYC). With the chunked walk (MIX_CHUNK_TOKENS, ITL_TARGET_MS), the
admitted prompts ("walkers", status walking) advance in rounds: each round spreads a prompt-row
budget over the walkers in arrival order, reserves only the pages that round writes, and rides
the live decode rows. One round is one iteration's forward pass, so live streams get a token
between rounds and a stall is bounded by one round. Plain data, no torch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Iterator

from .preemption import holders, make_room, never_fits, ready_rows
from .request import rank

if TYPE_CHECKING:
    from .plan import StepPlan
    from .request import Request
    from .scheduler import Scheduler


def round_budget(s: Scheduler, now: float) -> int | None:
    """How many prompt rows this round spreads over the walkers: MIX_CHUNK_TOKENS, or under
    ITL_TARGET_MS what the step-cost model prices within the target, or None with the walk off
    (every walker takes its whole rest: the whole prompts of a mixed step)."""
    if s.pace is None:
        return s.chunk or None
    # ITL_TARGET_MS (and TTFT_TARGET_MS, which reads the queue's prompts too)
    if s.pace.horizon is None:
        return s.pace.rows(s.walk, s.roster)
    queued = sum(len(r.prompt) for r in s.queue)
    waited = now - min(w.arrival for w in s.walk) if s.walk else 0.0  # the longest a walker has waited
    return s.pace.rows(s.walk, s.roster, queued, waited, s.running + len(s.queue))  # (keeping_up: every request in)


def spread(walkers, budget: float, planned: Callable[[], int] | None = None) -> Iterator[tuple[Request, int]]:
    """The walk's spread of a round's `budget` prompt rows over `walkers` in order: (walker, rows)
    for each that gets any, each taking min(its rest, what is left). What is left is `budget` less
    `planned()`, the rows the round has actually planned so far (`walk_round`: a walker that
    cannot get pages leaves its rows to those behind it, a preemption can give rows back), or with
    `planned` None less every share given so far, each assumed taken (the pricing's view of the
    same round: `step_cost.RoundBudget.round_features`)."""
    # (plain comparisons, no min(): the pricing's bisections run this ~10 times a walk round)
    for w in walkers:
        left = budget if planned is None else budget - planned()
        if left <= 0 and planned is None:  # nothing comes back: the rest get nothing
            return
        n = w.rest
        if n > left:
            n = left
        if n > 0:
            if planned is None:
                budget -= n  # assumed taken
            yield w, n


def walk_round(s: Scheduler, plan: StepPlan) -> None:
    """One round: at most the budget's prompt rows across the walkers (oldest arrival first),
    beside every live row. The budget is MIX_CHUNK_TOKENS, or under ITL_TARGET_MS what the
    step-cost model prices within the target (engine/step_cost.py). A walker short of pages takes
    them from younger page holders; with none younger it waits for a later round and leaves this
    round's rows to the walkers behind it (a pinned one among them takes its pages from any
    unpinned holder, so the round always moves), unless it is the only holder left, which means
    its prompt does not fit the pools at all."""
    ready_rows(s, plan)
    s.walk.sort(key=rank)  # stable: admission order among equals
    budget = round_budget(s, plan.at)
    # what is left is what the walkers planned so far left: one waiting for pages leaves its rows
    # to the ones behind it, and a pinned walker that preempts one planned before it takes its rows back
    for w, take in spread(list(s.walk), math.inf if budget is None else budget, lambda: plan.prompt_rows):
        if w not in s.walk:  # (preempted by a walker of this round)
            continue
        if make_room(s, plan, w, w.computed + take, self_ok=False):
            plan.chunks.append((w, take))
        elif not holders(s, w) and not plan.chunks and s.flight is None:
            s.end(w, "error", never_fits(w), plan)
    plan.budget = budget
    plan.why = plan.why or "a walk round"
