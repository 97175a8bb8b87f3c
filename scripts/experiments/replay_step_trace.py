"""Replay a step trace (the dashboard's `/dashboard/feed` SSE, each step's kind, rows, duration
and the live fit's prediction) through the engine's step-cost model, as the engine would have
fed it, and report the fit's error and the rounds the `auto` rule would have chosen there.

    .venv/bin/python scripts/experiments/replay_step_trace.py ../shared/design/measured/amx-feed-wstd-c8-default.sse

The trace carries no contexts: each decode row is taken at CONTEXT keys and a walk round's rows
half-way into a 256-token prompt (W-std's shape), so attention is priced only on average.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from tailgate.engine.step_cost import AUTO_FACTOR, RoundBudget, StepCostModel

CONTEXT = 288  # a W-std stream's mean context: 256 prompt + half of 64 outputs


def steps(path: str) -> list[dict]:
    seen = {}
    for line in open(path):
        if line.startswith("data:"):
            for s in json.loads(line[5:]).get("steps", []):
                seen[s["seq"]] = s
    return [seen[k] for k in sorted(seen)]


def features(s: dict) -> tuple:
    p, d = s["prompt_rows"], s["decode_rows"]
    start = 0 if s["kind"] == "prefill" else 128
    pairs = d * (CONTEXT + 1) + p * start + p * (p + 1) // 2
    return p, d, d + (1 if s["kind"] == "prefill" else 0), pairs / 1000


def main() -> int:
    trace = steps(sys.argv[1])
    m = StepCostModel()
    errs, rounds = [], []
    for s in trace:
        x = features(s)
        if m.ready:
            pred = m.predict(x)
            errs.append(abs(pred - s["duration_s"]) / s["duration_s"])
            if s["kind"] == "walk" and s["decode_rows"]:
                b = RoundBudget(None, 64, model=m)
                live = [SimpleNamespace(pages=SimpleNamespace(frontier=CONTEXT))] * s["decode_rows"]
                w = [SimpleNamespace(tokens=[0] * 256, done=128, rest=128)]
                rounds.append((s["prompt_rows"], b.rows(w, live)))
        m.observe(x, s["duration_s"])
    errs.sort()
    n = len(errs)
    print(
        f"{len(trace)} steps, {n} priced: error p50 {errs[n // 2]:.3f}, p90 {errs[int(0.9 * n)]:.3f}, "
        f"within 15 % {sum(e <= 0.15 for e in errs) / n:.2f}; final running error {m.error:.3f} "
        f"(trusted: {m.trusted})"
    )
    if rounds:
        took = sorted(r[0] for r in rounds)
        now = sorted(r[1] for r in rounds)
        print(
            f"walk rounds with live rows: the trace's rows p50 {took[len(took) // 2]} (max {took[-1]}); "
            f"replayed at AUTO_FACTOR {AUTO_FACTOR} capped at 64: p50 {now[len(now) // 2]} (max {now[-1]})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
