"""The chunked walk (MIX_CHUNK_TOKENS, ITL_TARGET_MS): prompts enter a live batch N rows per step.

Without it an admission is one whole-prompt step, and every live stream's inter-token gap pays
the whole prompt (a 1024-token prompt is ~2.5 s of one step on the 2-core EPYC). With it, the
admitted prompts ("walkers", status walking) advance in rounds: each round spreads a prompt-row
budget over the walkers in arrival order, reserves only the pages that round writes, and rides
the live decode rows. One round is one iteration's forward pass, so live streams get a token
between rounds and a stall is bounded by one round. Plain data, no torch.
"""

from __future__ import annotations

from .preemption import holders, make_room, never_fits, ready_rows


def walk_round(s, plan) -> None:
    """One round: at most the budget's prompt rows across the walkers (oldest arrival first),
    beside every live row. The budget is MIX_CHUNK_TOKENS, or under ITL_TARGET_MS what the
    step-cost model prices within the target (engine/step_cost.py). A walker short of pages takes
    them from younger page holders; with none younger it waits for a later round and leaves this
    round's rows to the walkers behind it (a pinned one among them holds every page it needs, so
    the round always moves), unless it is the only holder left, which means its prompt does not
    fit the pools at all."""
    ready_rows(s, plan)
    s.walk.sort(key=lambda w: w.arrival)  # stable: admission order among equals
    if s.pace is None:
        budget = s.chunk
    else:  # ITL_TARGET_MS (and TTFT_TARGET_MS, which reads the queue's prompts too)
        queued = sum(len(r.prompt) for r in s.queue) if s.pace.horizon is not None else 0
        budget = s.pace.rows(s.walk, s.roster, queued)
    left = budget
    for w in list(s.walk):
        take = min(w.rest, left)
        if take <= 0 or w not in s.walk:  # (preempted by an older walker of this round)
            continue
        if make_room(s, plan, w, w.computed + take, self_ok=False):
            plan.chunks.append((w, take))
            left -= take  # a walker waiting for pages leaves its rows to the ones behind it
        elif not holders(s, w) and not plan.chunks:
            s.finish(w, "error", never_fits(w))
            plan.finished.append((w, "error"))
    plan.budget = budget
    plan.why = plan.why or "a walk round"
