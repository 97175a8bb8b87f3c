"""The step plan: plain data the scheduler hands to the runner."""
from __future__ import annotations

from dataclasses import dataclass

from .pages import SeqPages


@dataclass(slots=True)  # one per row per step
class Segment:
    """Tokens of one sequence to run in this step, starting at absolute position `start`.

    A prefill segment carries a whole prompt or its next chunk; a decode row carries one token.
    `sample` asks for the logits of the segment's last row.
    """

    tokens: list[int]
    start: int
    pages: SeqPages
    sample: bool = True
    all_logits: bool = False  # logits for every row (teacher forcing, prompt logprobs)
    score: object = None  # engine/prompt_logprobs.PromptScore: the executor scores these rows' logits

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True, slots=True)  # one per model step; immutable, so readers on other threads share it
class StepRecord:
    """What one model step was, after it ran: the engine's step timeline (the dashboard's bars,
    `EngineSnapshot.steps`). `seq` counts model steps from 0, so a reader can ask for the ones it
    has not seen yet."""

    seq: int
    at: float  # engine clock when the step started
    duration_s: float
    kind: str  # decode | mixed | walk | prefill | recompute | lane
    decode_rows: int
    prompt_rows: int
    prompts: int
    preempted: int = 0  # requests preempted while this step was planned

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}
