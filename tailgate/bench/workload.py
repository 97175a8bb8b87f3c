"""What a serving benchmark sends and how its results are scored, apart from any HTTP client:
the request samples (random token prompts with an optional shared prefix, JSONL / ShareGPT files,
Poisson probes), the arrival times (gamma gaps, as vLLM's client), the per-request `Result`, and
vLLM's metric arithmetic (TTFT, TPOT, ITL, E2EL, throughput, goodput). `bench serve` sends them
over HTTP; `tailgate sim` and its fleet feed them to the scheduler on a virtual clock."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import numpy as np

from .stats import request_metrics, summarize


@dataclass
class Sample:
    prompt: list[int] | str
    prompt_len: int
    output_len: int
    probe: bool = False


@dataclass
class Result:
    prompt_len: int
    output_len: int
    probe: bool
    send: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    chunk_causes: list = field(default_factory=list)  # tailgate's per-chunk step kind (None elsewhere)
    output_tokens: int = 0
    success: bool = False
    error: str = ""
    finish_reasons: list = field(default_factory=list)
    queued: float = 0.0  # client-side wait for a concurrency slot


def draw_lengths(rng, input_len: int, output_len: int, range_ratio: float) -> tuple[int, int]:
    """One request's (prompt, output) lengths as vLLM's random dataset draws them: uniform within
    +-range_ratio of each (an output at least 1)."""
    if not range_ratio:
        return input_len, output_len
    il = rng.randint(int(input_len * (1 - range_ratio)), int(input_len * (1 + range_ratio)))
    ol = rng.randint(max(1, int(output_len * (1 - range_ratio))), int(output_len * (1 + range_ratio)))
    return il, ol


def random_dataset(tok, n, input_len, output_len, range_ratio=0.0, prefix_len=0, seed=0, chat=False) -> list[Sample]:
    """Random token prompts of exact length (re-encoded and trimmed so the server counts the same);
    an optional shared prefix. Completions get token ids, chat gets the decoded text."""
    rng = random.Random(seed)
    vocab = tok.vocab_size
    lo_id, hi_id = min(1000, vocab // 4), vocab - 1
    prefix = [rng.randint(lo_id, hi_id) for _ in range(prefix_len)]
    out = []
    for _ in range(n):
        il, ol = draw_lengths(rng, input_len, output_len, range_ratio)
        body = prefix + [rng.randint(lo_id, hi_id) for _ in range(max(1, il - prefix_len))]
        text = tok.decode(body, skip_special=True)
        ids = tok.encode(text)
        while len(ids) < il:  # re-encoding can merge tokens: top up, then trim to the exact count
            ids = ids + tok.encode(" " + tok.decode([rng.randint(lo_id, hi_id)]), add_bos=False)
        ids = ids[:il]
        out.append(Sample(tok.decode(ids, skip_special=False) if chat else ids, il, ol))
    return out


def file_dataset(path, tok, n, output_len) -> list[Sample]:
    """JSONL of {"prompt": str} (optionally "output_len"), or a ShareGPT JSON list."""
    rows = []
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("["):
        for conv in json.loads(text):
            turns = conv.get("conversations") or []
            if len(turns) >= 2:
                rows.append(
                    {"prompt": turns[0]["value"], "output_len": len(tok.encode(turns[1]["value"], add_bos=False))}
                )
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    out = []
    for r in rows[:n]:
        ids = tok.encode(r["prompt"])
        out.append(Sample(r["prompt"], len(ids), int(r.get("output_len") or output_len)))
    return out


def gamma_offsets(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Arrival offsets with gamma gaps of shape `burstiness` (1 = Poisson), rescaled so the last
    arrival lands at n / rate, as vLLM does."""
    if rate == float("inf"):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    t = np.cumsum(gaps)
    t = t * (n / rate) / t[-1]
    return [float(x) for x in t]


def compute_metrics(results: list[Result], duration: float, percentiles=(50, 90, 99), goodput=None) -> dict:
    ok = [r for r in results if r.success and not r.probe]
    ttft, itl, tpot, e2el = [], [], [], []
    for r in ok:
        a, gaps, b, c = request_metrics(r.send, r.chunk_times, r.output_tokens)
        ttft.append(a)
        itl += gaps
        e2el.append(c)
        if b is not None:
            tpot.append(b)
    out_tokens = sum(r.output_tokens or len(r.chunk_times) for r in ok)
    in_tokens = sum(r.prompt_len for r in ok)
    m = {
        "duration": duration,
        "completed": len(ok),
        "failed": sum(1 for r in results if not r.success and not r.probe),
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        m.update(summarize(name, xs, percentiles))
    # Peak output tok/s over 1 s buckets, and the most requests in flight at once.
    times = np.fromiter((t for r in ok for t in r.chunk_times), dtype=np.float64)
    if times.size:
        start = min(r.send for r in ok)
        buckets = np.bincount((times - start).astype(np.int64))  # int() truncates too (times >= start)
        m["max_output_tokens_per_s"] = float(buckets.max())
        edges = sorted([(r.send, 1) for r in ok] + [(r.chunk_times[-1], -1) for r in ok])
        cur = peak = 0
        for _, d in edges:
            cur += d
            peak = max(peak, cur)
        m["max_concurrent_requests"] = peak
    if goodput:
        good = 0
        for r in ok:
            t = r.chunk_times
            v = {
                "ttft": (t[0] - r.send) * 1e3,
                "e2el": (t[-1] - r.send) * 1e3,
                "itl": max([b - a for a, b in zip(t, t[1:])] or [0]) * 1e3,
                "tpot": ((t[-1] - t[0]) / max(1, (r.output_tokens or len(t)) - 1)) * 1e3,
            }
            good += all(v[k] <= lim for k, lim in goodput.items())
        m["request_goodput"] = good / duration
    probes = [r for r in results if r.probe and r.success]
    if probes:
        m["probe_completed"] = len(probes)
        m.update(
            {
                f"probe_{k}": v
                for k, v in summarize("ttft", [r.chunk_times[0] - r.send for r in probes], percentiles).items()
            }
        )
    queued = [r.queued for r in results if not r.probe]
    m["mean_client_queue_ms"] = 1e3 * sum(queued) / max(1, len(queued))
    return m


def checks(results: list[Result], ignore_eos: bool) -> list[str]:
    """What would make the run untrustworthy: failures, short outputs, error finish reasons."""
    warn = []
    failed = [r for r in results if not r.success]
    if failed:
        warn.append(f"{len(failed)} requests failed, e.g. {failed[0].error}")
    if ignore_eos:
        short = [r for r in results if r.success and r.output_tokens != r.output_len]
        if short:
            warn.append(
                f"{len(short)} requests returned fewer/more tokens than asked with ignore_eos "
                f"(e.g. {short[0].output_tokens} of {short[0].output_len})"
            )
    bad = [r for r in results for f in r.finish_reasons if f not in ("length", "stop")]
    if bad:
        warn.append(f"{len(bad)} finish reasons report errors: {bad[0].finish_reasons}")
    return warn


def print_table(m: dict, percentiles=(50, 90, 99)) -> None:
    print("{s:=^60}".format(s=" Serving Benchmark Result "))
    for k in (
        "completed",
        "failed",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "total_token_throughput",
        "request_goodput",
        "mean_client_queue_ms",
    ):
        if k in m:
            print(f"{k:<40}{m[k]:>16.2f}" if isinstance(m[k], float) else f"{k:<40}{m[k]:>16}")
    for name in ("ttft", "tpot", "itl", "e2el", "probe_ttft"):
        keys = [f"mean_{name}_ms", f"median_{name}_ms"] + [f"p{p:g}_{name}_ms" for p in percentiles]
        keys = [k if not name.startswith("probe") else "probe_" + k.replace("probe_", "") for k in keys]
        if all(k in m for k in keys):
            print("{s:-^60}".format(s=name.upper()))
            for k in keys:
                print(f"{k:<40}{m[k]:>16.2f}")
    print("=" * 60)


def probe_schedule(tok, rate: float, horizon: float, seed: int, chat: bool = False) -> list[tuple[Sample, float]]:
    """Poisson probes (32 in / 16 out) over [0, horizon): the stall a small newcomer feels."""
    if not rate:
        return []
    rng = np.random.default_rng(seed + 1)
    times = []
    t = rng.exponential(1.0 / rate)
    while t < horizon:
        times.append(t)
        t += rng.exponential(1.0 / rate)
    samples = random_dataset(tok, len(times), 32, 16, seed=seed + 2, chat=chat)
    for s in samples:
        s.probe = True
    return list(zip(samples, times))


def add_workload_args(p) -> None:
    """The workload flags `bench serve` and `tailgate sim` share (vLLM's names and defaults)."""
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--random-input-len", type=int, default=256)
    p.add_argument("--random-output-len", type=int, default=64)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--request-rate", type=float, default=float("inf"))
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--metric-percentiles", default="50,90,99")
    p.add_argument("--seed", type=int, default=0)
