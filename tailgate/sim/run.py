"""`tailgate sim`: the unmodified scheduler (`engine.scheduler.Scheduler`, knobs through
`config.resolve`) on a virtual clock. The model runner is replaced by `SimExecutor`, which moves
the clock forward by the cost model's price of each step and samples a fixed token; arrivals come
from the same workload flags as `tailgate bench serve` (closed loop at a concurrency, or Poisson /
gamma open loop), and the results go through the same metrics code (`bench.workload.compute_metrics`).

The loop mirrors the engine thread (`engine/loop.py`): deliver every arrival due by now, run one
scheduler iteration, repeat; an idle scheduler jumps the clock to the next arrival.
"""

from __future__ import annotations

import json
import random
import sys
import time

from ..bench.workload import Result, add_workload_args, compute_metrics, draw_lengths, print_table
from ..config import ServingConfig, cli_lookup, resolve
from ..engine.request import Request
from ..engine.stop import clamp_max_tokens
from ..engine.scheduler import Scheduler  # noqa: F401  (what it runs, unmodified: tests check the identity)
from .clients import Load
from .cost import CostModel, resolve_cost

# The simulated engine (sim/engine.py), named here too: this module is the simulator's face.
from .engine import EOS, SAMPLED, TOKEN, VOCAB, SimExecutor, SimFlight, VirtualClock, build, lane_share  # noqa: F401


def workload(n: int, input_len: int, output_len: int, range_ratio: float, seed: int) -> list[tuple[int, int]]:
    """(prompt length, output length) per request, drawn as `bench serve --dataset-name random`."""
    rng = random.Random(seed)
    return [draw_lengths(rng, input_len, output_len, range_ratio) for _ in range(n)]


def simulate(
    cfg: ServingConfig,
    cost: CostModel,
    jobs: list[tuple[int, int]],
    chat: bool = False,
    probe: bool = True,
    **load,
) -> tuple[list[Result], dict]:
    """Run `jobs` through the scheduler under `load` (sim/clients.py `Load`'s keywords: rate,
    burstiness, concurrency, seed, offsets, jitter); returns per-request results (virtual
    seconds) and scheduler figures (steps, door releases, when each request was scheduled).
    Each request runs to its output length and max_tokens is that length (ignore_eos), or with
    `chat` it ends at EOS after its output length with max_tokens unset (the server's default),
    as a chat does: it may then hold a slot for far less than the whole length it could reach.
    `probe` seeds the step-cost model as the real engine's start-up probe does (False: it learns
    from the run's own steps alone)."""
    load = Load(**load)
    clock = VirtualClock()
    sched = build(cfg, cost, clock, load.jitter, load.seed, chat=chat, probe=probe)
    scheduled: list[float | None] = [None] * len(jobs)
    results = [Result(prompt_len=il, output_len=ol, probe=False) for il, ol in jobs]
    clients = load.clients(len(jobs))
    filler = list(range(60000, 60000 + max((il for il, _ in jobs), default=1)))
    reqs = []
    while clients.due or sched.has_work():
        if not sched.has_work() and clients.due[0][0] > clock.t:
            clock.t = clients.due[0][0]  # idle: jump to the next arrival
        while (nxt := clients.next_due(clock.t)) is not None:
            at, i = nxt
            il, ol = jobs[i]
            results[i].send = at
            # As the server does (`Generation.start`): at most what the context leaves after the prompt.
            # Distinct from the first token on (no two requests share a prefix), sliced, not built.
            fits = max(1, clamp_max_tokens(ol, il, cfg.max_context))
            prompt = [1000 + i % 50000] + filler[: il - 1]
            if chat:
                req = Request(prompt=prompt, max_tokens=None, arrival=at, eos_ids=frozenset({EOS}), min_tokens=fits)
            else:
                req = Request(prompt=prompt, max_tokens=fits, arrival=at, ignore_eos=True)
            req.sink = clients.sink(results[i], lambda ev, i=i: scheduled.__setitem__(i, ev.at))
            sched.submit(req)
            reqs.append(req)
        sched.step(clock.t)
    m = sched.metrics
    # The most times one request was preempted (bounded: engine/preemption.py MAX_PREEMPTIONS).
    most_preempted = max((r.preemptions for r in reqs), default=0)
    extra = {"itl_target": target_summary(m)} if sched.pace is not None else {}
    return results, {
        **extra,
        "iterations": m.steps,
        "steps": sched.executor.steps,
        "door_releases": dict(m.door_releases),
        "door_holds": m.door_hold.n,
        "door_mean_hold_ms": 1000 * m.door_hold.total / max(1, m.door_hold.n),
        "preemptions": m.preemptions,
        "most_preempted": most_preempted,
        "kv_pages": {"global": sched.book.glob.capacity, "local": sched.book.local.capacity if sched.book.local else 0},
        "virtual_s": clock.t,
        "scheduled_at": scheduled,
    }


def target_summary(m) -> dict:
    """ITL_TARGET_MS's figures for a run: the prompt rows its walk rounds took, how often a step's
    predicted time was within 5 / 15 % of its measured one, and the model's last fit."""
    err, rows = m.step_cost_error, m.step_prompt_rows
    within = {
        f"within_{int(b * 100)}pct": sum(err.counts[: err.buckets.index(b) + 1]) / max(1, err.n) for b in (0.05, 0.15)
    }
    return {
        "target_ms": 1000 * m.step_cost["target_s"] if "target_s" in m.step_cost else None,  # None: the walk
        "rounds": rows.n,
        "rounds_widened": m.rounds_widened,
        "rounds_kept_up": m.rounds_kept_up,
        "mean_round_rows": rows.total / max(1, rows.n),
        "priced_steps": err.n,
        **within,
        "fit": {k: v for k, v in m.step_cost.items() if k not in ("target_s", "predicted_s", "actual_s")},
    }


def metrics(results: list[Result], percentiles=(50, 90, 99)) -> dict:
    """`bench serve`'s metrics of a simulated run, over its span from the first send to the last token."""
    times = [t for r in results for t in r.chunk_times]
    if not times:
        raise ValueError("no request produced a token (every one was rejected: prompts longer than MAX_CONTEXT?)")
    return compute_metrics(results, max(times) - min(r.send for r in results), percentiles)


def run(args) -> dict:
    cfg = resolve(cli_lookup(args), lanes=("cpu", "green"))  # the seed's SM-capped lane is priced too
    cost = resolve_cost(args.cost)
    if args.cost_scale != 1.0:
        from dataclasses import replace

        from ..engine.cost_form import TERMS

        cost = replace(cost, **{t: getattr(cost, t) * args.cost_scale for t in TERMS})
    cfg = cfg.with_model_limit(args.model_max_context)
    jobs = workload(args.num_prompts, args.random_input_len, args.random_output_len, args.random_range_ratio, args.seed)
    load = dict(
        rate=args.request_rate,
        burstiness=args.burstiness,
        concurrency=args.max_concurrency,
        seed=args.seed,
        jitter=args.jitter,
    )
    t0 = time.perf_counter()
    if args.replicas > 1 or args.random_prefix_len:  # a fleet (sim/fleet.py); prompts that share tokens
        from ..fleet.policy import RouterPolicy
        from .fleet import prefix_workload, simulate_fleet

        fjobs = prefix_workload(
            args.num_prompts,
            args.random_input_len,
            args.random_output_len,
            args.random_prefix_len,
            args.prefix_groups,
            args.seed,
        )
        results, sched = simulate_fleet(
            cfg,
            cost,
            fjobs,
            args.replicas,
            RouterPolicy(args.router, seed=args.seed),
            **load,
        )
        sched["scheduled_at"] = None
    else:
        results, sched = simulate(cfg, cost, jobs, chat=args.chat, **load)
    wall = time.perf_counter() - t0
    pcts = tuple(float(p) for p in args.metric_percentiles.split(","))
    sched.pop("scheduled_at")
    out = {
        "cost": args.cost,
        "jitter": args.jitter,
        "seed": args.seed,
        "knobs": dict(vars(cfg)),
        **metrics(results, pcts),
        **sched,
    }
    out["sim_wall_s"] = round(wall, 3)
    return out


def main(args) -> int:
    if args.action == "calibrate":  # it loads the model, which the simulator never imports
        print(
            "tailgate: calibrate runs as `tailgate sim calibrate` (bench/calibrate.py, from tailgate.cli)",
            file=sys.stderr,
        )
        return 2
    try:
        out = run(args)
    except ValueError as e:  # an unknown preset, a workload nothing of which can run
        print(f"tailgate: {e}", file=sys.stderr)
        return 2
    print_table(out, tuple(float(p) for p in args.metric_percentiles.split(",")))
    if "replicas" in out:  # a fleet
        print(
            f"{out['replicas']} replicas, router {out['router']}: requests per replica {out['requests_per_replica']}, "
            f"reasons {out['route_reasons']}, prefix cache served {100 * out['prefix_hit_ratio']:.1f} % of prompt "
            f"tokens, preemptions {out['preemptions']}; simulated {out['virtual_s']:.1f} s in {out['sim_wall_s']} s"
        )
    else:
        print(
            f"{out['steps']} model steps in {out['iterations']} iterations, door releases {out['door_releases']}, holds {out['door_holds']} "
            f"(mean {out['door_mean_hold_ms']:.1f} ms), preemptions {out['preemptions']}; simulated {out['virtual_s']:.1f} s in {out['sim_wall_s']} s"
        )
    if "itl_target" in out:
        t = out["itl_target"]
        fit = ", ".join(f"{k} {v:.3g}" if k == "pace" else f"{k} {1000 * v:.4g} ms" for k, v in t["fit"].items())
        print(
            ("the walk" if t["target_ms"] is None else f"ITL target {t['target_ms']:.0f} ms")
            + f": {t['rounds']} walk rounds of {t['mean_round_rows']:.1f} prompt rows on average "
            f"({t['rounds_widened']} widened by the TTFT horizon, {t['rounds_kept_up']} kept up with the requests in); step time predicted within 5 % / 15 % for {100 * t['within_5pct']:.0f} % / "
            f"{100 * t['within_15pct']:.0f} % of {t['priced_steps']} priced steps; fit: {fit}"
        )
    if args.save_result:
        with open(args.save_result, "w") as f:
            json.dump({k: v for k, v in out.items() if k != "sim_wall_s"}, f, indent=1, sort_keys=True)
    return 0


def add_args(p) -> None:
    from ..config import add_knob_args

    p.add_argument(
        "action",
        nargs="?",
        default="run",
        choices=["run", "calibrate"],
        help="run a workload (default), or fit a cost preset (`local` unless --preset-name) from `bench step` "
        "here (bench/calibrate.py)",
    )
    p.add_argument("--calibrate-model", default="gemma3-270m", help="calibrate: the model `bench step` times")
    p.add_argument(
        "--preset-name",
        default="local",
        help="calibrate: the preset it saves (a capacity plan for another model or size: "
        "`sim calibrate --calibrate-model M --preset-name NAME`, then `sim --cost NAME`)",
    )
    p.add_argument("--cost", default="local", help="a preset of sim/presets.json, or a cost-model JSON file")
    p.add_argument("--model-max-context", type=int, default=32768, help="the simulated model's position limit")
    add_workload_args(p)
    p.add_argument("--jitter", type=float, default=0.0, help="relative std dev of each step's cost (seeded)")
    p.add_argument(
        "--chat",
        action="store_true",
        help="requests end at EOS after their drawn output length, max_tokens unset (DEFAULT_MAX_TOKENS), "
        "as chats do; without it each runs to max_tokens = its output length (ignore_eos)",
    )
    from ..server.args import uint_arg

    fl = p.add_argument_group("fleet (sim/fleet.py)")
    fl.add_argument("--replicas", type=uint_arg(1), default=1, help="engine replicas behind the router")
    fl.add_argument(
        "--router",
        default="prefix",
        choices=["prefix", "least-loaded", "random"],
        help="the fleet's routing policy (fleet/policy.py, what serve --replicas runs)",
    )
    fl.add_argument("--random-prefix-len", type=uint_arg(), default=0, help="tokens of shared system prompt")
    fl.add_argument(
        "--prefix-groups",
        type=uint_arg(1),
        default=1,
        help="distinct system prompts, each request under one drawn uniformly",
    )
    fl.add_argument(
        "--cost-scale",
        type=float,
        default=1.0,
        help="multiply every step's price: N replicas "
        "splitting one machine's cores take ~N times as long a step (linear: an assumption)",
    )
    p.add_argument("--save-result", default=None, help="the metrics as JSON (sorted keys; same seed, same bytes)")
    add_knob_args(p)
