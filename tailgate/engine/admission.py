"""Admission: who comes in from the queue, and when — the door, the intake turn and the walk's
joiners. Functions over the scheduler's state (`s`: its queue, roster, walk and pages), called
only from `Scheduler.schedule`; each writes what it decided on the iteration's plan. Never
touches tensors.

One way in: an intake turn (door permitting) pops the queue head, checks it, and it and the
followers gathered beside it become walkers (engine/walk.py); the regimes differ only in how
wide a round is (walk.round_budget) and, with the walk off, in the gather's bounds (followers
only beside live rows, within MIX_GATHER_ROWS). The one exception is the side lane: with a live
roster the leader's whole prompt launches there instead. A running walk takes arrivals in
instead of waiting it out.
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

from .door import DoorView
from .pages import pages_for
from .preemption import entry_length, never_fits, park, pinned, pinned_fit, ready_rows
from .prompt_logprobs import new_scores
from .request import Request, Scheduled, Status

if TYPE_CHECKING:
    from .plan import StepPlan
    from .scheduler import Scheduler


def door_open(s: Scheduler, plan: StepPlan, now: float) -> bool:
    """Whether this turn may admit. The door is asked only about arrivals it has not let through
    yet: when it opens, every request then in the queue is one cohort, and what one turn cannot
    admit (MIX_MAX_PROMPTS, the slots) goes at the next turn, not after a fresh window; a
    preempted request was admitted once already and never waits at the door."""
    if s.door is None or not s.queue:
        return True
    head = s.queue[0]
    if head.preemptions or head.passed:
        return True
    opened, reason = s.door.decide(door_view(s), now)
    if not opened:
        for r in s.queue:
            if r.held_at is None and not r.preemptions and not r.passed:
                r.held_at = now
                r.status = Status.HELD
                plan.held += 1
        plan.why = "the door holds"
        return False
    released = [r for r in s.queue if r.held_at is not None]
    if released and reason is not None:  # count openings that let held arrivals through
        s.metrics.door_releases[reason] += 1
    for r in released:
        s.metrics.door_hold.observe(now - r.held_at)
        r.held_at = None
        r.status = Status.WAITING
    for r in s.queue:
        r.passed = True
    return True


def door_view(s: Scheduler) -> DoorView:
    cohort = islice(s.queue, max(1, min(s.cfg.mix_max_prompts, s.slots - s.running)))
    return DoorView(
        len(s.queue),
        s.running,
        s.slots,
        tuple(a.max_tokens - len(a.output) for a in s.roster),
        sum(len(r.prompt) for r in cohort),
        sum(a.pages.frontier + 1 for a in s.roster) / 1000,
    )


def pop(s: Scheduler) -> Request:
    r = s.queue.popleft()
    r.passed = False
    if r.held_at is not None:  # held behind a head the door lets through (a parked one): released with it
        s.metrics.door_hold.observe(s.clock() - r.held_at)
        r.held_at = None
        r.status = Status.WAITING
    return r


def intake(s: Scheduler, plan: StepPlan, now: float) -> None:
    """One intake turn: admit from the queue head, door permitting, as walkers (or onto the lane;
    module doc). Every popped request spends the turn's budget (cancelled and invalid ones too),
    so a backlog of dead submissions cannot stall the live streams for long."""
    if not door_open(s, plan, now):
        return
    attempts = 0
    while s.queue and attempts < s.slots and len(s.roster) < s.slots:
        # The live rows get their next pages before anyone is admitted, and a turn that had to
        # preempt for them admits nobody (vLLM's rule): a newcomer never takes the pages an older
        # stream was just made to give back; the preempted one waits in the queue, ahead of every
        # later arrival.
        if s.roster and ready_rows(s, plan):
            plan.why = "live rows took pages back: nobody is admitted"
            return
        leader = pop(s)
        attempts += 1
        if not admissible(s, plan, leader):
            continue
        begin(s, leader)
        if not (s.roster or s.walk) and not fits_alone(s, leader):
            s.end(leader, "rejected", never_fits(leader), plan)  # its prefix pages and sampler state go back
            continue
        if s.lane and s.roster:  # a live admission takes the lane
            to_lane(s, plan, leader)
        else:
            start_walk(s, plan, leader, attempts)
        return


def fits_alone(s: Scheduler, r: Request) -> bool:
    """Whether `r` (its whole length once pinned) fits the pools with nothing else holding pages."""
    return s.book.fits(r.pages, entry_length(r))


def to_lane(s: Scheduler, plan: StepPlan, r: Request) -> None:
    """A live admission's whole prompt, its pages reserved now, launches on the side lane."""
    if (pinned(r) and not pinned_fit(s, r)) or not s.book.reserve(r.pages, len(r.tokens)):
        park(s, r)  # someone live will free pages: it waits at the head
        plan.why = "the head waits for pages"
        return
    r.status = Status.IN_FLIGHT  # in no container until the step launches it (Scheduler.planned)
    plan.launch = r
    admit(s, plan, [r], "a live admission prefills on the side lane")


def begin(s: Scheduler, r: Request) -> None:
    """Ready `r` to prefill: a newcomer its prompt; a preempted one its prompt and the output it
    emitted, to recompute. It resumes at its longest cached prefix; one asking for prompt
    logprobs computes every row itself (a cached row has no logits)."""
    r.resumed = len(r.output)
    r.tokens = r.prompt + r.output if r.output else r.prompt
    r.scores = new_scores(r, r.output)
    r.status = Status.WALKING
    r.cached = 0
    if s.prefix is not None and r.scores is None:
        r.cached = s.prefix.attach(r.tokens, len(r.prompt), r.id, r.pages)


def admit(s: Scheduler, plan: StepPlan, admitted: list[Request], why: str) -> None:
    """Record admissions on the plan and tell each newcomer's stream it is scheduled (a preempted
    request was told once already)."""
    plan.admitted += admitted
    plan.why = why
    for r in admitted:
        if not r.resumed and not r.preemptions:
            s.emit(
                r, Scheduled(r.id, s.clock(), queued_at=r.arrival, prompt_tokens=len(r.prompt), cached_tokens=r.cached)
            )
            s.metrics.prefix_queries += len(r.prompt) if s.prefix is not None else 0
            s.metrics.prefix_hits += r.cached


def start_walk(s: Scheduler, plan: StepPlan, leader: Request, attempts: int) -> None:
    """The leader and its gathered followers become walkers; pages are reserved round by round."""
    if not room_for(s, leader):
        park(s, leader)  # live rows will free pages: it waits at its place in the queue
        plan.why = "the head waits for pages"
        return
    s.walk = [leader]
    if s.chunk:
        why = "a walk starts"
    else:
        why = "whole prompts ride the live rows" if s.roster else "a prompt alone"
    add_walkers(s, plan, attempts, [leader], why)


def join_walk(s: Scheduler, plan: StepPlan, now: float) -> None:
    """Arrivals join a running walk, door permitting, up to MIX_MAX_PROMPTS walkers and the slots,
    instead of waiting it out: they take the round's rows the walkers ahead of them leave, so a
    live stream's stall stays one round, and a released cohort walks as one. With the walk off
    a round takes whole prompts, so a walk outlives its iteration only while a walker waits for
    pages; arrivals then wait too, as behind any parked head."""
    if s.chunk and len(s.walk) < s.cfg.mix_max_prompts and s.running < s.slots and door_open(s, plan, now):
        add_walkers(s, plan, 0, [], "arrivals join the walk")


def add_walkers(s: Scheduler, plan: StepPlan, attempts: int, added: list[Request], why: str) -> None:
    """Followers join from the queue head while every rule holds: MIX_MAX_PROMPTS walkers, the
    slots, the turn's attempts, room in the pools; with the walk off also the gather's, which
    takes coincident prompts only beside live rows and only while their prompt rows stay within
    MIX_GATHER_ROWS (the leader is never bounded)."""
    whole = not s.chunk
    if whole and not s.roster:
        admit(s, plan, added, why)  # a prompt alone: nothing live for followers to ride beside
        return
    rows = sum(w.rest for w in added)
    while s.queue and len(s.walk) < s.cfg.mix_max_prompts and s.running < s.slots and attempts < s.slots:
        if whole and rows >= s.cfg.mix_gather_rows:
            break
        f = pop(s)
        attempts += 1
        if admissible(s, plan, f):
            begin(s, f)
            if (whole and rows + f.rest > s.cfg.mix_gather_rows) or not room_for(s, f):
                park(s, f)
                break
            s.walk.append(f)
            added.append(f)
            rows += f.rest
    if added:
        admit(s, plan, added, why)


def room_for(s: Scheduler, r: Request) -> bool:
    """Whether a walker's whole prompt fits the global pool beside what is already promised: the
    other walkers' pages still to come and a page for each live row. A walker admitted without
    that room walks, takes the pages an older stream needs next, is preempted and walks again
    (issue 25's thrash: 3-5x the useful prompt rows). With nothing live it always goes (intake
    refused a prompt that cannot fit even alone: `fits_alone`). A pinned request (preempted
    MAX_PREEMPTIONS times) goes when the pinned requests' whole lengths fit together
    (preemption.pinned_fit): it takes the pages it lacks from unpinned holders as it walks."""
    if pinned(r):
        return pinned_fit(s, r)
    if s.roster or s.walk:
        promised = len(s.roster) + sum(pages_for(len(o.tokens)) - len(o.pages.global_pages) for o in s.walk)
        free = s.book.glob.available  # idle cached pages count: a reservation evicts them
        if pages_for(len(r.tokens)) - len(r.pages.global_pages) + promised > free:
            return False
    return True


def admissible(s: Scheduler, plan: StepPlan, r: Request) -> bool:
    """Cancelled requests retire; invalid ones are rejected (fail closed)."""
    if r.cancelled:
        s.end(r, r.cancel_as, plan=plan)  # a queued abort counts like a live one
        return False
    why = invalid(r, s.cfg.max_context, s.vocab_size)
    if why:
        s.end(r, "rejected", why, plan)
        return False
    return True


def invalid(r: Request, max_context: int, vocab_size: int) -> str | None:
    if not r.prompt:
        return "empty prompts are not served"
    if r.max_tokens < 1:
        return f"max_tokens must be at least 1, got {r.max_tokens}"
    if len(r.prompt) + r.max_tokens > max_context:
        return (
            f"maximum context length is {max_context} tokens, but the prompt contains "
            f"{len(r.prompt)} tokens and max_tokens is {r.max_tokens}"
        )
    if min(r.prompt) < 0 or max(r.prompt) >= vocab_size:  # C speed; then find it
        bad = next(t for t in r.prompt if not 0 <= t < vocab_size)
        return f"token id {bad} is outside the vocabulary (0..{vocab_size - 1})"
    return None
