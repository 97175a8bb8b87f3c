"""Admission: the door, the intake turn, the gather, and the walk's walkers (a mixin of `Scheduler`).

Who gets in and when: an intake turn (door permitting) pops the queue head, checks it, and either
starts a walk with it and its followers, or runs it in a whole-prompt (mixed) step with the
prompts gathered beside it; a running walk takes arrivals in. Reads and writes the scheduler's
queue, roster, walk and pages; never touches tensors.
"""
from __future__ import annotations

from itertools import islice

from .door import DoorView
from .pages import SeqPages, pages_for
from .prompt_logprobs import new_scores
from .request import Finished, Request, Scheduled, Status
from .walk import Walker, plan_round


class Admission:
    def _door_open(self, now: float) -> bool:
        """Whether this turn may admit. The door is asked only about arrivals it has not let
        through yet: when it opens, every request then in the queue is one cohort, and what one
        turn cannot admit (MIX_MAX_PROMPTS, the slots) goes at the next turn, not after a fresh
        window; a preempted request was admitted once already and never waits at the door."""
        if self.door is None or not self.queue:
            return True
        head = self.queue[0]
        if head.preemptions or head.id in self._passed:
            return True
        opened, reason = self.door.decide(self._door_view(), now)
        if not opened:
            for r in self.queue:  # a passed or preempted request never waits at the door
                if r.held_at is None and not r.preemptions and r.id not in self._passed:
                    r.held_at = now
                    r.status = Status.HELD
            return False
        released = [r for r in self.queue if r.held_at is not None]
        if released and reason is not None:  # count openings that let held arrivals through
            self.metrics.door_releases[reason] += 1
        for r in released:
            self.metrics.door_hold.observe(now - r.held_at)
            r.held_at = None
            r.status = Status.WAITING
        self._passed.update(r.id for r in self.queue)
        return True

    def _pop(self) -> Request:
        r = self.queue.popleft()
        self._passed.discard(r.id)
        if r.held_at is not None:  # held behind a head the door lets through (a parked one): released with it
            self.metrics.door_hold.observe(self.clock() - r.held_at)
            r.held_at = None
            r.status = Status.WAITING
        return r

    def intake_turn(self, now: float) -> bool:
        """Admit from the queue head; returns whether the door was open."""
        if not self._door_open(now):
            return False
        attempts = 0
        # Every popped request spends the turn's budget (cancelled and invalid ones too), so a
        # backlog of dead submissions cannot stall the live streams for an unbounded time.
        while self.queue and attempts < self.slots and len(self.roster) < self.slots:
            # The live rows get their next pages before anyone is admitted, and a turn that had
            # to preempt for them admits nobody more (vLLM's rule): a newcomer never takes the
            # pages an older stream was just made to give back; the preempted one waits in the
            # queue, ahead of every later arrival.
            if self.roster and self._ready_decode_rows():
                break
            leader = self._pop()
            attempts += 1
            if not self._admissible(leader):
                continue
            if self.chunk and not (self.lane and self.roster):  # a live admission takes the lane
                self._start_walk(leader, attempts)
                return True
            live = bool(self.roster)
            lead = self._walker(leader)
            if not self.book.reserve(lead.pages, len(lead.tokens)):
                if live:
                    self._requeue(lead)  # someone live will free pages: wait at the head
                    break
                self.book.free(lead.pages)  # prefix pages it attached
                self.executor.release(leader.id)  # a preempted one's sampler state
                self._preempted.pop(leader.id, None)
                self._reject(leader, self._never_fits(lead))
                continue
            if self.lane and live:
                self._launch(lead)
                return True
            newcomers = [lead]
            if live:
                attempts = self._gather(newcomers, attempts)
            self._announce(newcomers)
            self._run([(w, w.rest) for w in newcomers], self.roster if live else [])
        return True

    def _door_view(self) -> DoorView:
        cohort = islice(self.queue, max(1, min(self.cfg.mix_max_prompts, self.slots - self.running)))
        return DoorView(len(self.queue), self.running, self.slots,
                        tuple(a.req.max_tokens - len(a.output) for a in self.roster),
                        sum(len(r.prompt) for r in cohort))

    def _walker(self, req: Request) -> Walker:
        """A newcomer; a preempted request comes back with its output so far to recompute."""
        resumed, last_at = self._preempted.pop(req.id, ([], None))
        w = Walker(req, SeqPages(), resumed=resumed, last_at=last_at)
        w.scores = new_scores(req, resumed)
        req.status = Status.WALKING
        # A prompt, or a recompute (its own pages too), resumes at its longest cached prefix; one
        # asking for prompt logprobs computes every row itself (a cached row has no logits).
        if self.prefix is not None and w.scores is None:
            w.done = w.cached = self.prefix.attach(w.tokens, len(req.prompt), req.id, w.pages)
        return w

    def _announce(self, walkers: list[Walker]) -> None:
        for w in walkers:
            if not w.resumed and not w.req.preemptions:  # a preempted request was scheduled once already
                self._emit(w.req, Scheduled(w.req.id, self.clock(), queued_at=w.req.arrival,
                                            prompt_tokens=len(w.req.prompt), cached_tokens=w.cached))
                self.metrics.prefix_queries += len(w.req.prompt) if self.prefix is not None else 0
                self.metrics.prefix_hits += w.cached

    def _start_walk(self, leader: Request, attempts: int) -> None:
        """The leader and its gathered followers become walkers. No row budget: each round is
        bounded by the chunk width instead. Pages are reserved round by round."""
        lead = self._walker(leader)
        if not self._room_for(lead):
            self._requeue(lead)  # live rows will free pages: it waits at its place in the queue
            return
        self.walk = [lead]
        self._add_walkers(attempts, [lead])

    def _join_walk(self, now: float) -> None:
        """Arrivals join a running walk, door permitting, up to MIX_MAX_PROMPTS walkers and the
        slots, instead of waiting it out: they take the round's rows the walkers ahead of them
        leave (`plan_round`), so a live stream's stall stays one chunk, and a released cohort
        walks as one."""
        if len(self.walk) < self.cfg.mix_max_prompts and self.running < self.slots and self._door_open(now):
            self._add_walkers(0, [])

    def _add_walkers(self, attempts: int, added: list[Walker]) -> None:
        while (self.queue and len(self.walk) < self.cfg.mix_max_prompts and self.running < self.slots
               and attempts < self.slots):
            f = self._pop()
            attempts += 1
            if self._admissible(f):
                w = self._walker(f)
                if not self._room_for(w):
                    self._requeue(w)
                    break
                self.walk.append(w)
                added.append(w)
        self._announce(added)

    def _room_for(self, w: Walker) -> bool:
        """Whether a walker's whole prompt fits the global pool beside what is already promised:
        the other walkers' pages still to come and a page for each live row. A walker admitted
        without that room walks, takes the pages an older stream needs next, is preempted and
        walks again (issue 25's thrash: 3-5x the useful prompt rows). With nothing live it always
        goes (a prompt that cannot fit even alone is refused by its first round)."""
        if not (self.roster or self.walk):
            return True
        promised = len(self.roster) + sum(pages_for(len(o.tokens)) - len(o.pages.global_pages) for o in self.walk)
        free = self.book.glob.available  # idle cached pages count: a reservation evicts them
        return pages_for(len(w.tokens)) - len(w.pages.global_pages) + promised <= free

    def _walk_round(self) -> None:
        """One round: at most `chunk` prompt rows across the walkers (oldest arrival first), plus
        every live row. A walker short of pages takes them from younger page holders; with none
        younger it waits for a later round (older ones finish and free theirs), unless it is the
        only holder left, which means its prompt does not fit the pools at all."""
        self._ready_decode_rows()
        self.walk.sort(key=lambda w: w.req.arrival)  # stable: admission order among equals
        chunks = []
        if self.pace is None:
            budget = self.chunk
        else:  # ITL_TARGET_MS (and TTFT_TARGET_MS, which reads the queue's prompts too)
            queued = sum(len(r.prompt) for r in self.queue) if self.pace.horizon is not None else 0
            budget = self.pace.rows(self.walk, self.roster, queued)
        for w, take in plan_round(self.walk, budget):
            if w not in self.walk:  # preempted by an older walker of this round
                continue
            if self._make_room(w, w.done + take, self_ok=False):
                chunks.append((w, take))
            elif not self._holders(w) and not chunks:
                self._drop_walker(w, "error", self._never_fits(w))
        if chunks or self.roster:
            self._run(chunks, self.roster, budget)

    @staticmethod
    def _never_fits(w: Walker) -> str:
        return (f"the prompt needs {pages_for(len(w.tokens))} KV pages per pool, more than the pools hold "
                "with nothing running")

    def _drop_walker(self, w: Walker, reason: str, message: str = "") -> None:
        if w in self.walk:
            self.walk.remove(w)
        self._close(w.req, w.pages, len(w.resumed), reason, message)

    def _gather(self, newcomers: list, attempts: int) -> int:
        """Coincident prompts join the leader's mixed step while every rule holds."""
        rows = newcomers[0].rest  # the leader is never bounded
        while (self.queue and len(newcomers) < self.cfg.mix_max_prompts and rows < self.cfg.mix_gather_rows
               and len(newcomers) + len(self.roster) < self.slots and attempts < self.slots):
            f = self._pop()
            attempts += 1
            if not self._admissible(f):
                continue
            w = self._walker(f)
            if rows + w.rest > self.cfg.mix_gather_rows or not self.book.reserve(w.pages, len(w.tokens)):
                self._requeue(w)
                break
            rows += w.rest
            newcomers.append(w)
        return attempts

    def _admissible(self, req: Request) -> bool:
        """Cancelled requests retire; invalid ones are rejected (fail closed)."""
        if req.cancelled:
            done = self._preempted.pop(req.id, ([], None))[0]
            self.executor.release(req.id)
            req.status = Status.FINISHED
            self.metrics.finished[req.cancel_as] += 1  # a queued abort counts like a live one
            self._emit(req, Finished(req.id, self.clock(), reason=req.cancel_as, prompt_tokens=len(req.prompt),
                                     completion_tokens=len(done)))
            return False
        why = self._invalid(req)
        if why:
            self._reject(req, why)
            return False
        return True

    def _invalid(self, req: Request) -> str | None:
        if not req.prompt:
            return "empty prompts are not served"
        if req.max_tokens < 1:
            return f"max_tokens must be at least 1, got {req.max_tokens}"
        total = len(req.prompt) + req.max_tokens
        if total > self.cfg.max_context:
            return (f"maximum context length is {self.cfg.max_context} tokens, but the prompt contains "
                    f"{len(req.prompt)} tokens and max_tokens is {req.max_tokens}")
        bad = None
        if req.prompt and (min(req.prompt) < 0 or max(req.prompt) >= self.vocab_size):  # C speed; then find it
            bad = next(t for t in req.prompt if not 0 <= t < self.vocab_size)
        if bad is not None:
            return f"token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})"
        return None

