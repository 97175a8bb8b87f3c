"""Preemption: the pages a step needs, taken back from younger holders (a mixin of `Scheduler`).

Every live row gets a page for its next token before anyone is admitted; a walker's round
reserves the pages it writes. Short of pages, the youngest holder (live row or walker) is
preempted, its output kept, and requeued in arrival order to be recomputed; a request already
preempted MAX_PREEMPTIONS times goes last. A request that fits the pools alone is never failed.
"""
from __future__ import annotations

from .pages import SeqPages
from .request import Request, Status
from .walk import Walker

# A request preempted this many times is taken last when pages must be freed (`_make_room`).
# vLLM preempts the youngest with no bound; issue 25's thrash case (three old streams, four walking
# newcomers) preempted one stream twice for 1877 prompt rows computed per 688 useful. Preempting
# over every holder with this bound took the three thrash scenarios of
# scripts/experiments/thrash_rows.py from 4.46/5.42/2.59x to 1.90/2.09/1.52x rows per useful row.
MAX_PREEMPTIONS = 2


class Preemption:
    def _ready_decode_rows(self) -> bool:
        """Give every live row a page for its next token, oldest arrival first; returns whether
        anyone was preempted for it (`_make_room`). A row that is the only page holder and still
        cannot grow does not fit the pools alone, and fails."""
        preempted = self.metrics.preemptions
        # Only rows at the end of their last page need one (1 step in 16): the sort stays off most steps.
        # Until none is short: a lane flight joined for pages enters the roster during the pass, and
        # its row needs a page like the others (issue 36: it decoded past its page table).
        while full := [a for a in self.roster if a.pages.frontier >= a.pages.reserved]:
            for a in sorted(full, key=lambda a: a.req.arrival) if len(full) > 1 else full:
                if a not in self.roster:  # preempted for an older row of this very call
                    continue
                if not self._make_room(a, a.pages.frontier + 1, self_ok=True) and a in self.roster:
                    self._finish(a, "error", "KV pools exhausted: the request does not fit them alone")
        return self.metrics.preemptions > preempted

    def _holders(self, but) -> list:
        """Everyone else holding KV pages that preemption can take back: live rows and walkers
        (the lane's flight is written by its worker until it joins)."""
        return [h for h in (*self.roster, *self.walk) if h is not but and h.pages.global_pages]

    def _make_room(self, holder, total: int, self_ok: bool) -> bool:
        """Reserve KV for `holder` (an Active or a Walker) up to `total` tokens, preempting page
        holders youngest arrival first: a request preempted MAX_PREEMPTIONS times goes last, so the
        same stream is not recomputed over and over (vLLM preempts the youngest; its thrash is
        unbounded). Only holders younger than `holder` are taken; when none is left, a live row
        (`self_ok`) preempts itself if anyone else holds pages (it is then the youngest), and a
        walker waits. For a live row a lane flight is joined first, before anyone is chosen: its
        request then holds its pages as a live row like any other (the youngest may be it), and
        `_ready_decode_rows` gives its row a page in the same pass. A walker never joins it (a row
        joined mid-round would ride the round without a page): it waits, and the flight joins at
        the next iteration's top. Returns whether it got the pages."""
        while not self.book.reserve(holder.pages, total):
            if self.flight is not None and self_ok:
                self._join()
                continue
            others = self._holders(holder)
            younger = [h for h in others if h.req.arrival > holder.req.arrival
                       or (h.req.arrival == holder.req.arrival and self._admitted_after(h, holder))]
            if younger:
                self._preempt(max(younger, key=lambda h: (h.req.preemptions < MAX_PREEMPTIONS, h.req.arrival)))
            elif others and self_ok:
                self._preempt(holder)
                return False
            else:
                return False
        return True

    def _admitted_after(self, h, holder) -> bool:
        """Tie-break between equal arrivals: a walker came in after every live row."""
        return isinstance(h, Walker) and not isinstance(holder, Walker)

    def _preempt(self, h) -> None:
        """Take a live row's or a walker's pages back and requeue it to be recomputed (its output
        so far, if any, is kept and not re-emitted; its sampler state stays with the executor)."""
        h.req.preemptions += 1
        self.metrics.preemptions += 1
        if h in self.roster:
            self.roster.remove(h)
            if self.prefix is not None:  # its written pages, prompt and output, stay cached for its recompute
                self.prefix.keep(h.req.prompt + h.output, len(h.req.prompt), h.req.id, h.pages)
            self._park(h.req, h.pages, h.output, h.last_at)
        else:
            self.walk.remove(h)
            if self.prefix is not None:
                self.prefix.keep(h.tokens, len(h.req.prompt), h.req.id, h.pages)
            self._park(h.req, h.pages, h.resumed, h.last_at)

    def _requeue(self, w: Walker) -> None:
        self._park(w.req, w.pages, w.resumed, w.last_at)

    def _park(self, req: Request, pages: SeqPages, output: list[int], last_at: float | None) -> None:
        """Back to the queue with its pages returned, ahead of every later arrival (re-admission in
        arrival order), keeping any output it already emitted to recompute on readmission."""
        self.book.free(pages)
        if output:
            self._preempted[req.id] = (list(output), last_at)
        self._passed.add(req.id)  # it was let in once: no second wait at the door
        req.status = Status.PREEMPTED if req.preemptions else Status.WAITING
        i = 0
        while i < len(self.queue) and self.queue[i].arrival < req.arrival:
            i += 1
        self.queue.insert(i, req)

