"""The prefix router's imbalance threshold (fleet/policy.py IMBALANCE) swept on the simulator: 2
replicas of this CPU's calibrated `local` model, each at half speed (the cores split), 12 system
prompts of 1024 tokens, 1152 in / 64 out, PREFIX_CACHE 8 and 64, closed loop c4/c8/c16.
Run: .venv/bin/python scripts/experiments/fleet_imbalance.py (about a minute; virtual time only)."""

from dataclasses import replace
from tailgate.config import resolve
from tailgate.sim.cost import resolve_cost, TERMS
from tailgate.sim.fleet import prefix_workload, simulate_fleet
from tailgate.sim.run import metrics
from tailgate.fleet.policy import RouterPolicy

cost = resolve_cost("local")
cost = replace(cost, **{t: getattr(cost, t) * 2 for t in TERMS})
for pc in ("8", "64"):
    cfg = resolve(lambda n: {"PREFIX_CACHE": pc}.get(n)).with_model_limit(32768)
    jobs = prefix_workload(192, 1152, 64, 1024, 12, 0)
    for conc in (4, 8, 16):
        for imb in (0, 1, 2, 4, 8, 1000):
            res, ex = simulate_fleet(cfg, cost, jobs, 2, RouterPolicy("prefix", imbalance=imb), concurrency=conc)
            m = metrics(res)
            print(
                f"PC={pc} c{conc} imb={imb}: {m['output_throughput']:.2f} tok/s ttft p50 {m['median_ttft_ms']:.0f} itl p99 {m['p99_itl_ms']:.0f} hit {ex['prefix_hit_ratio']:.2f} {ex['route_reasons']}",
                flush=True,
            )
