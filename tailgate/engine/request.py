"""Requests and the events the engine emits about them (plain data, no torch).

A `Request` is the one object the engine keeps per request (vLLM v1's Request, nano-vllm's
Sequence): what the client asked, then where it is (`status`), its KV pages, and its progress,
counted once: `computed` is its page table's frontier, the tokens whose KV is written.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

from .pages import SeqPages

_ids = itertools.count()
GREEDY_BELOW = 1e-5


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 or -1 = off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Set only on the rows that ask, so the executor's per-row test is one attribute each:
    grammar: object = None  # model.constraint.Grammar: the token mask (structured outputs, forced tool calls)
    logit_bias: tuple = ()  # ((token id, bias), ...): added to this row's logits before sampling

    @property
    def greedy(self) -> bool:
        # vLLM's rule: below 1e-5 a temperature is greedy (dividing logits by it would overflow).
        return self.temperature < GREEDY_BELOW or self.top_k == 1


class Status(str, Enum):
    """Where a request is, in one word (`Request.status`); the scheduler sets it at every move, so
    the structure that holds a request and its status always agree (tests/test_scheduler_random.py).

    waiting -> [held -> waiting] -> walking (its prompt is being prefilled: a walker, or a newcomer
    in a mixed step) | in_flight (prefilling on the side lane) -> running (decoding in the roster)
    -> finished. A running or walking request whose pages are taken back goes to `preempted`
    (waiting in the queue to be recomputed, ahead of later arrivals), then walks again.

    Where each status lives: waiting, held, preempted in `Scheduler.queue`; walking in
    `Scheduler.walk`; in_flight in `Scheduler.flight`; running in `Scheduler.roster`."""

    WAITING = "waiting"
    HELD = "held"  # at the admission door
    WALKING = "walking"
    IN_FLIGHT = "in_flight"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"


@dataclass(eq=False)  # identity: queues and the roster find and remove this very request
class Request:
    prompt: list[int]
    # None: the engine decides (Scheduler.submit, engine/stop.py): DEFAULT_MAX_TOKENS within the
    # context left after the prompt. Every HTTP route and the simulator share that one rule.
    max_tokens: int | None
    params: SamplingParams = field(default_factory=SamplingParams)
    eos_ids: frozenset = frozenset()
    stop_token_ids: frozenset = frozenset()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None: no logprobs; k >= 0: the sampled token's plus top k
    prompt_logprobs: int | None = None  # the same for each prompt token (engine/prompt_logprobs.py)
    id: str = field(default_factory=lambda: f"req-{next(_ids)}")
    arrival: float = 0.0
    cancelled: bool = False
    cancel_as: str = "abort"  # the finish reason a cancellation counts as ("stop": a stop string matched)
    sink: object = None  # callable(event) set by whoever submitted it
    sink_failed: bool = False  # the sink raised once: no more events go to it
    # ---- the engine's state of it (the scheduler sets these; nothing else writes them) ----
    status: Status = Status.WAITING
    held_at: float | None = None  # set while the door holds it
    passed: bool = False  # the door let it through (or it was admitted once): it never waits there again
    preemptions: int = 0  # times its pages were taken back to be recomputed (engine/preemption.py)
    pages: SeqPages = field(default_factory=SeqPages)  # its page tables while it holds KV
    output: list[int] = field(default_factory=list)  # tokens emitted so far; kept over a preemption
    # What prefill computes: the prompt, then any output a preemption made it recompute (set at
    # admission; `resumed` of them are output, re-run but not re-emitted).
    tokens: list[int] = field(default_factory=list)
    resumed: int = 0
    cached: int = 0  # prompt tokens whose KV came from the prefix cache at admission
    walked: int = 0  # prompt rows its prefills computed, every admission's (a recompute's too)
    scores: list | None = None  # its prompt logprobs by position, when asked (engine/prompt_logprobs.py)
    last_at: float | None = None  # when its previous token was emitted (a resumed one's gap spans the preemption)
    # Its decode rows' sampling request, built once past min_tokens (nothing in it changes after:
    # the history it passes is this very output list). One per row per step was 6 % of a sim run.
    sample: RowSample | None = None

    @property
    def computed(self) -> int:
        """Tokens whose KV is written: the one progress counter (prefill chunks and decode rows
        both advance the page table's frontier)."""
        return self.pages.frontier

    @property
    def rest(self) -> int:
        """Prompt rows (of `tokens`) still to prefill."""
        return len(self.tokens) - self.pages.frontier

    def chunk(self, take: int) -> tuple[list[int], int, bool]:
        """(tokens, start position, whether this chunk ends the prefill) of the next `take` rows."""
        start = self.pages.frontier
        end = start + take
        return self.tokens[start:end], start, end == len(self.tokens)


@dataclass(slots=True)  # events and rows are made per token: slots build them faster
class Event:
    request_id: str
    at: float  # engine clock


@dataclass(slots=True)
class Scheduled(Event):
    queued_at: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class Token(Event):
    token: int = 0
    logprob: float | None = None
    top_logprobs: list | None = None  # [(token, logprob)] when asked
    # Stall attribution: the kind of step that produced this token (decode | mixed | walk |
    # prefill | recompute), its prompt rows and prompts, and the gap since this stream's previous token
    # (None for the first token).
    cause: str = ""
    prompt_rows: int = 0
    prompts: int = 0
    gap: float | None = None
    finish: str | None = None  # "length" on a request's last token (its Finished follows); else None


@dataclass(slots=True)
class Finished(Event):
    reason: str = "stop"  # stop | length | abort | error
    prompt_tokens: int = 0
    completion_tokens: int = 0
    message: str = ""


@dataclass(slots=True)
class Rejected(Event):
    reason: str = ""


@dataclass(slots=True)
class RowSample:
    """What the executor needs to sample one row: the request's knobs and its history."""

    request_id: str
    params: SamplingParams
    suppress: tuple[int, ...] = ()  # ids masked to -inf (EOS before min_tokens)
    logprobs: int | None = None
    prompt: list[int] | None = None  # passed only when a penalty needs the history
    output: list[int] | None = None


@dataclass(slots=True)
class Sampled:
    token: int
    logprob: float | None = None
    top_logprobs: list | None = None
    done: bool = False  # the row's grammar is complete: this token is its last (finish "stop")


def row_sample(req: Request, output: list[int]) -> RowSample:
    """What the executor needs to sample `req`'s next token after `output`: EOS and stop tokens
    masked before min_tokens; the history only when a penalty reads it."""
    p = req.params
    suppress = ()
    if len(output) < req.min_tokens:
        suppress = tuple(req.stop_token_ids) + (() if req.ignore_eos else tuple(req.eos_ids))
    penal = p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0
    return RowSample(req.id, p, suppress, req.logprobs, req.prompt if penal else None, output if penal else None)


def rank(r: Request) -> float:
    """A request's place in every order the engine keeps (who gets pages first, who is preempted
    last, where a parked request goes back in the queue, the walk's order): its arrival. One
    function, so a priority class changes one line."""
    return r.arrival
