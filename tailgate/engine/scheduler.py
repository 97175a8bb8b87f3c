"""The scheduler: one engine iteration is schedule -> run -> settle, one forward pass each.

`schedule(now)` is the only decision point: it retires cancelled requests, lands the lane's
flight, runs an intake turn (or lets arrivals join a running walk), runs the walk's round
(every admitted prompt is a walker), gives live rows their pages (preempting where it must) and
returns a `StepPlan` (engine/plan.py) naming everything it decided. `step` then launches the
lane's flight if the plan names one, runs the plan's forward pass on the executor (the model
runner + sampler, or a fake in tests), and settles what it sampled (engine/settle.py); the pass
leaves a `StepRecord` in `step_log`. The rules live in modules of functions over this state:
admission.py (door, intake, walk joiners), preemption.py (pages taken back, the bound), walk.py
(rounds), lane.py (the side lane). Plain Python, no torch; `now` is always a parameter, so every timing rule is tested without sleeping.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Protocol

from ..config import DEFAULT_CHUNK, ServingConfig
from . import admission, endings, lane, preemption
from .door import make_door
from .metrics import EngineMetrics
from .pages import KVBook
from .plan import Segment, StepPlan, StepRecord
from .prefix import PrefixCache
from .prompt_logprobs import prompt_segment
from .request import Event, Finished, Rejected, Request, RowSample, Sampled, Status, row_sample
from .settle import settle_step
from .step_cost import WALK, MeteredExecutor, RoundBudget, StepCostModel
from .stop import resolve_max_tokens
from .walk import walk_round

log = logging.getLogger("tailgate.engine")
# Model steps kept in `Scheduler.step_log`: at ~10-50 ms a step, 256 cover the last few seconds,
# what a live view redraws from (one record is ~100 bytes).
STEP_LOG = 256


def step_kind(chunks: list, rows: list, chunked: bool) -> str:
    """A step's kind (on its record and each token): what its prompt rows were, beside what."""
    if not chunks:
        return "decode" if rows else "idle"
    if any(r.resumed for r, _ in chunks):
        return "recompute"
    if not rows:
        return "prefill"
    return "walk" if chunked else "mixed"


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
        self.queue: deque[Request] = deque()  # waiting, held, preempted: arrival order
        self.roster: list[Request] = []  # running: live decode rows
        self.walk: list[Request] = []  # walking: prompts mid-prefill under the chunked walk
        self.flight: tuple[Request, object] | None = None  # in flight: the lane's prefill
        self.chunk = config.mix_chunk_tokens
        self.lane = config.async_prefill is not None
        self.prefix = PrefixCache(config.prefix_cache, book) if config.prefix_cache else None
        self.metrics = EngineMetrics()
        # One step-cost model (engine/step_cost.py), fitted from every measured step, when anything
        # prices steps: ITL_TARGET_MS's walk budget and ADMIT_COALESCE_MS=auto's door read the same fit.
        self.costs = None
        if config.itl_target_ms is not None or config.ttft_target_ms is not None or config.admit_coalesce_ms == "auto":
            self.costs = StepCostModel()
            self.executor = MeteredExecutor(executor, self.costs, clock, self.metrics)
        self.door = make_door(config.admit_coalesce_ms, config.mix_max_prompts, config.mix_chunk_tokens, self.costs)
        # ITL_TARGET_MS: each walk round's prompt rows priced in seconds (engine/step_cost.py); the
        # target turns the walk on, capped by MIX_CHUNK_TOKENS only when that is set. Without it no
        # budget object exists.
        self.pace = None
        if config.itl_target_ms is not None or config.ttft_target_ms is not None:
            t = config.itl_target_ms
            ttft = config.ttft_target_ms
            self.pace = RoundBudget(
                WALK if t is None else None if t == "auto" else t / 1000,
                None if t is None else config.mix_chunk_tokens,  # the walk's width is its fallback below
                self.metrics,
                model=self.costs,
                fallback=config.mix_chunk_tokens or DEFAULT_CHUNK,
                horizon_s=None if ttft is None else ttft / 1000,
            )
            self.chunk = self.chunk or config.max_context  # the walk is on; its width is the budget's
        self.cancels_queued = False  # a request may have been cancelled while queued (Engine.abort)
        self.events: list[tuple[Request, Event]] = []  # not yet delivered
        self._iteration: list[Event] = []  # everything this iteration emitted (the step output)
        # The iteration being decided or run: the lane's leader sits in no container between the
        # plan and its launch, so the fatal path reads it here.
        self.planned: StepPlan | None = None
        # The plan of the iteration `step` is running, or ran last (what tests read of a step).
        self.last_plan: StepPlan | None = None
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
        """Requests holding a slot: the roster, the walkers and the flight (what the door counts)."""
        return len(self.roster) + len(self.walk) + (self.flight is not None)

    @property
    def held(self) -> int:
        return sum(1 for r in self.queue if r.held_at is not None)

    # ---- one iteration ----------------------------------------------------------------------
    def step(self, now: float | None = None) -> list[Event]:
        """schedule -> (launch the lane) -> one forward pass -> settle; returns what it emitted
        (its plan stays on `last_plan`)."""
        plan = self.last_plan = self.schedule(self.clock() if now is None else now)
        if plan.launch is not None:
            lane.launch(self, plan.launch)
        if plan.segments:
            t0 = self.clock()
            per_seg = self._execute(plan)
            settle_step(self, plan, per_seg, t0, self.clock())
        self.planned = None
        self.metrics.steps += 1
        self.deliver()
        out, self._iteration = self._iteration, []
        return out

    def schedule(self, now: float) -> StepPlan:
        """Decide this iteration (module doc). A walk in progress takes arrivals in; otherwise an
        intake turn admits walkers (or the lane's prompt); then the walk advances exactly one round
        and the live rows decode beside it."""
        plan = self.planned = StepPlan(at=now)
        endings.retire_cancelled(self, plan)
        if self.flight is not None and (self.flight[1].done() or not (self.roster or self.walk)):
            lane.land(self, plan, "done" if self.roster or self.walk else "idle")
        if self.walk:
            if self.flight is None and self.queue:
                admission.join_walk(self, plan, now)
        elif self.flight is None:  # intake stops while the lane has a prefill in flight
            admission.intake(self, plan, now)
        if self.walk:
            walk_round(self, plan)
        else:
            preemption.ready_rows(self, plan)
        self._shape(plan)
        return plan

    def _shape(self, plan: StepPlan) -> None:
        """The pass's segments: prompt chunks first (only a prompt's final chunk is sampled: it
        graduates with that token), then every live row's next token."""
        segs, samples = [], []
        for r, take in plan.chunks:
            toks, start, final = r.chunk(take)
            segs.append(prompt_segment(r, toks, start, final))
            if final:
                samples.append(row_sample(r, r.output))
        plan.rows = rows = list(self.roster)
        segs += [Segment([a.output[-1]], a.pages.frontier, a.pages) for a in rows]
        samples += [a.sample or self._decode_sample(a) for a in rows]
        plan.segments, plan.samples = segs, samples
        plan.kind = step_kind(plan.chunks, rows, chunked=bool(self.chunk))
        plan.why = plan.why or ("live rows decode" if rows else "nothing to run")
        if segs and self.costs is not None and self.costs.ready:  # the pass's price, scored when it is recorded
            plan.predicted_s = self.costs.predict(self.executor.features(segs))  # (a MeteredExecutor's)

    def _execute(self, plan: StepPlan) -> list:
        """Per segment: its Sampled, None (not sampled), or the exception that failed it."""
        try:
            outs = iter(self.executor.run(plan.segments, plan.samples))
            return [next(outs) if seg.sample else None for seg in plan.segments]
        except Exception as e:  # the forward pass failed: find the segment(s) that make it fail
            log.warning("a step of %d segments failed (%r); retrying them one by one", len(plan.segments), e)
            return self._run_alone(plan.segments, plan.samples)

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

    def record(self, plan: StepPlan, t0: float, t1: float) -> None:
        """The step's record in the log, with what its plan predicted it would take; a priced
        step's |predicted - took| / took goes to the metrics."""
        m, took, predicted = self.metrics, t1 - t0, plan.predicted_s
        if predicted is not None and took > 0:
            m.step_cost_error.observe(abs(predicted - took) / took)
            m.step_cost["predicted_s"] = predicted
        pre = m.preemptions
        self.step_log.append(
            StepRecord(
                self._step_seq,
                t0,
                took,
                plan.kind,
                len(plan.rows),
                plan.prompt_rows,
                len(plan.chunks),
                pre - self._preempted_seen,
                plan.budget,
                predicted,
            )
        )
        self._step_seq += 1
        self._preempted_seen = pre

    def deliver(self) -> None:
        """Hand pending events to their sinks now: after every model step and every landing, so
        a stream sees a token when it exists, not an iteration later."""
        out, self.events = self.events, []
        for req, ev in out:
            self._iteration.append(ev)
            if req.sink is not None and not req.sink_failed:
                try:
                    req.sink(ev)
                except Exception:  # one client's delivery must not kill the engine for all
                    log.exception("delivery to %s failed; cancelling it", req.id)
                    req.sink_failed = req.cancelled = True
                    self.cancels_queued = True  # it may sit in the queue (preempted): retire it there too

    # ---- rows and the one ending -----------------------------------------------------------
    def _decode_sample(self, r: Request) -> RowSample:
        rs = row_sample(r, r.output)
        if len(r.output) >= r.min_tokens:  # EOS suppression is over: the row's sample is fixed
            r.sample = rs
        return rs

    def end(self, r: Request, why: str, message: str = "", plan: StepPlan | None = None) -> None:
        """Every ending, wherever it is decided: `r` leaves its container (the roster or the walk;
        a queued request was popped and a lane flight cleared by the caller), its pages and
        sampler state go back, it is counted under `why`, and its stream is told: `Finished(why)`
        (stop, length, error, abort, ...), or `Rejected(message)` when `why` is "rejected" (a
        request that cannot be served). An ending decided while planning goes on `plan.finished`."""
        if r.status is Status.RUNNING:
            self.roster.remove(r)
        elif r.status is Status.WALKING and r in self.walk:  # (a prompt refused at intake never joined it)
            self.walk.remove(r)
        self.book.free(r.pages)
        self.executor.release(r.id)
        r.status = Status.FINISHED
        self.metrics.finished[why] += 1
        if self.pace is not None and why in ("stop", "length"):  # the loop the walk keeps up with
            self.pace.finished(r.walked, max(0, len(r.output) - 1))  # (the first token is the prefill's)
        if why == "rejected":
            ev = Rejected(r.id, self.clock(), reason=message)
        else:
            ev = Finished(
                r.id,
                self.clock(),
                reason=why,
                prompt_tokens=len(r.prompt),
                completion_tokens=len(r.output),
                message=message,
            )
        self.emit(r, ev)
        if plan is not None:
            plan.finished.append((r, why))

    def fail_all(self, message: str) -> None:
        """Fatal path: end every queued and live request with an error and deliver it."""
        endings.fail_all(self, message)

    def emit(self, req: Request, ev: Event) -> None:
        self.events.append((req, ev))
