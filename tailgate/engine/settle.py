"""Settling a step: what its forward pass wrote and sampled, applied to the requests (vLLM v1's
update_from_output). Functions over the scheduler's state, called after the pass (and when the
lane's flight lands): prompt chunks advance their requests (a final one graduates into the
roster with its first token), every live row takes its token, and each token's event carries the
step's kind and the stream's gap for stall attribution.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .prompt_logprobs import PromptLogprobs
from .request import Request, Sampled, Status, Token
from .stop import LENGTH, STOP, verdict

if TYPE_CHECKING:
    from .plan import StepPlan
    from .scheduler import Scheduler


def settle_step(s: Scheduler, plan: StepPlan, per_seg: list, t0: float, now: float) -> None:
    """Count and record the step, then apply its results."""
    m, rows, prompt_rows = s.metrics, plan.rows, plan.prompt_rows
    if plan.chunks:
        m.prefill_rows.observe(prompt_rows)
    if rows:
        m.decode_rows.observe(len(rows))
    s.record(plan, t0, now)
    for (r, take), out in zip(plan.chunks, per_seg):
        absorb(s, plan, r, take, out, now)
    settle_rows(s, plan, rows, per_seg[len(plan.chunks) :], now, advance=True)
    s.deliver()


def absorb(s: Scheduler, plan: StepPlan, r: Request, take: int, out: Sampled | Exception, now: float) -> None:
    """A prompt chunk of `plan` is written: advance the request; its final chunk's token (`out`)
    graduates it into the roster. An exception in `out` fails this prompt alone."""
    if isinstance(out, Exception):  # only this prompt fails; its pages return
        s.end(r, "error", f"step failed: {out}")
        return
    final = r.computed + take == len(r.tokens)
    # The prefix cache registers the full pages just written before the window releases any
    # sliding page, so a released one stays idle for a later resume instead of going free.
    s.book.advance(r.pages, take, release=s.prefix is None)
    if s.prefix is not None:
        s.prefix.written(r.tokens, len(r.prompt), r.id, r.pages, final)
        s.book.advance(r.pages, 0)
    s.metrics.prompt_tokens += take
    r.walked += take
    if not final:
        return
    if r.status is Status.WALKING:  # (the lane's landing is in flight, in no walk)
        s.walk.remove(r)
    if r.scores is not None:  # the prompt's logprobs go out ahead of its first token
        s.emit(r, PromptLogprobs(r.id, now, r.scores))
    s.roster.append(r)  # graduates; settle_rows takes it out again if this token ends it
    r.status = Status.RUNNING
    settle_rows(s, plan, (r,), (out,), now)


def settle_rows(s: Scheduler, plan: StepPlan, rows, outs, now: float, advance: bool = False) -> None:
    """Apply one sampled token to each row, produced by `plan`'s pass, which ended at `now`
    (every row of a step is stamped with the same time; each token's event carries the plan's
    kind and prompt rows); with `advance`, each row's KV frontier moves past the token it fed. A
    row whose sampling failed, or whose token ends it, leaves the roster. One loop for the whole
    step, its lookups hoisted: this runs once per token (most of a simulated run)."""
    kind, prompt_rows, prompts = plan.kind, plan.prompt_rows, len(plan.chunks)
    book, events, m = s.book, s.events, s.metrics
    gaps, emitted = [], 0
    for r, out in zip(rows, outs):
        if isinstance(out, Exception):
            s.end(r, "error", f"step failed: {out}")
            continue
        if advance:
            book.advance(r.pages, 1)
        t = out.token
        why = verdict(r, t, len(r.output))
        if why is STOP:
            s.end(r, STOP)  # the stop token itself is not emitted
            continue
        r.output.append(t)
        emitted += 1
        gap = None if r.last_at is None else now - r.last_at
        if gap is not None:
            gaps.append(gap)
        r.last_at = now
        events.append((r, Token(r.id, now, t, out.logprob, out.top_logprobs, kind, prompt_rows, prompts, gap, why)))
        if why is LENGTH:
            s.end(r, LENGTH)
        elif out.done:  # its grammar is complete (structured outputs): nothing but EOS may follow
            s.end(r, STOP)
    m.generation_tokens += emitted
    if gaps:
        m.gaps(kind).observe_all(gaps)
