"""The coalesce door at GPU scale, on the simulator (docs/benchmarks/sim-door-study.md).

    .venv/bin/python scripts/sim_door_study.py [--cost gemma4-12b-sm89] [--seeds 5] [--jitter 0.05]

1. The seed's closed-loop study: random 1024 in / 128 out at c4 / c8 / c16 (24 / 48 / 64 prompts),
   door off vs 300 ms vs auto, several seeds (step-cost jitter makes seeds differ).
2. Open loop: Poisson arrivals at several rates, and bursty gamma arrivals (burstiness 0.25:
   arrivals come in clumps), door off vs 300 ms vs auto.
3. A sweep: per workload, the fixed window with the lowest ITL p99 whose TTFT p50 stays within a
   budget of the door-off TTFT p50, beside `auto`.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from tailgate.config import resolve
from tailgate.sim.cost import resolve_cost
from tailgate.sim.run import metrics, simulate, workload

KEYS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms")


def one(cost, door, n, c=None, rate=float("inf"), seed=0, jitter=0.0, slots=16, chunk="64", burstiness=1.0):
    knobs = {
        "DECODE_SLOTS": str(slots),
        "MAX_CONTEXT": "4096",
        "ADMIT_COALESCE_MS": str(door) if door else "off",
        "MIX_CHUNK_TOKENS": chunk,
    }
    cfg = resolve(knobs.get).with_model_limit(32768)
    res, s = simulate(
        cfg,
        cost,
        workload(n, 1024, 128, 0.0, seed),
        rate=rate,
        burstiness=burstiness,
        concurrency=c,
        seed=seed,
        jitter=jitter,
    )
    m = metrics(res)
    m["door_holds"] = s["door_holds"]
    return m


def row(label, ms):
    cells = []
    for k in KEYS:
        vals = [m[k] for m in ms]
        cells.append(
            f"{statistics.fmean(vals):.1f} [{min(vals):.1f}–{max(vals):.1f}]" if len(vals) > 1 else f"{vals[0]:.1f}"
        )
    return f"| {label} | " + " | ".join(cells) + f" | {statistics.fmean(m['door_holds'] for m in ms):.0f} |"


HEAD = "| cell | " + " | ".join(KEYS) + " | held |\n|---|" + "---|" * (len(KEYS) + 1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--cost", default="gemma4-12b-sm89")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--jitter", type=float, default=0.05)
    p.add_argument("--budget", type=float, default=1.10, help="sweep: TTFT p50 at most this x door off")
    a = p.parse_args(argv)
    cost = resolve_cost(a.cost)
    print(f"cost model `{a.cost}`: {cost}\n")
    doors = (None, 300, "auto")
    open_loops = [(f"Poisson {r} req/s", dict(n=200, rate=r)) for r in (0.5, 1.0, 2.0, 4.0)] + [
        (f"bursty {r} req/s", dict(n=200, rate=r, burstiness=0.25)) for r in (1.0, 2.0)
    ]
    for chunk in ("off", "64"):
        walk = (
            "walk off: whole-prompt admission (the seed's setting)"
            if chunk == "off"
            else "walk 64 (tailgate's default)"
        )
        print(
            f"## {walk}\n\n### Closed loop, 1024 in / 128 out, mean [min–max] over {a.seeds} seeds, jitter {a.jitter}\n"
        )
        print(HEAD)
        for c, n in ((4, 24), (8, 48), (16, 64)):
            for door in doors:
                ms = [one(cost, door, n, c=c, seed=s, jitter=a.jitter, chunk=chunk) for s in range(a.seeds)]
                print(row(f"c{c} door {door or 'off'}", ms))
        print("\n### Open loop (Poisson; bursty = gamma, burstiness 0.25), 1024 in / 128 out, 200 requests\n")
        print(HEAD)
        for label, kw in open_loops:
            for door in doors:
                ms = [one(cost, door, seed=s, jitter=a.jitter, chunk=chunk, **kw) for s in range(a.seeds)]
                print(row(f"{label} door {door or 'off'}", ms))
        print(
            f"\n### Sweep: the fixed window with the lowest ITL p99 keeping TTFT p50 <= {a.budget}x door off, "
            "beside auto\n"
        )
        print(
            "| workload | off: ITL p99 / TTFT p50 / tok/s | best window | its ITL p99 / TTFT p50 / tok/s | "
            "auto: ITL p99 / TTFT p50 / tok/s |\n|---|---|---|---|---|"
        )
        windows = (None, 20, 50, 100, 200, 300, 500, 1000)
        for label, kw in (
            [("closed c8", dict(n=48, c=8)), ("closed c16", dict(n=64, c=16))] + open_loops[1:3] + open_loops[4:]
        ):
            res = {}
            for w in windows + ("auto",):
                ms = [one(cost, w, seed=s, jitter=a.jitter, chunk=chunk, **kw) for s in range(a.seeds)]
                res[w] = tuple(
                    statistics.fmean(m[k] for m in ms) for k in ("p99_itl_ms", "median_ttft_ms", "output_throughput")
                )
            off = res[None]
            ok = [w for w in windows if res[w][1] <= a.budget * off[1]]
            best = min(ok, key=lambda w: res[w][0])
            fmt = lambda r: f"{r[0]:.1f} / {r[1]:.1f} / {r[2]:.1f}"  # noqa: E731
            print(f"| {label} | {fmt(off)} | {best or 'off'} | {fmt(res[best])} | {fmt(res['auto'])} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
