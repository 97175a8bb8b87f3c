"""`tailgate sim --replicas N --router prefix|least-loaded|random`: N copies of the real scheduler,
each with its own page book and its own virtual clock, behind the fleet's routing policy
(`fleet/policy.py`, the code `tailgate serve --replicas N` routes with), on one timeline.

Replicas run side by side, so each keeps a clock of its own: the time its next step may start. The
loop takes the earliest event of all: an arrival due no later than the earliest busy replica's
clock is routed (the policy reads every replica's running + waiting at that moment) and submitted
there (an idle replica's clock jumps to the arrival); otherwise that replica runs one scheduler
iteration, which moves its clock by the cost model's price of the step. A closed-loop client's
next request leaves at its previous one's finish, on whichever replica that was.

Prompts are token lists here (not lengths), so requests that share a system prompt share tokens
and each replica's real prefix cache (PREFIX_CACHE) hits exactly as the engine's would.
"""

from __future__ import annotations

import random

from ..bench.workload import Result
from ..config import ServingConfig
from ..engine.request import Request
from ..engine.stop import clamp_max_tokens
from ..fleet.policy import RouterPolicy
from .clients import Load
from .cost import CostModel
from .engine import VirtualClock, build


def prefix_workload(
    n: int, input_len: int, output_len: int, prefix_len: int, groups: int, seed: int
) -> list[tuple[list[int], int]]:
    """(prompt tokens, output length) per request: `groups` system prompts of `prefix_len` tokens
    (0 groups: none shared), each request under one drawn uniformly, then its own tokens up to
    `input_len`, distinct from every other request's from its first own token."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000, 60000) for _ in range(prefix_len)] for _ in range(groups)] if groups else [[]]
    out = []
    for i in range(n):
        head = prefixes[rng.randrange(len(prefixes))]
        own = [rng.randrange(1000, 60000) for _ in range(max(1, input_len - len(head)))]
        out.append((head + own, output_len))
    return out


def simulate_fleet(
    cfg: ServingConfig, cost: CostModel, jobs: list[tuple[list[int], int]], replicas: int, policy: RouterPolicy, **load
) -> tuple[list[Result], dict]:
    """Run `jobs` through `replicas` schedulers behind `policy` under `load` (sim/clients.py
    `Load`'s keywords); returns per-request results (virtual seconds) and fleet figures: the
    replica and cached prompt tokens of each request, requests per replica, the router's reasons."""
    load = Load(**load)
    clocks = [VirtualClock() for _ in range(replicas)]
    scheds = [build(cfg, cost, clocks[k], load.jitter, load.seed + k) for k in range(replicas)]
    results = [Result(prompt_len=len(p), output_len=ol, probe=False) for p, ol in jobs]
    where: list[int | None] = [None] * len(jobs)
    cached = [0] * len(jobs)
    clients = load.clients(len(jobs))
    while True:
        busy = [k for k in range(replicas) if scheds[k].has_work()]
        t_step = min((clocks[k].t for k in busy), default=float("inf"))
        if (nxt := clients.next_due(t_step)) is not None:
            at, i = nxt
            prompt, ol = jobs[i]
            loads = {k: scheds[k].running + len(scheds[k].queue) for k in range(replicas)}
            k, _ = policy.choose(prompt, loads)
            where[i] = k
            clocks[k].t = max(clocks[k].t, at)
            results[i].send = at
            req = Request(
                prompt=prompt,
                max_tokens=max(1, clamp_max_tokens(ol, len(prompt), cfg.max_context)),
                arrival=at,
                ignore_eos=True,
            )
            req.sink = clients.sink(results[i], lambda ev, i=i: cached.__setitem__(i, ev.cached_tokens))
            scheds[k].submit(req)
        elif busy:
            k = min(busy, key=lambda j: clocks[j].t)
            scheds[k].step(clocks[k].t)
        else:
            break
    per = [0] * replicas
    for k in where:
        per[k] += 1
    prompt_tokens = sum(len(p) for p, _ in jobs)
    return results, {
        "replicas": replicas,
        "router": policy.kind,
        "replica_of": where,
        "cached_tokens": cached,
        "requests_per_replica": per,
        "route_reasons": dict(sorted(policy.reasons.items())),
        "prefix_hit_ratio": sum(cached) / max(1, prompt_tokens),
        "steps": sum(s.executor.steps for s in scheds),
        "iterations": sum(s.metrics.steps for s in scheds),
        "preemptions": sum(s.metrics.preemptions for s in scheds),
        "virtual_s": max(c.t for c in clocks),
    }
