"""The inter-token target's rule judged against the fixed walk in the simulator, on every CPU
class there is a measured cost preset for (issue 35): W-std (random 256 in / 64 out, closed loop)
at c4 / c8 / c16, each policy's output tok/s, TTFT p50 and ITL p99, and its ratios to the walk's.

    .venv/bin/python scripts/experiments/target_sweep.py [--presets local,zen5-measured,amx-measured]
        [--policy NAME=KNOB=VALUE,KNOB=VALUE ...] [--jitter 0.1] [--seeds 0,1,2]

The walk is `TTFT_TARGET_MS=off` (the fixed 64-row rounds; since issue 42 `ITL_TARGET_MS=off` is the default walk, which widens under a backlog); the default is whatever `config.resolve` gives
with no knob set. Each cell is the median over the seeds (jitter makes seeds differ).
"""

from __future__ import annotations

import argparse
import statistics

from tailgate.config import env_lookup, resolve
from tailgate.engine import step_cost
from tailgate.sim.cost import resolve_cost
from tailgate.sim.run import metrics, simulate, workload

FACTOR, OVERHEAD = step_cost.AUTO_FACTOR, step_cost.AUTO_OVERHEAD
POLICIES = {"walk": {"TTFT_TARGET_MS": "off"}, "default": {}}


def cell(preset: str, knobs: dict, c: int, seed: int, jitter: float, n: int) -> tuple[float, float, float]:
    knobs = dict(knobs)
    step_cost.AUTO_FACTOR = float(knobs.pop("FACTOR", FACTOR))  # rule variants under study
    step_cost.AUTO_OVERHEAD = float(knobs.pop("OVERHEAD", OVERHEAD))
    cfg = resolve(env_lookup(knobs, environ={}), lanes=("cpu", "green")).with_model_limit(32768)
    cost = resolve_cost(preset)
    jobs = workload(n, 256, 64, 0.0, seed)
    res, _ = simulate(cfg, cost, jobs, concurrency=c, seed=seed, jitter=jitter)
    m = metrics(res)
    return m["output_throughput"], m["median_ttft_ms"], m["p99_itl_ms"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--presets", default="zen3-measured,zen5-measured,amx-measured")
    p.add_argument("--policy", action="append", default=[], help="NAME=KNOB=VALUE[,KNOB=VALUE]")
    p.add_argument("--conc", default="4,8,16")
    p.add_argument("--jitter", type=float, default=0.1)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--num-prompts", type=int, default=64)
    a = p.parse_args()
    pol = dict(POLICIES)
    for spec in a.policy:
        name, _, rest = spec.partition("=")
        pol[name] = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    seeds = [int(s) for s in a.seeds.split(",")]
    worst = {}
    for preset in a.presets.split(","):
        for c in map(int, a.conc.split(",")):
            rows = {}
            for name, knobs in pol.items():
                cells = [cell(preset, knobs, c, s, a.jitter, a.num_prompts) for s in seeds]
                rows[name] = tuple(statistics.median(x[i] for x in cells) for i in range(3))
            w = rows["walk"]
            for name, (tok, ttft, itl) in rows.items():
                rt, ri = tok / w[0], itl / w[2]
                print(
                    f"{preset:15s} c{c:<3d} {name:12s} {tok:7.1f} tok/s  TTFT p50 {ttft:7.0f} ms  ITL p99 "
                    f"{itl:6.0f} ms   vs walk: tok/s x{rt:.2f} ITL p99 x{ri:.2f}"
                )
                if name != "walk":
                    k = worst.setdefault(name, [9.0, 0.0])
                    k[0], k[1] = min(k[0], rt), max(k[1], ri)
    for name, (rt, ri) in worst.items():
        print(f"{name}: worst tok/s ratio {rt:.2f}, worst ITL p99 ratio {ri:.2f} (done means >= 0.95 and <= 1.00)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
