"""ModelExecutor: the scheduler's executor backed by the real runner and sampler."""
from __future__ import annotations

import torch

from ..engine.plan import Segment
from ..engine.request import RowSample, Sampled
from .lane import CpuLane, LaneJob
from .prompt_scores import scoring
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
        # Prompt logprobs (model/prompt_scores.py): the rows of a segment that asks are scored and
        # dropped inside the step, so what follows sees one row per sampled segment, as always.
        self._step = scoring(runner)
        self._gens: dict[str, torch.Generator] = {}
        self.lane = CpuLane(lane_threads, self._step) if lane_threads else None

    @torch.inference_mode()  # the step's logits are inference tensors: edits must happen in the mode too
    def run(self, segments: list[Segment], rows: list[RowSample]) -> list[Sampled | Exception]:
        """One forward pass and one token per sampled row. A row whose sampling raises (its own
        knobs or history) gets its exception in its place; the other rows are unaffected. A failing
        forward pass raises: the scheduler retries its segments one by one."""
        return self._sample_isolated(self._step(segments), rows)

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

    def _sample_isolated(self, logits: torch.Tensor, rows: list[RowSample]) -> list[Sampled | Exception]:
        ids = {r.request_id for r in rows}
        states = {rid: g.get_state() for rid, g in self._gens.items() if rid in ids}
        try:
            return self._sample(logits, rows)
        except Exception:  # find the row(s): each alone, every generator back where it was
            for rid in ids - states.keys():
                self._gens.pop(rid, None)
            for rid, st in states.items():
                self._gens[rid].set_state(st)
            out = []
            for i, r in enumerate(rows):
                try:
                    out.append(self._sample(logits[i:i + 1], [r])[0])
                except Exception as e:
                    out.append(e)
            return out

    def _sample(self, logits: torch.Tensor, rows: list[RowSample]) -> list[Sampled]:
        params = [r.params for r in rows]
        # Logprobs are the step's own distribution, before penalties and min_tokens' mask: vLLM's
        # default (`logprobs_mode="raw_logprobs"`, computed before any logits processor).
        raw = logits
        edited = {}
        for i, r in enumerate(rows):
            if r.suppress or r.prompt is not None:
                x = logits[i].float()
                if r.prompt is not None:
                    x = apply_penalties(x, r.params, r.prompt, r.output or [])
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
        tokens = sample(logits, params, gens)
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
        return out

    def release(self, request_id: str) -> None:
        self._gens.pop(request_id, None)

    def close(self) -> None:
        if self.lane is not None:
            self.lane.close()
