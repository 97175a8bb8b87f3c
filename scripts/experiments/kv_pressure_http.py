"""Issue 25's HTTP check: under a KV budget that holds one full request, staggered concurrent greedy
streams with walked prompts all finish whole, each with the text it gives alone.

Starts `tailgate serve --dtype fp32` with MAX_CONTEXT=1024 and the smallest KV_CACHE_MB the server
accepts (it names the minimum when refused), sends the streams staggered, then each alone, and
compares token ids; prints /metrics' preemption count. Stops the server it started by its pid.

    .venv/bin/python scripts/experiments/kv_pressure_http.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import httpx

from tailgate.bench.ab import free_port

ENV = {"TAILGATE_MAX_CONTEXT": "1024", "TAILGATE_DECODE_SLOTS": "4"}
# (delay s, prompt tokens, max_tokens): a long stream, then walked prompts arriving into it
STREAMS = [(0.0, 16, 900), (4.0, 650, 120), (8.0, 400, 200), (12.0, 200, 300)]


def serve(mb: str, port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tailgate.cli", "serve", "--dtype", "fp32", "--port", str(port)],
        env={**os.environ, **ENV, "TAILGATE_KV_CACHE_MB": mb},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def minimum_mb() -> str:
    p = serve("1", free_port())
    out = p.communicate(timeout=300)[0]
    m = re.search(r"needs at least (\d+) MiB", out)
    assert p.returncode != 0 and m, out[-2000:]
    return m.group(1)


def prompt(n: int, salt: int) -> list[int]:
    return [2] + [1000 + (i * 37 + salt) % 20000 for i in range(n - 1)]


def complete(base: str, ids: list[int], max_tokens: int) -> list[int]:
    r = httpx.post(
        base + "/v1/completions",
        timeout=3000,
        json={"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "logprobs": 0},
    )
    r.raise_for_status()
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "length", c["finish_reason"]
    return c["logprobs"]["tokens"]


def metric(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def main() -> None:
    mb = minimum_mb()
    port = free_port()
    p = serve(mb, port)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert p.poll() is None, p.stdout.read()
            time.sleep(0.2)
        got: dict[int, list] = {}
        t0 = time.monotonic()

        def run(i, delay, n, k):
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            got[i] = complete(base, prompt(n, i), k)

        threads = [threading.Thread(target=run, args=(i, *s)) for i, s in enumerate(STREAMS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        together = time.monotonic() - t0
        pre = metric(base, "vllm:num_preemptions_total")
        alone = {i: complete(base, prompt(n, i), k) for i, (_, n, k) in enumerate(STREAMS)}
        print(
            f"KV_CACHE_MB={mb} (the least the server accepts at MAX_CONTEXT=1024, fp32); "
            f"{len(STREAMS)} staggered streams in {together:.0f} s; preemptions {pre:.0f}"
        )
        for i, (d, n, k) in enumerate(STREAMS):
            same = got[i] == alone[i]
            print(
                f"  stream {i}: +{d:.0f} s, {n}-token prompt, {k} tokens: {len(got[i])} tokens, "
                f"{'equal to' if same else 'DIFFERENT from'} its text alone"
            )
        assert all(got[i] == alone[i] and len(got[i]) == s[2] for i, s in enumerate(STREAMS))
    finally:
        p.terminate()
        p.wait(30)


if __name__ == "__main__":
    main()
