"""ModelExecutor: the scheduler's executor backed by the real runner and sampler."""

from __future__ import annotations

import torch

from ...engine.plan import Segment
from ...engine.request import RowSample, Sampled
from .lane import CpuLane, LaneJob
from .prompt_scores import scoring
from ..constraint import Constraint, apply_masks, new_masks
from .runner import ModelRunner
from .sampler import apply_penalties, make_generator, sample


class Flight:
    """A prefill on the side lane and the rows to sample when it joins."""

    def __init__(self, job: LaneJob, rows: list[RowSample]):
        self.job, self.rows = job, rows

    def done(self) -> bool:
        return self.job.done()


class ModelExecutor:
    def __init__(self, runner: ModelRunner, lane_threads: int | None = None):
        self.runner = runner
        # Greedy rows' argmax through csrc/argmax.c where the plan runs our kernels (a runner
        # without a plan, a test's fake, samples with torch).
        plan = getattr(runner, "plan", None)
        self.native_argmax = plan is not None and plan.native
        # Prompt logprobs (model/runtime/prompt_scores.py): the rows of a segment that asks are scored and
        # dropped inside the step, so what follows sees one row per sampled segment, as always.
        self._step = scoring(runner)
        self._gens: dict[str, torch.Generator] = {}
        # Grammar positions of the live constrained requests (structured outputs): empty unless a
        # request asked, and then `run` computes their masks while the forward pass runs.
        self._constraints: dict[str, Constraint] = {}
        self._mask_worker = None  # one thread, made at the first constrained step
        self.lane = CpuLane(lane_threads, self._step) if lane_threads else None

    @torch.inference_mode()  # the step's logits are inference tensors: edits must happen in the mode too
    def run(self, segments: list[Segment], rows: list[RowSample]) -> list[Sampled | Exception]:
        """One forward pass and one token per sampled row. A row whose sampling raises (its own
        knobs or history) gets its exception in its place; the other rows are unaffected. A failing
        forward pass raises: the scheduler retries its segments one by one."""
        if not self._constraints:  # no constrained request is live: nothing more than before
            return self._sample_isolated(self._step(segments), rows)
        # The masks of this step's constrained rows (their matchers took last step's tokens) are
        # computed on a worker while the forward pass runs: llguidance and torch both drop the GIL.
        pending = self._start_masks(rows)
        try:
            logits = self._step(segments)
        finally:
            masks = pending.result() if pending is not None else None
        return self._sample_isolated(logits, rows, masks)

    def _start_masks(self, rows: list[RowSample]):
        live = [(r.request_id, c) for r in rows if (c := self._constraints.get(r.request_id)) is not None]
        if not live:
            return None
        if self._mask_worker is None:
            from concurrent.futures import ThreadPoolExecutor

            self._mask_worker = ThreadPoolExecutor(1, thread_name_prefix="tailgate-mask")

        def fill():
            out = {}
            for rid, c in live:
                out[rid] = m = new_masks(1, c.book.vocab_size)
                c.fill(m[0])
            return out

        return self._mask_worker.submit(fill)

    def launch(self, segments: list[Segment], rows: list[RowSample]) -> Flight:
        """Start a prefill on the side lane; the engine thread goes on stepping."""
        if self.lane is None:
            raise RuntimeError("this executor has no side lane")
        return Flight(self.lane.launch(segments), rows)

    @torch.inference_mode()
    def join(self, flight: Flight) -> list[Sampled | Exception]:
        """Wait for a lane prefill (raising its error), then sample its rows here, on the engine
        thread, as `run` would have."""
        return self._sample_isolated(flight.job.logits(), flight.rows)

    def _sample_isolated(
        self, logits: torch.Tensor, rows: list[RowSample], masks: dict | None = None
    ) -> list[Sampled | Exception]:
        ids = {r.request_id for r in rows}
        states = {rid: g.get_state() for rid, g in self._gens.items() if rid in ids}
        try:
            return self._sample(logits, rows, masks)
        except Exception:  # find the row(s): each alone, every generator back where it was
            # (a grammar moves only after every row drew, so no matcher has moved yet)
            for rid in ids - states.keys():
                self._gens.pop(rid, None)
            for rid, st in states.items():
                self._gens[rid].set_state(st)
            out = []
            for i, r in enumerate(rows):
                try:
                    out.append(self._sample(logits[i : i + 1], [r], masks)[0])
                except Exception as e:
                    out.append(e)
            return out

    def _sample(self, logits: torch.Tensor, rows: list[RowSample], masks: dict | None = None) -> list[Sampled]:
        params = [r.params for r in rows]
        # Logprobs are the step's own distribution, before penalties, logit_bias, the grammar's
        # mask and min_tokens' mask: vLLM's default (`logprobs_mode="raw_logprobs"`, computed
        # before any logits processor).
        raw = logits
        edited, held = {}, []
        for i, r in enumerate(rows):
            p = r.params
            if r.suppress or r.prompt is not None or p.grammar is not None or p.logit_bias:
                x = logits[i].float().clone()  # a copy: `raw` keeps the step's own logits
                if r.prompt is not None:
                    x = apply_penalties(x, p, r.prompt, r.output or [])
                if p.logit_bias:
                    ids, bias = zip(*p.logit_bias)
                    x[list(ids)] += torch.tensor(bias, dtype=x.dtype)
                if p.grammar is not None:
                    c = self._constraint(r)
                    m = masks.get(r.request_id) if masks else None
                    if m is None:  # its first token (after its prompt), or a lane join: computed here
                        m = new_masks(1, c.book.vocab_size)
                        c.fill(m[0])
                    apply_masks(x[None], m)
                    held.append((i, c))
                if r.suppress:
                    x[list(r.suppress)] = float("-inf")
                edited[i] = x
        if edited:
            logits = logits.float().clone()
            for i, x in edited.items():
                logits[i] = x
        gens = []
        for r in rows:
            if r.params.greedy:
                gens.append(None)
                continue
            if r.request_id not in self._gens:
                self._gens[r.request_id] = make_generator(r.params.seed)
            gens.append(self._gens[r.request_id])
        tokens = sample(logits, params, gens, native=self.native_argmax)
        out = []
        for i, (r, t) in enumerate(zip(rows, tokens)):
            if r.logprobs is None:
                out.append(Sampled(t))
                continue
            lp = torch.log_softmax(raw[i].float(), -1)
            top = None
            if r.logprobs > 0:
                v, idx = lp.topk(r.logprobs)
                top = list(zip(idx.tolist(), v.tolist()))
            out.append(Sampled(t, float(lp[t]), top))
        for i, c in held:  # every row drew: now the grammars move (a failure is that row's alone)
            try:
                out[i].done = c.advance(out[i].token)
            except Exception as e:
                out[i] = e
        return out

    def _constraint(self, r: RowSample) -> Constraint:
        c = self._constraints.get(r.request_id)
        if c is None:
            c = self._constraints[r.request_id] = r.params.grammar.start()
        return c

    def release(self, request_id: str) -> None:
        self._gens.pop(request_id, None)
        self._constraints.pop(request_id, None)

    def close(self) -> None:
        if self.lane is not None:
            self.lane.close()
        if self._mask_worker is not None:
            self._mask_worker.shutdown(wait=True)
