"""Prompt logprobs (completions' `echo` + `logprobs`, vLLM's `prompt_logprobs`): what the scheduler
asks of the executor and what it hands back. Plain data, no torch (model/runtime/prompt_scores.py scores).

A request that asks prefills every prompt row itself (no prefix-cache pages: a cached row has no
logits) with each chunk's segment marked `all_logits` and carrying a `PromptScore`; the executor
fills the request's `scores` by position, so a chunk run twice (a failed step retried alone) or a
walk restarted after a preemption writes the same slots again. When the prompt's last chunk is
absorbed the scheduler emits one `PromptLogprobs` event, before the request's first token.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import Segment
from .request import Event


@dataclass(slots=True)
class PromptLogprobs(Event):
    """entries[i] is (logprob, rank, top) of prompt token i + 1 given the tokens before it (the
    first prompt token has none); top is [(token, logprob)] of the k most likely, k as asked."""

    entries: list | None = None


@dataclass(slots=True)
class PromptScore:
    """Score the segment's rows: row j predicts `targets[j]` (rows past the prompt's last token
    predict the completion and are not scored); results go to `sink[first + j]`."""

    targets: list[int]
    k: int
    sink: list
    first: int


def new_scores(req, resumed: list[int]) -> list | None:
    """The slots of a walker whose request asks for prompt logprobs, else None. A recompute after
    the first token (`resumed`) has delivered them already."""
    if req.prompt_logprobs is None or resumed:
        return None
    return [None] * max(0, len(req.prompt) - 1)


def prompt_segment(w, toks: list[int], start: int, sample: bool) -> Segment:
    """The segment of request `w`'s chunk `toks` at `start`, scored when the walker asks."""
    if w.scores is None:
        return Segment(toks, start, w.pages, sample=sample)
    prompt = w.prompt
    targets = prompt[start + 1 : min(start + len(toks), len(prompt) - 1) + 1]
    return Segment(
        toks,
        start,
        w.pages,
        sample=sample,
        all_logits=True,
        score=PromptScore(targets, w.prompt_logprobs, w.scores, start),
    )
