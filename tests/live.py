"""A live `tailgate serve` process for the HTTP gates (one per test session, see conftest.py),
and the small probes the tests read it with."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx

from tailgate.bench.ab import free_port

MODEL = "gemma3-270m"
# 2 slots, a 512-token context, a 24-token default completion and a 3-request queue: small enough
# that the gates can fill it and quick to step on either CPU.
ENV = {"TAILGATE_DECODE_SLOTS": "2", "TAILGATE_MAX_CONTEXT": "512", "TAILGATE_DEFAULT_MAX_TOKENS": "24"}
ARGS = ["--dtype", "auto", "--max-queued-requests", "3", "--log-level", "warning"]


def start_server(timeout: float = 120, args=(), **env):
    """(process, base URL, the /health codes seen while it loaded); `args`: more command-line
    arguments (e.g. another --model); `env`: more TAILGATE_ knobs."""
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "tailgate.cli", "serve", "--port", str(port), *ARGS, *args],
                         env={**os.environ, **ENV, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True)
    base = f"http://127.0.0.1:{port}"
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            code = httpx.get(base + "/health", timeout=2).status_code
            if not seen or seen[-1] != code:
                seen.append(code)
            if code == 200:
                break
        except httpx.TransportError:
            pass
        assert p.poll() is None, p.stderr.read()
        time.sleep(0.05)
    return p, base, seen


def pages_used(base) -> float:
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("tailgate:kv_pages_used"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no tailgate:kv_pages_used in /metrics")


def wait_idle(base, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end and pages_used(base) != 0:
        time.sleep(0.05)
    return pages_used(base)


def post(base, path, body, raw=False):
    return httpx.post(base + path, content=body if raw else json.dumps(body),
                      headers={"content-type": "application/json"}, timeout=120)
