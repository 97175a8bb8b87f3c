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

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)
