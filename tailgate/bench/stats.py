"""Latency statistics with vLLM's definitions (shared by the in-process and HTTP benchmarks)."""

from __future__ import annotations

import math
import statistics

import numpy as np


def percentile(xs, p: float, presorted: bool = False) -> float:
    """Linear interpolation between closest ranks (numpy's default, as vLLM uses)."""
    if len(xs) == 0:
        return 0.0
    s = xs if presorted else sorted(xs)
    k = (len(s) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


def summarize(name: str, xs: list[float], percentiles=(50, 90, 99)) -> dict:
    """mean/median/std and each percentile, in ms, under vLLM's field names. One sort (numpy):
    a simulated run has millions of gaps (statistics' pure-Python pstdev alone took seconds)."""
    ms = np.sort(np.asarray(xs, dtype=np.float64) * 1000)
    n = len(ms)
    out = {
        f"mean_{name}_ms": math.fsum(ms) / n if n else 0.0,
        f"median_{name}_ms": float(ms[(n - 1) // 2] + ms[n // 2]) / 2 if n else 0.0,
        f"std_{name}_ms": float(ms.std()) if n > 1 else 0.0,
    }
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = percentile(ms, p, presorted=True)
    return out


def request_metrics(
    send: float, token_times: list[float], tokens: int | None = None
) -> tuple[float, list[float], float | None, float]:
    """TTFT = first token - send; ITLs = every gap; TPOT = (E2EL - TTFT) / (tokens - 1); E2EL.
    `tokens` is the server's count (usage) when a chunk may carry several; default one per time."""
    n = tokens or len(token_times)
    ttft = token_times[0] - send
    itls = [b - a for a, b in zip(token_times, token_times[1:])]
    e2el = token_times[-1] - send
    tpot = (e2el - ttft) / (n - 1) if n > 1 else None
    return ttft, itls, tpot, e2el


def ab_table(names: list[str], rounds: dict, metrics) -> str:
    """Each metric as `mean [min–max]` per arm over its rounds, and each arm's change vs the first."""
    lines = [
        "| metric | " + " | ".join(names) + " | " + " | ".join(f"{n} vs {names[0]}" for n in names[1:]) + " |",
        "|---|" + "---|" * (2 * len(names) - 1),
    ]
    for k in metrics:
        cells, means = [], []
        for n in names:
            vals = [m[k] for m in rounds[n] if k in m]
            if not vals:
                cells.append("n/a")
                means.append(None)
                continue
            mu = statistics.fmean(vals)
            means.append(mu)
            cells.append(f"{mu:.1f} [{min(vals):.1f}–{max(vals):.1f}]")
        rel = [f"{100 * (mu / means[0] - 1):+.1f}%" if mu is not None and means[0] else "n/a" for mu in means[1:]]
        lines.append(f"| {k} | " + " | ".join(cells) + " | " + " | ".join(rel) + " |")
    return "\n".join(lines)
