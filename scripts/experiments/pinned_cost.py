"""What the preemption bound costs chats (issue 43 item 3): requests that end at EOS with max_tokens
unset (`tailgate sim --chat`), at a KV budget of 1 and 1.5 contexts, the bound's scheduler against
the same scheduler unbounded (MAX_PREEMPTIONS = infinity: vLLM's rule). Prints TTFT p50, the time to
drain, preemptions and the most any request took, per budget and arm, and the ratios to unbounded.

    .venv/bin/python scripts/experiments/pinned_cost.py [--preset zen5-measured] [--seeds 0,1,2]

Closed loop at c16, 200 requests, 256 in, output drawn 32-480 tokens (random 256 / 256, range
ratio 0.875), MAX_CONTEXT 4096: max_tokens unset is DEFAULT_MAX_TOKENS (2048), so a request's
whole length (2303 tokens) is over half a context while it uses ~500 on average.
"""

from __future__ import annotations

import argparse
import math
import statistics

from tailgate.config import env_lookup, resolve
from tailgate.engine import preemption
from tailgate.engine.pages import PAGE_SIZE, pages_for, pool_bytes, pool_pages
from tailgate.sim.cost import resolve_cost
from tailgate.sim.run import metrics, simulate, workload

CTX, SLOTS, N, C = 4096, 16, 200, 16


def budget_mb(cost, contexts: float) -> int:
    """KV_CACHE_MB whose global pool holds `contexts` full contexts beside the sliding pool."""
    local = pool_pages(CTX, SLOTS, cost.window, transient_prompts=4).get("local", 0)
    glob = math.ceil(contexts * pages_for(CTX)) * PAGE_SIZE * cost.kv_token_bytes["global"]
    return -(-(pool_bytes({"local": local}, cost.kv_token_bytes) + glob) // (1 << 20))


def run(preset: str, contexts: float, bound: float, seed: int) -> dict:
    cost = resolve_cost(preset)
    knobs = {"MAX_CONTEXT": str(CTX), "KV_CACHE_MB": str(budget_mb(cost, contexts))}
    cfg = resolve(env_lookup(knobs, environ={})).with_model_limit(32768)
    preemption.MAX_PREEMPTIONS = bound
    try:
        jobs = workload(N, 256, 256, 0.875, seed)
        res, s = simulate(cfg, cost, jobs, chat=True, concurrency=C, seed=seed)
    finally:
        preemption.MAX_PREEMPTIONS = 2
    m = metrics(res)
    return {"ttft": m["median_ttft_ms"], "drain": s["virtual_s"], "pre": s["preemptions"], "most": s["most_preempted"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="zen5-measured")
    ap.add_argument("--seeds", default="0,1,2")
    a = ap.parse_args()
    seeds = [int(x) for x in a.seeds.split(",")]
    print(f"preset {a.preset}, chats (EOS-ended, max_tokens unset), c{C}, {N} requests, median over seeds {seeds}")
    print(
        "| KV budget | arm | TTFT p50 ms | drain s | preemptions | most preempted | TTFT / unbounded | drain / unbounded |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for contexts in (1.0, 1.5):
        cells = {}
        for arm, bound in (("unbounded", math.inf), ("bound 2", preemption.MAX_PREEMPTIONS)):
            runs = [run(a.preset, contexts, bound, sd) for sd in seeds]
            cells[arm] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        u = cells["unbounded"]
        for arm, v in cells.items():
            print(
                f"| {contexts} ctx | {arm} | {v['ttft']:.0f} | {v['drain']:.1f} | {v['pre']:.0f} | {v['most']:.0f} | "
                f"{v['ttft'] / u['ttft']:.2f} | {v['drain'] / u['drain']:.2f} |"
            )


if __name__ == "__main__":
    main()
