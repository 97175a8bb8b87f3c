"""The side lane (ASYNC_PREFILL): a live admission's whole prompt prefills beside the decode batch.

`Scheduler.schedule` decides both ends: an intake turn with a live roster names the request to
`launch` on its plan (its pages are reserved then, so nothing is reallocated under the lane's
writes), and the step starts the flight just before its forward pass; the flight lands (`land`)
at the top of a later plan when it is done or is the only work left, or mid-plan when a live row
needs pages (its request then holds them as a live row, preemption can choose it). Landing emits
its first token exactly as a synchronous prefill's. Intake stops while a flight is out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .plan import StepPlan
from .prompt_logprobs import prompt_segment
from .request import Request, Status, row_sample
from .settle import absorb

if TYPE_CHECKING:
    from .scheduler import Scheduler


def launch(s: Scheduler, r: Request) -> None:
    """Start `r`'s whole prompt on the lane; the sliding window's release waits for the landing."""
    toks, start, _ = r.chunk(r.rest)
    try:
        flight = s.executor.launch([prompt_segment(r, toks, start, True)], [row_sample(r, r.output)])
    except Exception as e:  # the lane could not start: this request fails, nothing else
        s.end(r, "error", f"side lane failed to start: {e}")
        return
    s.flight = (r, flight)
    r.status = Status.IN_FLIGHT
    s.metrics.lane_prefills += 1
    s.metrics.prefill_rows.observe(len(toks))


def land(s: Scheduler, plan: StepPlan, why: str) -> None:
    """Wait for the flight; then its first token. `why`: done | idle | pages (on the plan)."""
    r, flight = s.flight
    s.flight = None
    plan.joined = (r, why)
    t0 = s.clock()
    try:
        out = s.executor.join(flight)[0]
    except Exception as e:
        out = e
    if r.cancelled:  # cancelled while in flight: its pages come back only now
        s.end(r, r.cancel_as, plan=plan)
    else:
        take = r.rest
        landed = StepPlan("lane", [(r, take)])  # its token's kind; its record is the wait the engine saw
        s.record(landed, t0, s.clock())
        absorb(s, landed, r, take, out, s.clock())
    s.deliver()
