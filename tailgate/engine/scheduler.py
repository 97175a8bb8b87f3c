"""The scheduler: queue, roster, intake turn with mixed admission and gather, decode rounds.

Plain Python, no torch. It decides who runs and with which pages, hands each step to an
executor (the model runner + sampler, or a fake in tests) and turns sampled tokens into events.
`now` is always a parameter, so the door and every timing rule are tested without sleeping.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from itertools import islice
from dataclasses import dataclass, field
from typing import Protocol

from ..config import ServingConfig
from .door import DoorView, make_door
from .prefix import PrefixCache
from .metrics import EngineMetrics
from .pages import KVBook, SeqPages, pages_for
from .plan import Segment, StepRecord
from .prompt_logprobs import PromptLogprobs, new_scores, prompt_segment
from .request import Event, Finished, Rejected, Request, RowSample, Sampled, Scheduled, Status, Token
from .stop import LENGTH, STOP, resolve_max_tokens, verdict
from .walk import Walker, plan_round

log = logging.getLogger("tailgate.engine")
# A request preempted this many times is taken last when pages must be freed (`_make_room`).
MAX_PREEMPTIONS = 2
# Model steps kept in `Scheduler.step_log`: at ~10-50 ms a step, 256 cover the last few seconds,
# what a live view redraws from (one record is ~100 bytes).
STEP_LOG = 256


class Executor(Protocol):
    def run(self, segments: list[Segment], rows: list[RowSample]) -> list[Sampled | Exception]:
        """One token per row in `rows` (an exception in place of a row whose sampling failed);
        raises when the forward pass itself fails."""

    def release(self, request_id: str) -> None: ...

    # With a side lane (ASYNC_PREFILL) only:
    def launch(self, segments: list[Segment], rows: list[RowSample]):
        """Start a prefill beside the live batch; returns a flight with `done() -> bool`."""

    def join(self, flight) -> list[Sampled | Exception]:
        """Wait for a flight; its sampled rows (raises when its forward pass failed)."""


@dataclass(eq=False)  # identity: the roster finds and removes this very row (field-wise eq was 20 % of a step)
class Active:
    req: Request
    pages: SeqPages
    queued_at: float
    scheduled_at: float
    output: list[int] = field(default_factory=list)
    last_at: float | None = None  # when its previous token was emitted
    # Its decode rows' sampling request, built once past min_tokens (nothing in it changes after:
    # the history it passes is this very output list). One per row per step was 6 % of a sim run.
    sample: RowSample | None = None


class Scheduler:
    def __init__(self, executor: Executor, book: KVBook, config: ServingConfig, vocab_size: int, clock=time.monotonic):
        if config.max_context is None:
            raise ValueError("ServingConfig.max_context must be settled against the model first")
        self.executor = executor
        self.book = book
        self.cfg = config
        self.slots = config.decode_slots
        self.vocab_size = vocab_size
        self.clock = clock
        self.queue: deque[Request] = deque()
        self.roster: list[Active] = []
        self.walk: list[Walker] = []  # prompts mid-prefill under the chunked walk, admission order
        self.chunk = config.mix_chunk_tokens
        self.lane = config.async_prefill is not None
        self.flight: tuple[Walker, object] | None = None  # the lane's prefill in flight
        self.door = make_door(config.admit_coalesce_ms, config.mix_max_prompts, config.mix_chunk_tokens)
        self.prefix = PrefixCache(config.prefix_cache, book) if config.prefix_cache else None
        self.metrics = EngineMetrics()
        # ITL_TARGET_MS: each walk round's prompt rows priced in seconds by a step-cost model fitted
        # from the steps themselves (engine/step_cost.py); the target turns the walk on, capped by
        # MIX_CHUNK_TOKENS only when that is set. Without it no budget object exists.
        self.pace = None
        if config.itl_target_ms is not None:
            from .step_cost import RoundBudget

            t = config.itl_target_ms
            self.pace = RoundBudget(None if t == "auto" else t / 1000, config.mix_chunk_tokens, self.metrics)
            self.chunk = self.chunk or config.max_context  # the walk is on; its width is the budget's
            self.executor = self.pace.metered(executor, clock)
        self._events: list[tuple[Request, Event]] = []  # not yet delivered
        self._iteration: list[Event] = []  # everything this iteration emitted (the step output)
        self._cause = ("decode", 0, 0)  # the running step's kind, prompt rows, prompts
        self._preempted: dict[str, tuple[list[int], float | None]] = {}  # id -> (output so far, last token time)
        self._passed: set[str] = set()  # queued ids the door has let through (`_door_open`)
        # The last STEP_LOG model steps (the step timeline); `_preempted_seen` is the preemption
        # count at the previous record, so each record says how many its planning took.
        self.step_log: deque[StepRecord] = deque(maxlen=STEP_LOG)
        self._step_seq = 0
        self._preempted_seen = 0

    # ---- intake -------------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        if not req.arrival:
            req.arrival = self.clock()
        resolve_max_tokens(req, self.cfg.max_context, self.cfg.default_max_tokens)
        req.status = Status.WAITING
        self.queue.append(req)
        if self.door is not None:
            self.door.observe_arrival(req.arrival)

    def has_work(self) -> bool:
        return bool(self.queue or self.roster or self.walk or self.flight)

    @property
    def running(self) -> int:
        """Requests holding a slot: the roster plus the walkers (what the door counts as active)."""
        return len(self.roster) + len(self.walk) + (self.flight is not None)

    @property
    def held(self) -> int:
        return sum(1 for r in self.queue if r.held_at is not None)

    def step(self, now: float | None = None) -> list[Event]:
        """One engine iteration: a walk in progress advances exactly one round; otherwise an
        intake turn (door permitting), then one decode round unless a walk just started (its
        first round carried the live rows)."""
        now = self.clock() if now is None else now
        self._retire_cancelled()
        if self.flight is not None and (self.flight[1].done() or not (self.roster or self.walk)):
            self._join()  # done, or the only work left: wait for it
        if self.walk:
            if self.flight is None and self.queue:
                self._join_walk(now)
            self._walk_round()
        else:
            if self.flight is None:  # intake stops while the lane has a prefill in flight
                self.intake_turn(now)
            if self.walk:
                self._walk_round()
            elif self.roster:
                self._decode_round()
        self.metrics.steps += 1
        self._deliver()
        out, self._iteration = self._iteration, []
        return out

    def _deliver(self) -> None:
        """Hand pending events to their sinks now. Called after every model step, not once per
        iteration: an iteration can run a mixed step and then a decode round, and a stream
        should see the first token when it exists, not one step later."""
        out, self._events = self._events, []
        for req, ev in out:
            self._iteration.append(ev)
            if req.sink is not None and not req.sink_failed:
                try:
                    req.sink(ev)
                except Exception:  # one client's delivery must not kill the engine for all
                    log.exception("delivery to %s failed; cancelling it", req.id)
                    req.sink_failed = req.cancelled = True

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
            for r in self.queue:
                if r.held_at is None:
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
        if w.scores is not None:  # every prompt row computed (its logprobs): none from the cache
            req.status = Status.WALKING
            return w
        req.status = Status.WALKING
        if self.prefix is not None:  # a prompt, or a recompute (its own pages too), resumes at its longest cached prefix
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
        budget = self.chunk if self.pace is None else self.pace.rows(self.walk, self.roster)  # ITL_TARGET_MS
        for w, take in plan_round(self.walk, budget):
            if w not in self.walk:  # preempted by an older walker of this round
                continue
            if self._make_room(w, w.done + take, self_ok=False):
                chunks.append((w, take))
            elif not self._holders(w) and not chunks:
                self._drop_walker(w, "error", self._never_fits(w))
        if chunks or self.roster:
            self._run(chunks, self.roster)

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

    # ---- steps --------------------------------------------------------------------------
    def _ready_decode_rows(self) -> bool:
        """Give every live row a page for its next token, oldest arrival first; returns whether
        anyone was preempted for it (`_make_room`). A row that is the only page holder and still
        cannot grow does not fit the pools alone, and fails."""
        preempted = self.metrics.preemptions
        # Only rows at the end of their last page need one (1 step in 16): the sort stays off most steps.
        full = [a for a in self.roster if a.pages.frontier >= a.pages.reserved]
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
        walker waits. A lane flight in the way is joined first. Returns whether it got the pages."""
        while not self.book.reserve(holder.pages, total):
            others = self._holders(holder)
            younger = [h for h in others if h.req.arrival > holder.req.arrival
                       or (h.req.arrival == holder.req.arrival and self._admitted_after(h, holder))]
            if younger:
                self._preempt(max(younger, key=lambda h: (h.req.preemptions < MAX_PREEMPTIONS, h.req.arrival)))
            elif self.flight is not None:
                self._join()
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

    def _decode_round(self) -> None:
        self._ready_decode_rows()
        if self.roster:
            self._run([], self.roster)

    def _run(self, chunks: list[tuple[Walker, int]], rows: list[Active]) -> None:
        """One forward pass: prompt chunks first (a whole prompt is one chunk), then every live
        row's next token. Only a prompt's final chunk is sampled: a walker graduates into the
        roster with that token; earlier chunks only fill KV."""
        rows = list(rows)
        segs, samples = [], []
        for w, take in chunks:
            toks, start, final = w.chunk(take)
            segs.append(prompt_segment(w, toks, start, final))
            if final:
                samples.append(self._row_sample(w.req, w.resumed))
        segs += [Segment([a.output[-1]], a.pages.frontier, a.pages) for a in rows]
        samples += [a.sample or self._decode_sample(a) for a in rows]
        m = self.metrics
        prompt_rows = sum(take for _, take in chunks)
        kind = "decode" if not chunks else "recompute" if any(w.resumed for w, _ in chunks) else \
            "prefill" if not rows else "walk" if self.chunk else "mixed"
        self._cause = (kind, prompt_rows, len(chunks))
        if chunks:
            m.prefill_rows.observe(prompt_rows)
        if rows:
            m.decode_rows.observe(len(rows))
        t0 = self.clock()
        try:
            outs = iter(self.executor.run(segs, samples))
            per_seg = [next(outs) if seg.sample else None for seg in segs]
        except Exception as e:  # the forward pass failed: find the segment(s) that make it fail
            log.warning("a step of %d segments failed (%r); retrying them one by one", len(segs), e)
            per_seg = self._run_alone(segs, samples)
        now = self.clock()
        self._record(t0, now, kind, len(rows), prompt_rows, len(chunks))
        if self.door is not None:
            self.door.observe_step(now - t0, prompt_rows, len(rows))
        for (w, take), out in zip(chunks, per_seg):
            self._absorb(w, take, out, now)
        self._settle(rows, per_seg[len(chunks):], now, advance=True)
        self._deliver()

    def _record(self, t0: float, t1: float, kind: str, decode_rows: int, prompt_rows: int, prompts: int) -> None:
        pre = self.metrics.preemptions
        self.step_log.append(StepRecord(self._step_seq, t0, t1 - t0, kind, decode_rows, prompt_rows, prompts,
                                        pre - self._preempted_seen))
        self._step_seq += 1
        self._preempted_seen = pre

    def _absorb(self, w: Walker, take: int, out, now: float) -> None:
        """A prompt chunk's KV is written: advance the walker; its final chunk's token (`out`)
        graduates it into the roster. An exception in `out` fails this prompt alone."""
        if isinstance(out, Exception):  # only this prompt fails; its pages return
            self._drop_walker(w, "error", f"step failed: {out}")
            return
        final = w.done + take == len(w.tokens)
        # The prefix cache registers the full pages just written before the window releases any
        # sliding page, so a released one stays idle for a later resume instead of going free.
        self.book.advance(w.pages, take, release=self.prefix is None)
        if self.prefix is not None:
            self.prefix.written(w.tokens, len(w.req.prompt), w.req.id, w.pages, final)
            self.book.advance(w.pages, 0)
        w.done += take
        self.metrics.prompt_tokens += take
        if not final:
            return
        if w in self.walk:
            self.walk.remove(w)
        if w.scores is not None:  # the prompt's logprobs go out ahead of its first token
            self._emit(w.req, PromptLogprobs(w.req.id, now, w.scores))
        a = Active(w.req, w.pages, queued_at=w.req.arrival, scheduled_at=now, output=list(w.resumed),
                   last_at=w.last_at)
        self.roster.append(a)  # graduates; _settle takes it out again if this token ends it
        w.req.status = Status.RUNNING
        self._settle((a,), (out,), now)

    # ---- the side lane --------------------------------------------------------------------
    def _launch(self, w: Walker) -> None:
        """An admission into a live roster prefills its whole prompt on the lane. Its pages are
        already reserved (by the intake turn), so nothing is reallocated under the lane's writes;
        the sliding window's release waits for the join (advance runs there)."""
        req = w.req
        self._announce([w])
        toks, start, _ = w.chunk(len(w.tokens) - w.done)
        try:
            flight = self.executor.launch([prompt_segment(w, toks, start, True)],
                                          [self._row_sample(req, w.resumed)])
        except Exception as e:  # the lane could not start: this request fails, nothing else
            self._close(req, w.pages, len(w.resumed), "error", f"side lane failed to start: {e}")
            return
        self.flight = (w, flight)
        req.status = Status.IN_FLIGHT
        self.metrics.lane_prefills += 1
        self.metrics.prefill_rows.observe(len(toks))

    def _join(self) -> None:
        """Wait for the lane's prefill; then its first token, exactly as a synchronous prefill's."""
        w, flight = self.flight
        self.flight = None
        t0 = self.clock()
        try:
            out = self.executor.join(flight)[0]
        except Exception as e:
            out = e
        if w.req.cancelled:  # cancelled while in flight: its pages come back only now
            self._close(w.req, w.pages, len(w.resumed), w.req.cancel_as, "")
        else:
            self._cause = ("lane", len(w.tokens) - w.done, 1)
            self._record(t0, self.clock(), "lane", 0, len(w.tokens) - w.done, 1)  # the wait the engine saw
            self._absorb(w, len(w.tokens) - w.done, out, self.clock())
        self._deliver()

    def _run_alone(self, segs: list[Segment], samples: list) -> list:
        """Each segment in a step of its own (rewriting the same KV slots the failed step wrote):
        per segment its Sampled, None (not sampled), or the exception that failed it."""
        sample_of = iter(samples)
        out = []
        for seg in segs:
            smp = [next(sample_of)] if seg.sample else []
            try:
                got = self.executor.run([seg], smp)
                out.append(got[0] if smp else None)
            except Exception as e:
                out.append(e)
        return out

    def _row_sample(self, req: Request, output: list[int]) -> RowSample:
        p = req.params
        suppress = ()
        if len(output) < req.min_tokens:
            suppress = tuple(req.stop_token_ids) + (() if req.ignore_eos else tuple(req.eos_ids))
        penal = p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0
        return RowSample(req.id, p, suppress, req.logprobs, req.prompt if penal else None, output if penal else None)

    def _decode_sample(self, a: Active) -> RowSample:
        rs = self._row_sample(a.req, a.output)
        if len(a.output) >= a.req.min_tokens:  # EOS suppression is over: the row's sample is fixed
            a.sample = rs
        return rs

    def _settle(self, rows, outs, now: float, advance: bool = False) -> None:
        """Apply one sampled token to each row, produced by the step that ended at `now` (every row
        of a step is stamped with the same time); with `advance`, each row's KV frontier moves past
        the token it fed. A row whose sampling failed, or whose token ends it, leaves the roster.
        One loop for the whole step, its lookups hoisted: this runs once per token (most of a
        simulated run)."""
        kind, prompt_rows, prompts = self._cause
        book, events, m = self.book, self._events, self.metrics
        gaps, emitted = [], 0
        for a, out in zip(rows, outs):
            if isinstance(out, Exception):
                self._finish(a, "error", f"step failed: {out}")
                continue
            if advance:
                book.advance(a.pages, 1)
            req, t = a.req, out.token
            end = verdict(req, t, len(a.output))
            if end is STOP:
                self._finish(a, STOP)  # the stop token itself is not emitted
                continue
            a.output.append(t)
            emitted += 1
            gap = None if a.last_at is None else now - a.last_at
            if gap is not None:
                gaps.append(gap)
            a.last_at = now
            events.append((req, Token(req.id, now, t, out.logprob, out.top_logprobs, kind, prompt_rows, prompts, gap,
                                      end)))
            if end is LENGTH:
                self._finish(a, LENGTH)
        m.generation_tokens += emitted
        if gaps:
            m.gaps(kind).observe_all(gaps)

    def _finish(self, a: Active, reason: str, message: str = "") -> None:
        if a in self.roster:
            self.roster.remove(a)
        self._close(a.req, a.pages, len(a.output), reason, message)

    def _close(self, req: Request, pages: SeqPages, completion_tokens: int, reason: str, message: str) -> None:
        """Return a request's pages and sampler state, count it, and tell its stream why it ended."""
        self.book.free(pages)
        self.executor.release(req.id)
        req.status = Status.FINISHED
        self.metrics.finished[reason] += 1
        self._emit(req, Finished(req.id, self.clock(), reason=reason, prompt_tokens=len(req.prompt),
                                 completion_tokens=completion_tokens, message=message))

    def fail_all(self, message: str) -> None:
        """Fatal path: finish every queued and live request with an error and deliver it."""
        if self.flight is not None:  # its pages come back only once the lane worker stops writing them
            w, flight = self.flight
            self.flight = None
            try:
                self.executor.join(flight)
            except Exception:
                pass  # it failed too: its pages are still not written any more
            self._close(w.req, w.pages, len(w.resumed), "error", message)
        for a in list(self.roster):
            self._finish(a, "error", message)
        for w in list(self.walk):
            self._drop_walker(w, "error", message)
        while self.queue:
            r = self._pop()
            r.status = Status.FINISHED
            self._emit(r, Finished(r.id, self.clock(), reason="error", prompt_tokens=len(r.prompt), message=message))
        self._deliver()

    def _retire_cancelled(self) -> None:
        for a in [a for a in self.roster if a.req.cancelled]:
            self._finish(a, a.req.cancel_as)  # pages return at once
        for w in [w for w in self.walk if w.req.cancelled]:
            self._drop_walker(w, w.req.cancel_as)

    def _reject(self, req: Request, why: str) -> None:
        req.status = Status.FINISHED
        self.metrics.finished["rejected"] += 1
        self._emit(req, Rejected(req.id, self.clock(), reason=why))

    def _emit(self, req: Request, ev: Event) -> None:
        self._events.append((req, ev))
