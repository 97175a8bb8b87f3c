"""Preemption: the pages a step needs, taken back from younger holders. Functions over the
scheduler's state, called only while `Scheduler.schedule` plans an iteration.

Every live row gets a page for its next token before anyone is admitted; a walker's round
reserves the pages it writes. Short of pages, the youngest holder (live row or walker) is
preempted: its pages return, its output is kept, and it is requeued in arrival order to be
recomputed. A request that fits the pools alone is never failed.

The bound: no request is preempted more than MAX_PREEMPTIONS times. The preemption that makes it
`pinned` also changes its standing: preemption never chooses it, and when it needs a page it may
take one from any unpinned holder, older or younger. It is readmitted only while the pinned
requests' whole lengths (prompt + max_tokens - 1 each) fit the pools together (`pinned_fit`), so
the pages the pinned need always exist among what they hold and what unpinned requests can give
back. It holds only the pages it has written, as any request does: reserving its whole length up
front (issue 36's first rule) held a context for every chat whose EOS came after a few hundred
tokens, and at a KV budget of 1-1.5 contexts drained such runs 15-58 % slower (issue 43).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import lane
from .pages import pages_for
from .request import Request, Status, rank

if TYPE_CHECKING:
    from .plan import StepPlan
    from .scheduler import Scheduler


# vLLM preempts the youngest with no bound; issue 25's thrash case (three old streams, four walking
# newcomers) preempted one stream twice for 1877 prompt rows computed per 688 useful. Taking a
# request preempted this many times last took the three thrash scenarios of
# scripts/experiments/thrash_rows.py from 4.46/5.42/2.59x to 1.90/2.09/1.52x rows per useful row;
# issue 36 made it a bound (module doc).
MAX_PREEMPTIONS = 2


def pinned(r: Request) -> bool:
    return r.preemptions >= MAX_PREEMPTIONS


def full_length(r: Request) -> int:
    """Every token a request can ever hold KV for: its prompt and its whole max_tokens but the
    last, which is sampled and sent but never fed back (issue 43: counting it refused a request
    that fits a pool of exactly its length)."""
    return len(r.prompt) + r.max_tokens - 1


def entry_length(r: Request) -> int:
    """The tokens `r` must fit the pools in with nothing else running to be admitted at all: its
    prompt (and any output to recompute), or, pinned, its whole length (`pinned_fit` counts it)."""
    return full_length(r) if pinned(r) else len(r.tokens)


def pinned_fit(s: Scheduler, r: Request) -> bool:
    """Whether pinned `r` may come in: the whole lengths of every pinned request holding pages
    (live rows, walkers, the lane's flight) and its own fit each pool together. Counted, not held:
    a pinned request reserves page by page and takes what it lacks from unpinned holders."""
    flying = (s.flight[0],) if s.flight is not None else ()  # (request, flight)
    held = [h for h in (*s.roster, *s.walk, *flying) if pinned(h)]
    need = sum(pages_for(full_length(h)) for h in held if h is not r) + pages_for(full_length(r))
    return need <= s.book.glob.capacity and (s.book.local is None or need <= s.book.local.capacity)


def never_fits(r: Request) -> str:
    what = "the request (pinned after its preemptions: its whole length)" if pinned(r) else "the prompt"
    return f"{what} needs {pages_for(entry_length(r))} KV pages per pool, more than the pools hold with nothing running"


def ready_rows(s: Scheduler, plan: StepPlan) -> bool:
    """Give every live row a page for its next token, oldest arrival first; returns whether anyone
    was preempted for it. A row that is the only page holder and still cannot grow does not fit
    the pools alone, and fails."""
    before = len(plan.preempted)
    # Only rows at the end of their last page need one (1 step in 16): the sort stays off most steps.
    # Until none is short: a lane flight landed for pages enters the roster during the pass, and
    # its row needs a page like the others (issue 36: it decoded past its page table).
    while full := [a for a in s.roster if a.pages.frontier >= a.pages.reserved]:
        for a in sorted(full, key=rank) if len(full) > 1 else full:
            if a not in s.roster:  # preempted for an older row of this very call
                continue
            if not make_room(s, plan, a, a.pages.frontier + 1, self_ok=True) and a in s.roster:
                s.end(a, "error", "KV pools exhausted: the request does not fit them alone", plan)
    return len(plan.preempted) > before


def holders(s: Scheduler, but: Request) -> list[Request]:
    """Everyone else holding KV pages that preemption can take back: live rows and walkers (the
    lane's flight is written by its worker until it lands)."""
    return [h for h in (*s.roster, *s.walk) if h is not but and frees_a_page(s, h)]


def frees_a_page(s: Scheduler, h: Request) -> bool:
    """Whether preempting `h` returns a page: one it holds alone (a victim holding only prefix
    pages another request shares frees nothing and would still count toward its bound)."""
    return any(s.book.glob.holders(p) == 1 for p in h.pages.global_pages)


def make_room(s: Scheduler, plan: StepPlan, holder: Request, total: int, self_ok: bool) -> bool:
    """Reserve KV for `holder` (a live row or a walker) up to `total` tokens, preempting unpinned
    holders younger than it (any unpinned holder, when `holder` is pinned), youngest arrival
    first. When none is left, an unpinned live row (`self_ok`) gives its own pages back if anyone
    else holds pages, and a walker waits (older ones finish and free theirs). For a live row the
    lane's flight lands first, before anyone is chosen: its request then holds its pages as a
    live row like any other, and `ready_rows` gives its row a page in the same pass. A walker never lands it (a row landed mid-round would ride the round
    without a page): the flight lands at the next iteration's top. Returns whether it got them."""
    while not s.book.reserve(holder.pages, total):
        if s.flight is not None and self_ok:
            lane.land(s, plan, "pages")
            continue
        others = holders(s, holder)
        younger = [
            h
            for h in others
            if not pinned(h)
            and (
                pinned(holder)
                or rank(h) > rank(holder)
                or (rank(h) == rank(holder) and h.status is Status.WALKING and holder.status is not Status.WALKING)
            )
        ]
        if younger:  # equal arrivals: a walker came in after every live row
            preempt(s, plan, max(younger, key=rank))
        elif others and self_ok and not pinned(holder):
            preempt(s, plan, holder)
            return False
        else:
            return False
    return True


def preempt(s: Scheduler, plan: StepPlan, h: Request) -> None:
    """Take a live row's or a walker's pages back and requeue it to be recomputed (its output so
    far is kept and not re-emitted; its sampler state stays with the executor). Its written pages,
    prompt and output, stay in the prefix cache for its recompute."""
    h.preemptions += 1
    s.metrics.preemptions += 1
    plan.preempted.append(h)
    # a pinned walker takes pages from any unpinned holder, a walker planned in this round too
    plan.chunks = [(r, take) for r, take in plan.chunks if r is not h]
    if h.status is Status.RUNNING:
        s.roster.remove(h)
        if s.prefix is not None:
            s.prefix.keep(h.prompt + h.output, len(h.prompt), h.id, h.pages)
    else:
        s.walk.remove(h)
        if s.prefix is not None:
            s.prefix.keep(h.tokens, len(h.prompt), h.id, h.pages)
    park(s, h)


def park(s: Scheduler, r: Request) -> None:
    """Back to the queue with its pages returned, ahead of every later arrival (readmission in
    arrival order), keeping any output it already emitted to recompute on readmission."""
    s.book.free(r.pages)
    r.passed = True  # it was let in once: no second wait at the door
    r.status = Status.PREEMPTED if r.preemptions else Status.WAITING
    i = 0
    while i < len(s.queue) and rank(s.queue[i]) < rank(r):
        i += 1
    s.queue.insert(i, r)
