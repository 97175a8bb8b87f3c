"""The scheduler: one engine iteration as plan -> execute -> settle, over the queue, the roster
(live decode rows), the walk (prompts mid-prefill) and the side lane's flight.

Plain Python, no torch. Each model step is decided as a `StepPlan` (engine/plan.py: which prompt
rows of whom, which live rows, under what budget), handed to an executor (the model runner +
sampler, or a fake in tests), and its sampled tokens settled into events; it leaves a
`StepRecord` in `step_log`. Who gets in is `admission.py`'s (door, intake, gather, walkers); who
gives pages back is `preemption.py`'s. `now` is always a parameter, so the door and every timing
rule are tested without sleeping.
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from ..config import ServingConfig
from .door import make_door
from .prefix import PrefixCache
from .metrics import EngineMetrics
from .pages import KVBook, SeqPages
from .plan import Segment, StepPlan, StepRecord
from .prompt_logprobs import PromptLogprobs, prompt_segment
from .request import Event, Finished, Rejected, Request, RowSample, Sampled, Status, Token
from .stop import LENGTH, STOP, resolve_max_tokens, verdict
from .walk import Walker
from .admission import Admission
from .preemption import Preemption

log = logging.getLogger("tailgate.engine")
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


class Scheduler(Admission, Preemption):
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
            ttft = config.ttft_target_ms
            self.pace = RoundBudget(None if t == "auto" else t / 1000, config.mix_chunk_tokens, self.metrics,
                                    horizon_s=None if ttft is None else ttft / 1000)
            self.chunk = self.chunk or config.max_context  # the walk is on; its width is the budget's
            self.executor = self.pace.metered(executor, clock)
        self.cancels_queued = False  # a request may have been cancelled while queued (Engine.abort)
        self._events: list[tuple[Request, Event]] = []  # not yet delivered
        self._iteration: list[Event] = []  # everything this iteration emitted (the step output)
        self._current = StepPlan("decode", [], [], [], [])  # the step being settled (its kind goes on each token)
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

    # ---- steps --------------------------------------------------------------------------
    def _decode_round(self) -> None:
        self._ready_decode_rows()
        if self.roster:
            self._run([], self.roster)

    def _run(self, chunks: list[tuple[Walker, int]], rows: list[Active], budget: int | None = None) -> None:
        """One model step: plan it, execute it, settle what it sampled."""
        plan = self._plan(chunks, list(rows), budget)
        t0 = self.clock()
        per_seg = self._execute(plan)
        self._settle_step(plan, per_seg, t0, self.clock())

    def _plan(self, chunks: list[tuple[Walker, int]], rows: list[Active], budget: int | None) -> StepPlan:
        """Prompt chunks first (a whole prompt is one chunk), then every live row's next token.
        Only a prompt's final chunk is sampled: a walker graduates into the roster with that token;
        earlier chunks only fill KV."""
        segs, samples = [], []
        for w, take in chunks:
            toks, start, final = w.chunk(take)
            segs.append(prompt_segment(w, toks, start, final))
            if final:
                samples.append(self._row_sample(w.req, w.resumed))
        segs += [Segment([a.output[-1]], a.pages.frontier, a.pages) for a in rows]
        samples += [a.sample or self._decode_sample(a) for a in rows]
        kind = "decode" if not chunks else "recompute" if any(w.resumed for w, _ in chunks) else \
            "prefill" if not rows else "walk" if self.chunk else "mixed"
        return StepPlan(kind, chunks, rows, segs, samples, budget)

    def _execute(self, plan: StepPlan) -> list:
        """Per segment: its Sampled, None (not sampled), or the exception that failed it."""
        try:
            outs = iter(self.executor.run(plan.segments, plan.samples))
            return [next(outs) if seg.sample else None for seg in plan.segments]
        except Exception as e:  # the forward pass failed: find the segment(s) that make it fail
            log.warning("a step of %d segments failed (%r); retrying them one by one", len(plan.segments), e)
            return self._run_alone(plan.segments, plan.samples)

    def _settle_step(self, plan: StepPlan, per_seg: list, t0: float, now: float) -> None:
        """Count and record the step, then apply its results: written prompt chunks advance their
        walkers (a final one graduates with its token), every live row takes its token."""
        m, rows, prompt_rows = self.metrics, plan.rows, plan.prompt_rows
        if plan.chunks:
            m.prefill_rows.observe(prompt_rows)
        if rows:
            m.decode_rows.observe(len(rows))
        self._record(plan, t0, now)
        if self.door is not None:
            self.door.observe_step(now - t0, prompt_rows, len(rows))
        for (w, take), out in zip(plan.chunks, per_seg):
            self._absorb(w, take, out, now)
        self._settle(rows, per_seg[len(plan.chunks):], now, advance=True)
        self._deliver()

    def _record(self, plan: StepPlan, t0: float, t1: float) -> None:
        """The step's record in the log; from here on `plan` is what tokens are attributed to."""
        self._current = plan
        pre = self.metrics.preemptions
        self.step_log.append(StepRecord(self._step_seq, t0, t1 - t0, plan.kind, len(plan.rows), plan.prompt_rows,
                                        len(plan.chunks), pre - self._preempted_seen, plan.budget,
                                        getattr(self.executor, "last_predicted", None)))
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
            take = len(w.tokens) - w.done
            self._record(StepPlan("lane", [(w, take)], [], [], []), t0, self.clock())  # the wait the engine saw
            self._absorb(w, take, out, self.clock())
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
        plan = self._current
        kind, prompt_rows, prompts = plan.kind, plan.prompt_rows, len(plan.chunks)
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
            elif out.done:  # its grammar is complete (structured outputs): nothing but EOS may follow
                self._finish(a, STOP)
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
        if self.cancels_queued:  # set by Engine.abort: a queued request retires now, not at the queue head
            self.cancels_queued = False
            dead = [r for r in self.queue if r.cancelled]
            if dead:
                self.queue = deque(r for r in self.queue if not r.cancelled)
                for r in dead:
                    self._passed.discard(r.id)
                    if r.held_at is not None:
                        self.metrics.door_hold.observe(self.clock() - r.held_at)
                        r.held_at = None
                    self._admissible(r)  # a cancelled request is never admissible: it finishes here

    def _reject(self, req: Request, why: str) -> None:
        req.status = Status.FINISHED
        self.metrics.finished["rejected"] += 1
        self._emit(req, Rejected(req.id, self.clock(), reason=why))

    def _emit(self, req: Request, ev: Event) -> None:
        self._events.append((req, ev))
