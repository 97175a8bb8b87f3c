"""The step as plain data: the segments the runner executes, the plan the scheduler decides
(`StepPlan`, vLLM v1's SchedulerOutput), and the record each step leaves (`StepRecord`)."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(slots=True, eq=False)  # one per engine iteration
class StepPlan:
    """One engine iteration as `Scheduler.schedule(now)` decided it (vLLM v1's SchedulerOutput):
    who came in (`admitted`), who the door holds, who gave pages back (`preempted`) or ended before
    the step (`finished`: cancelled, rejected, never fits), the lane flight it joined (`joined`)
    and the one it launches (`launch`), which prompt rows of whom (`chunks`, (request, rows) in
    order; a whole prompt is one chunk), which live rows decode one token each (`rows`), under what
    prompt-row budget, the segments and sample rows of its one forward pass, and what that pass is
    predicted to take (`predicted_s`, with a step cost model). Page moves are done when decided
    (reservations, preemptions, as vLLM's schedule() allocates); the step then launches the lane,
    runs the pass and settles what it sampled (the plan handed to `settle.settle_step`), and the
    plan ends as a `StepRecord`. Tests and the step timeline read plans and records; the runner
    reads `segments`."""

    kind: str = "decode"  # decode | mixed | walk | prefill | recompute | lane | idle
    chunks: list = field(default_factory=list)  # [(Request, rows)]
    rows: list = field(default_factory=list)  # [Request]: live rows, one token each
    segments: list = field(default_factory=list)  # [Segment]: the chunks' then the rows'
    samples: list = field(default_factory=list)  # [RowSample] for the sampled segments, in order
    budget: int | None = None  # a walk round's prompt-row budget (MIX_CHUNK_TOKENS or ITL_TARGET_MS); None: none
    at: float = 0.0  # the `now` it was decided at
    admitted: list = field(default_factory=list)  # [Request] taken from the queue this iteration
    held: int = 0  # requests the door began holding in this iteration's turn (Scheduler.held: all it holds)
    preempted: list = field(default_factory=list)  # [Request] whose pages were taken back
    finished: list = field(default_factory=list)  # [(Request, reason)] ended while planning
    joined: tuple | None = None  # (Request, why) the lane flight landed while planning: done | idle | pages
    launch: object = None  # the Request whose whole prompt starts on the side lane
    why: str = ""  # the rule that chose the step's shape (docs/engine.md lists them)
    predicted_s: float | None = None  # the step cost model's price of its pass (None: no model, or not ready)

    @property
    def prompt_rows(self) -> int:
        return sum(take for _, take in self.chunks)


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
    budget: int | None = None  # its prompt-row budget (StepPlan.budget)
    predicted_s: float | None = None  # what the step cost model predicted it would take (StepPlan.predicted_s)

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}
