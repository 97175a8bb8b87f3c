"""`tailgate bench engine`: an in-process load generator against the engine (no HTTP), door off
vs on in alternating rounds. Closed loop at concurrency C (4*C requests), and a bursty pattern:
live streams plus bursts of coincident arrivals."""

from __future__ import annotations

import random
import threading
import time

from ..config import resolve
from ..engine.request import Finished, Rejected, Request, Scheduled, Token
from .stats import ab_table, percentile, request_metrics


class Run:
    def __init__(self, engine):
        self.engine = engine
        self.lock = threading.Condition()
        self.records = {}

    def submit(self, prompt, max_tokens, on_done=None):
        r = Request(prompt=prompt, max_tokens=max_tokens, ignore_eos=True)
        rec = {"send": time.monotonic(), "tokens": [], "scheduled": None, "done": False}
        self.records[r.id] = rec

        def sink(ev):
            if isinstance(ev, Token):
                rec["tokens"].append(ev.at)
            elif isinstance(ev, Scheduled):
                rec["scheduled"] = ev.at
            elif isinstance(ev, (Finished, Rejected)):
                with self.lock:
                    rec["done"] = True
                    rec["reason"] = getattr(ev, "reason", "")
                    self.lock.notify_all()
                if on_done:
                    on_done()

        r.sink = sink
        r.arrival = rec["send"]
        self.engine.submit(r)
        return rec

    def wait_all(self, timeout=1800):
        with self.lock:
            self.lock.wait_for(lambda: all(r["done"] for r in self.records.values()), timeout)

    def summary(self, wall: float, only=None) -> dict:
        recs = [r for r in self.records.values() if only is None or only(r)]
        ttft, itl, tpot = [], [], []
        for r in recs:
            if not r["tokens"]:
                continue
            a, gaps, b, _ = request_metrics(r["send"], r["tokens"])
            ttft.append(a)
            itl += gaps
            if b is not None:
                tpot.append(b)
        toks = sum(len(r["tokens"]) for r in recs)
        return {
            "requests": len(recs),
            "failed": sum(1 for r in recs if r.get("reason") not in ("length", "stop")),
            "output_tok_s": toks / wall,
            "ttft_p50_ms": 1e3 * percentile(ttft, 50),
            "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "tpot_p50_ms": 1e3 * percentile(tpot, 50),
            "itl_p50_ms": 1e3 * percentile(itl, 50),
            "itl_p99_ms": 1e3 * percentile(itl, 99),
            "itl_max_ms": 1e3 * max(itl, default=0),
        }


def prompt_ids(rng, n, vocab=20000):
    return [2] + [rng.randrange(1000, vocab) for _ in range(n - 1)]


def closed_loop(engine, c, n_requests, in_len, out_len, seed=0):
    rng = random.Random(seed)
    prompts = [prompt_ids(rng, in_len) for _ in range(n_requests)]
    run = Run(engine)
    lock = threading.Lock()
    it = iter(prompts)

    def next_one():
        with lock:
            p = next(it, None)
        if p is not None:
            run.submit(p, out_len, on_done=next_one)

    t0 = time.monotonic()
    for _ in range(c):
        next_one()
    while True:
        run.wait_all()
        if len(run.records) == n_requests:
            run.wait_all()
            break
        time.sleep(0.01)
    return run.summary(time.monotonic() - t0)


def bursty(engine, streams, arrivals, mean_gap_s, in_len, out_len, burstiness=0.5, seed=0):
    """`streams` long-lived streams decode while `arrivals` short requests come in with gamma gaps
    of shape `burstiness` (< 1: clumped); the live streams' ITL is the tail the door protects."""
    from .serve import gamma_offsets

    rng = random.Random(seed)
    run = Run(engine)
    t0 = time.monotonic()
    live = [run.submit(prompt_ids(rng, in_len), out_len * 4) for _ in range(streams)]
    for r in live:
        r["live"] = True
    time.sleep(1.0)
    start = time.monotonic()
    for at in gamma_offsets(arrivals, 1.0 / mean_gap_s, burstiness, seed):
        time.sleep(max(0.0, start + at - time.monotonic()))
        run.submit(prompt_ids(rng, in_len), out_len)
    run.wait_all()
    wall = time.monotonic() - t0
    out = run.summary(wall)
    s = run.summary(wall, only=lambda r: r.get("live"))
    out.update(
        {
            "stream_itl_p50_ms": s["itl_p50_ms"],
            "stream_itl_p99_ms": s["itl_p99_ms"],
            "stream_itl_max_ms": s["itl_max_ms"],
        }
    )
    return out


def run(
    model="gemma3-270m",
    doors=("off", "300"),
    concurrencies=(4, 8, 16),
    rounds=2,
    in_len=256,
    out_len=64,
    dtype="auto",
    slots=16,
    bursty_too=True,
    loaded=None,
    emit=print,
):
    from ..assemble import build_engine
    from ..model.formats.weights import load_model

    m = loaded or load_model(model)
    results = {}
    cells = [("closed", c) for c in concurrencies] + ([("bursty", 0)] if bursty_too else [])
    for rnd in range(rounds):
        order = list(doors) if rnd % 2 == 0 else list(doors)[::-1]  # alternate which arm goes first
        for kind, c in cells:
            for door in order:
                knobs = {"DECODE_SLOTS": str(slots), "ADMIT_COALESCE_MS": door, "MAX_CONTEXT": "1024"}
                engine, _, cfg = build_engine(model, resolve(lambda k: knobs.get(k)), dtype=dtype, loaded=m)
                engine.start()
                try:
                    if kind == "closed":
                        res = closed_loop(engine, c, 4 * c, in_len, out_len, seed=rnd)
                    else:
                        res = bursty(
                            engine,
                            streams=8,
                            arrivals=16,
                            mean_gap_s=0.4,
                            in_len=in_len,
                            out_len=out_len // 2,
                            seed=rnd,
                        )
                    hold = engine.scheduler.metrics.door_hold
                    res["held_mean_ms"] = 1e3 * hold.total / hold.n if hold.n else 0.0
                    res["held_n"] = hold.n
                finally:
                    engine.stop()
                key = f"{kind}-c{c}" if kind == "closed" else kind
                results.setdefault(key, {}).setdefault(door, []).append(res)
                emit(
                    f"round {rnd} {key:10s} door={door:>4s} "
                    + " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items())
                )
    return results


def table(results: dict, doors) -> str:
    metrics = ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "held_mean_ms"]
    out = []
    for cell, arms in results.items():
        ms = metrics + (["stream_itl_p99_ms", "stream_itl_max_ms"] if cell == "bursty" else [])
        out.append(f"\n{cell}\n" + ab_table(list(doors), arms, ms))
    return "\n".join(out)
