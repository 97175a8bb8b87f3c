"""A scheduling rule judged against the fixed walk in the simulator, on every CPU class there is a
measured cost preset for (issues 35, 42): W-std (random 256 in / 64 out, closed loop) at c4 / c8 /
c16, and with `--shapes` socket_tail_open.sh's shapes too (poisson, gamma: 60 requests 128-384 in /
32-96 out at 1.5 req/s, burstiness 1 / 0.5; long: 768 in / 64 out, c12, 48 prompts); each policy's
output tok/s, TTFT p50 / p99 and ITL p99, and its ratios to the walk's.

    .venv/bin/python scripts/experiments/target_sweep.py [--presets local,zen5-measured,amx-measured]
        [--policy NAME=KNOB=VALUE,KNOB=VALUE ...] [--shapes c4,c8,c16,poisson,gamma,long]
        [--jitter 0.1] [--seeds 0,1,2]

The walk is `TTFT_TARGET_MS=off` (the fixed 64-row rounds); the default is whatever
`config.resolve` gives with no knob set. A policy's FACTOR, OVERHEAD, WALK_FACTOR and WALK_RATE set
`step_cost`'s AUTO_FACTOR, AUTO_OVERHEAD, WALK_FACTOR and WALK_RATE (rule variants under study), the rest are knobs. Each
cell is the median over the seeds (jitter makes seeds differ).
"""

from __future__ import annotations

import argparse
import statistics

from tailgate.config import env_lookup, resolve
from tailgate.engine import step_cost
from tailgate.sim.cost import resolve_cost
from tailgate.sim.run import metrics, simulate, workload

CONSTANTS = {k: getattr(step_cost, k) for k in ("AUTO_FACTOR", "AUTO_OVERHEAD", "WALK_FACTOR", "WALK_RATE")}
POLICIES = {"walk": {"TTFT_TARGET_MS": "off"}, "default": {}}
MIXED = dict(n=60, input_len=256, output_len=64, ratio=0.5, rate=1.5)
SHAPES = {
    "poisson": dict(MIXED, burstiness=1.0),
    "gamma": dict(MIXED, burstiness=0.5),
    "long": dict(n=48, input_len=768, output_len=64, ratio=0.0, c=12),
}


def cell(
    preset: str, knobs: dict, shape: str, seed: int, jitter: float, n: int, probe: bool = True
) -> tuple[float, ...]:
    knobs = dict(knobs)
    for name, default in CONSTANTS.items():  # rule variants under study
        setattr(step_cost, name, float(knobs.pop(name.removeprefix("AUTO_"), default)))
    cfg = resolve(env_lookup(knobs, environ={}), lanes=("cpu", "green")).with_model_limit(32768)
    cost = resolve_cost(preset)
    sh = SHAPES.get(shape) or dict(n=n, input_len=256, output_len=64, ratio=0.0, c=int(shape.removeprefix("c")))
    jobs = workload(sh["n"], sh["input_len"], sh["output_len"], sh["ratio"], seed)
    load = dict(rate=sh["rate"], burstiness=sh["burstiness"]) if "rate" in sh else dict(concurrency=sh["c"])
    res, _ = simulate(cfg, cost, jobs, seed=seed, jitter=jitter, probe=probe, **load)
    m = metrics(res)
    return m["output_throughput"], m["median_ttft_ms"], m["p99_ttft_ms"], m["p99_itl_ms"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--presets", default="zen3-measured,zen5-measured,amx-measured")
    p.add_argument("--policy", action="append", default=[], help="NAME=KNOB=VALUE[,KNOB=VALUE]")
    p.add_argument("--shapes", default="c4,c8,c16")
    p.add_argument("--jitter", type=float, default=0.1)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-prompts", type=int, default=64, help="W-std's prompts")
    p.add_argument(
        "--no-probe", action="store_true", help="no start-up probe seeds the step-cost fit (it learns from the run)"
    )
    a = p.parse_args()
    pol = dict(POLICIES)
    for spec in a.policy:
        name, _, rest = spec.partition("=")
        pol[name] = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    seeds = [int(s) for s in a.seeds.split(",")]
    worst = {}
    for preset in a.presets.split(","):
        for shape in a.shapes.split(","):
            rows = {}
            for name, knobs in pol.items():
                cells = [cell(preset, knobs, shape, s, a.jitter, a.num_prompts, not a.no_probe) for s in seeds]
                rows[name] = tuple(statistics.median(x[i] for x in cells) for i in range(4))
            w = rows["walk"]
            for name, (tok, ttft, ttft99, itl) in rows.items():
                r = (tok / w[0], ttft / w[1], ttft99 / w[2], itl / w[3])
                print(
                    f"{preset:15s} {shape:7s} {name:10s} {tok:6.1f} tok/s  TTFT p50 {ttft:6.0f} p99 {ttft99:6.0f} ms  "
                    f"ITL p99 {itl:5.0f} ms  vs walk: tok/s x{r[0]:.2f} TTFT p50 x{r[1]:.2f} p99 x{r[2]:.2f} ITL p99 x{r[3]:.2f}",
                    flush=True,
                )
                if name != "walk":
                    k = worst.setdefault(name, [9.0, 0.0, 0.0])
                    k[0], k[1], k[2] = min(k[0], r[0]), max(k[1], r[3]), max(k[2], r[1])
    for name, (rt, ri, rp) in worst.items():
        print(
            f"{name}: worst tok/s ratio {rt:.2f}, worst ITL p99 ratio {ri:.2f}, worst TTFT p50 ratio {rp:.2f} "
            "(issue 42's bounds: >= 0.97, <= 1.00, <= 1.25)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
