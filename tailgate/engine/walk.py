"""The chunked walk (TAILGATE_MIX_CHUNK_TOKENS): prompts enter a live batch N rows per step.

Without it an admission is one whole-prompt step, and every live stream's inter-token gap pays
the whole prompt (a 1024-token prompt is ~2.5 s of one step on the 2-core EPYC). With it, the
gathered prompts ("walkers") advance in rounds: each round spreads at most N prompt rows over
the walkers in admission order, reserves only the pages that round writes, and rides the live
decode rows. One round runs per engine iteration, so live streams get a token between rounds and
a stall is bounded by one N-row step. Plain data, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .pages import SeqPages
from .request import Request


@dataclass(eq=False)  # identity, as Active
class Walker:
    """A prompt mid-prefill: `done` of its rows have run (and hold pages). `resumed` is the output
    a preempted request had already emitted: it is recomputed after the prompt, not re-emitted."""

    req: Request
    pages: SeqPages
    done: int = 0
    resumed: list[int] = field(default_factory=list)
    last_at: float | None = None  # a resumed stream's previous token time (its gap spans the preemption)
    cached: int = 0  # prompt tokens whose KV came from the prefix cache (done starts there)
    scores: list | None = None  # its prompt logprobs by position, when asked (engine/prompt_logprobs.py)
    tokens: list[int] = field(init=False)  # what the walk prefills: the prompt, then any resumed output

    def __post_init__(self):
        self.tokens = self.req.prompt + self.resumed if self.resumed else self.req.prompt

    @property
    def rest(self) -> int:
        return len(self.tokens) - self.done

    def chunk(self, take: int) -> tuple[list[int], int, bool]:
        """(tokens, start position, whether this chunk ends the sequence) for the next `take` rows."""
        end = self.done + take
        return self.tokens[self.done:end], self.done, end == len(self.tokens)


def plan_round(walkers: list[Walker], budget: int) -> list[tuple[Walker, int]]:
    """Spread `budget` prompt rows over the walkers in admission order: each takes what it has
    left, up to what the budget has left; later walkers wait for a later round."""
    out = []
    for w in walkers:
        if budget <= 0:
            break
        take = min(w.rest, budget)
        if take > 0:
            out.append((w, take))
            budget -= take
    return out
