"""Side by side on one shared-prefix workload (several system prompts, many users each), in one
run: `serve --replicas 2 --router prefix` vs `--replicas 2 --router pow2` (Ray Serve's default
power-of-two router) vs one process with all the cores; output throughput, TTFT p50 and ITL p99
per arm, with the simulator's prediction for the same workload beside each (this CPU's `local`
preset; each of 2 replicas on half the cores priced at twice the step cost).

Arms run one after another (booted, warmed with one request, measured, stopped), in a rotated
order per round. A load run needs a quiet machine: nothing else running.

.venv/bin/python scripts/experiments/fleet_ab.py --groups 4 --prefix-len 256 --input-len 320 \
    --output-len 64 --num-prompts 96 --max-concurrency 8 --rounds 2 --save fleet-ab.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from dataclasses import replace

from tailgate.bench.ab import free_port, start, stop, wait_healthy
from tailgate.bench.serve import Sample, checks, compute_metrics, run_load
from tailgate.model.kernels.cpu import this_cpu

ARMS = {"prefix": "--replicas 2 --router prefix", "pow2": "--replicas 2 --router pow2", "single": ""}
FIELDS = ("output_throughput", "median_ttft_ms", "p99_itl_ms")


def samples(tok, n, input_len, output_len, prefix_len, groups, seed) -> list[Sample]:
    """Token-id prompts of exact length: `groups` system prompts, each request under one drawn
    at random, then its own tokens (ids, so every arm and the simulator see the same tokens)."""
    rng = random.Random(seed)
    lo, hi = min(1000, tok.vocab_size // 4), tok.vocab_size - 1
    heads = [[rng.randint(lo, hi) for _ in range(prefix_len)] for _ in range(groups)]
    return [
        Sample(rng.choice(heads) + [rng.randint(lo, hi) for _ in range(input_len - prefix_len)], input_len, output_len)
        for _ in range(n)
    ]


def predict(arm: str, a, data: list[Sample]) -> dict:
    """The simulator's figures for `arm` on the same prompts and client (closed loop)."""
    from tailgate.config import resolve
    from tailgate.fleet.policy import RouterPolicy
    from tailgate.sim.cost import TERMS, resolve_cost
    from tailgate.sim.fleet import simulate_fleet
    from tailgate.sim.run import metrics

    knobs = {"PREFIX_CACHE": a.prefix_cache}
    cfg = resolve(lambda name: knobs.get(name)).with_model_limit(32768)
    n = 1 if arm == "single" else 2
    cost = resolve_cost("local")
    cost = replace(cost, **{t: getattr(cost, t) * n for t in TERMS})
    # pow2 reads queue lengths only, as least-loaded does: its nearest policy in the simulator
    policy = RouterPolicy("prefix" if arm == "prefix" else "least-loaded")
    # The simulator's vocabulary is smaller than Gemma's: fold the ids into it (equal ids stay
    # equal, so shared prefixes stay shared and distinct tails stay distinct in practice).
    jobs = [([1000 + t % 59000 for t in s.prompt], s.output_len) for s in data]
    res, ex = simulate_fleet(cfg, cost, jobs, n, policy, concurrency=a.max_concurrency)
    return metrics(res)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--arms", default="prefix,pow2,single")
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--prefix-len", type=int, default=256)
    p.add_argument("--input-len", type=int, default=320)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=96)
    p.add_argument("--max-concurrency", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--prefix-cache", default="64", help="TAILGATE_PREFIX_CACHE for every arm")
    p.add_argument(
        "--serve",
        default=".venv/bin/tailgate serve --log-level warning",
        help="the serve command (each arm's flags and --port are added)",
    )
    p.add_argument("--health-timeout", type=float, default=900)
    p.add_argument("--save", default=None)
    a = p.parse_args()
    from tailgate.model.formats.weights import load_tokenizer

    tok = load_tokenizer("gemma3-270m")
    data = samples(tok, a.num_prompts, a.input_len, a.output_len, a.prefix_len, a.groups, seed=1)
    warm = samples(tok, 1, a.input_len, 4, a.prefix_len, 1, seed=2)
    arms = a.arms.split(",")
    cpu = this_cpu()
    out = {"cpu": f"{cpu.model} ({cpu.isa})", "workload": vars(a), "rounds": [], "sim": {}}
    for arm in arms:  # first: seconds, and a failure here costs no measurement
        m = predict(arm, a, data)
        out["sim"][arm] = {k: m[k] for k in FIELDS}
    for r in range(a.rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        got = {}
        for arm in order:
            port = free_port()
            log = tempfile.mktemp(prefix=f"fleet-ab-{arm}-", suffix=".log")
            proc = start(f"TAILGATE_PREFIX_CACHE={a.prefix_cache} {a.serve} --port {{port}} {ARMS[arm]}", port, log)
            base = f"http://127.0.0.1:{port}"
            try:
                model = wait_healthy(base, proc, a.health_timeout)
                asyncio.run(
                    run_load(base, "/v1/completions", model, warm, float("inf"), 1.0, 1, [], 0.0, True, progress=False)
                )
                results, dur = asyncio.run(
                    run_load(
                        base,
                        "/v1/completions",
                        model,
                        data,
                        float("inf"),
                        1.0,
                        a.max_concurrency,
                        [],
                        0.0,
                        True,
                        progress=False,
                    )
                )
            finally:
                stop(proc)
            m = compute_metrics(results, dur)
            warn = checks(results, True)
            got[arm] = {k: m[k] for k in FIELDS} | {
                "completed": m["completed"],
                "failed": m["failed"],
                "warnings": warn,
                "log": log,
            }
            print(
                f"round {r + 1} {arm}: "
                + ", ".join(f"{k} {m[k]:.1f}" for k in FIELDS)
                + (f"  WARNING {warn}" if warn else ""),
                flush=True,
            )
        out["rounds"].append(got)
    print(
        f"\n{out['cpu']}; {a.groups} system prompts x {a.prefix_len} tokens, {a.input_len} in / {a.output_len} out, "
        f"{a.num_prompts} requests, closed loop c{a.max_concurrency}, PREFIX_CACHE={a.prefix_cache}"
    )
    print("| arm | round | output tok/s | TTFT p50 ms | ITL p99 ms | sim: tok/s | TTFT p50 | ITL p99 |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in arms:
        s = out["sim"][arm]
        for i, rd in enumerate(out["rounds"]):
            m = rd[arm]
            print(
                f"| {arm} | {i + 1} | {m['output_throughput']:.1f} | {m['median_ttft_ms']:.0f} | {m['p99_itl_ms']:.0f} | "
                f"{s['output_throughput']:.1f} | {s['median_ttft_ms']:.0f} | {s['p99_itl_ms']:.0f} |"
            )
    if a.save:
        with open(a.save, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if any(rd[arm]["warnings"] for rd in out["rounds"] for arm in arms) else 0


if __name__ == "__main__":
    sys.exit(main())
