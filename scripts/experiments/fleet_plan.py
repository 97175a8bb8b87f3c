"""Size a fleet on the simulator (docs/scale-out.md): for N replicas behind a router, the highest
Poisson request rate whose ITL p99 and TTFT p50 stay within a target, found by bisection on the
rate, for a shared-prefix workload (G system prompts of P tokens, each request under one drawn at
random, then its own tokens). Virtual time only (tailgate/sim/fleet.py), no model, no server.

.venv/bin/python scripts/experiments/fleet_plan.py --cost gemma4-12b-sm89 --replicas 1,2,4,8,16,64 \
    --groups 16 --prefix-len 2048 --input-len 2304 --output-len 128 --itl-p99-ms 100 --ttft-p50-ms 1000
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

from tailgate.config import resolve
from tailgate.fleet.policy import RouterPolicy
from tailgate.sim.cost import TERMS, resolve_cost
from tailgate.sim.fleet import prefix_workload, simulate_fleet
from tailgate.sim.run import metrics


def run_at(cfg, cost, n, router, rate, a, seed=0):
    # Enough requests that arrivals span `span_s` virtual seconds at this rate: a short burst ends
    # before queues build, and its figures pass a target a steady stream would fail (64 replicas x
    # 10 requests "held" 768 req/s of the CPU workload, 12x the per-replica rate of 16 replicas).
    count = max(a.min_requests, a.per_replica * n, int(rate * a.span_s) if rate != float("inf") else 0)
    jobs = prefix_workload(count, a.input_len, a.output_len, a.prefix_len, a.groups, seed)
    res, ex = simulate_fleet(cfg, cost, jobs, n, RouterPolicy(router, seed=seed), rate=rate, seed=seed)
    m = metrics(res)
    return m, ex


def ok(m, a) -> bool:
    return m["p99_itl_ms"] <= a.itl_p99_ms and m["median_ttft_ms"] <= a.ttft_p50_ms and m["failed"] == 0


def capacity(cfg, cost, n, router, a):
    """The highest rate (req/s) within the target, by bisection between 0 and a rate that fails."""
    lo, hi, best = 0.0, a.start_rate * n, None
    while True:  # grow until the target fails
        m, ex = run_at(cfg, cost, n, router, hi, a)
        if not ok(m, a):
            break
        lo, best, hi = hi, (m, ex), hi * 2
    for _ in range(a.steps):
        mid = (lo + hi) / 2
        m, ex = run_at(cfg, cost, n, router, mid, a)
        if ok(m, a):
            lo, best = mid, (m, ex)
        else:
            hi = mid
    return lo, best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cost", default="gemma4-12b-sm89")
    p.add_argument(
        "--cost-scale",
        default="1",
        help="per-N step-price multipliers: one value, or `n` (= N: N replicas splitting one machine's cores)",
    )
    p.add_argument("--replicas", default="1,2,4,8,16,64")
    p.add_argument("--routers", default="prefix")
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--prefix-len", type=int, default=2048)
    p.add_argument("--input-len", type=int, default=2304)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--itl-p99-ms", type=float, default=100.0)
    p.add_argument("--ttft-p50-ms", type=float, default=1000.0)
    p.add_argument("--per-replica", type=int, default=40, help="requests per replica in each run")
    p.add_argument("--min-requests", type=int, default=200)
    p.add_argument(
        "--span-s",
        type=float,
        default=0.0,
        help="at least this many virtual seconds of arrivals per run (requests = rate x span when that is more)",
    )
    p.add_argument("--start-rate", type=float, default=0.25, help="req/s per replica to start the search at")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--knobs", default='{"PREFIX_CACHE": "64"}', help="TAILGATE_ knobs as JSON")
    a = p.parse_args()
    knobs = json.loads(a.knobs)
    cfg = resolve(lambda name: knobs.get(name)).with_model_limit(32768)
    base = resolve_cost(a.cost)
    print(
        f"cost {a.cost}; {a.groups} system prompts of {a.prefix_len} tokens, {a.input_len} in / {a.output_len} out, "
        f"Poisson; target ITL p99 <= {a.itl_p99_ms:g} ms, TTFT p50 <= {a.ttft_p50_ms:g} ms; knobs {knobs}"
    )
    print(
        "| replicas | router | req/s within target | per replica | output tok/s | TTFT p50 ms | ITL p99 ms | "
        "prefix-cache share of prompt tokens | routes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in a.replicas.split(",")):
        scale = float(n) if a.cost_scale == "n" else float(a.cost_scale)
        cost = replace(base, **{t: getattr(base, t) * scale for t in TERMS}) if scale != 1 else base
        for router in a.routers.split(","):
            t0 = time.perf_counter()
            rate, best = capacity(cfg, cost, n, router, a)
            if best is None:
                print(f"| {n} | {router} | none (the target fails at {a.start_rate * n:g} req/s) | | | | | | |")
                continue
            m, ex = best
            print(
                f"| {n} | {router} | {rate:.2f} | {rate / n:.2f} | {m['output_throughput']:.0f} | "
                f"{m['median_ttft_ms']:.0f} | {m['p99_itl_ms']:.0f} | {100 * ex['prefix_hit_ratio']:.0f} % | "
                f"{ex['route_reasons']} |",
                flush=True,
            )
            print(f"<!-- {n} {router}: {time.perf_counter() - t0:.0f} s of wall -->", flush=True)


if __name__ == "__main__":
    main()
