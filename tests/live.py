"""A live `tailgate serve` process for the HTTP gates (one per test session, see conftest.py),
and the small probes the tests read it with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import httpx

from tailgate.bench.ab import free_port

MODEL = "gemma3-270m"
# 2 slots, a 512-token context, a 24-token default completion and a 3-request queue: small enough
# that the gates can fill it and quick to step on either CPU.
# The grammar vocabulary is built at a test server's first structured request, not before ready
# (seconds each start; tests/test_server_settings.py's server builds it before ready and says so).
ENV = {
    "TAILGATE_DECODE_SLOTS": "2",
    "TAILGATE_MAX_CONTEXT": "512",
    "TAILGATE_DEFAULT_MAX_TOKENS": "24",
    "TAILGATE_GRAMMAR_WARMUP": "false",
}
ARGS = ["--dtype", "auto", "--max-queued-requests", "3", "--log-level", "warning"]


def log_tail(p, lines: int = 40) -> str:
    """The last `lines` lines the server wrote (stdout and stderr both go to its log file)."""
    try:
        with open(p.log_path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


def stop_server(p, timeout: float = 30) -> None:
    """Stop this very process (by its handle, never by name), then drop its log file."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout)
    try:
        os.unlink(p.log_path)
    except OSError:
        pass


def start_server(timeout: float = 300, args=(), **env):
    """(process, base URL, the /health codes seen while it loaded), once /health answers 200;
    `args`: more command-line arguments (e.g. another --model); `env`: more TAILGATE_ knobs.
    The server logs to a file (`p.log_path`; a pipe nobody reads would fill and block it). If it
    exits, or is not healthy within `timeout` seconds (a ceiling: a cold start converts the GGUF
    file first), it is stopped and this raises with its last log lines."""
    port = free_port()
    fd, log_path = tempfile.mkstemp(prefix="tailgate-serve-", suffix=".log")
    try:
        p = subprocess.Popen(
            [sys.executable, "-m", "tailgate.cli", "serve", "--port", str(port), *ARGS, *args],
            env={**os.environ, **ENV, **env},
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
        )
    finally:
        os.close(fd)  # the child has its own copy
    p.log_path = log_path
    base = f"http://127.0.0.1:{port}"
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            code = httpx.get(base + "/health", timeout=2).status_code
            if not seen or seen[-1] != code:
                seen.append(code)
            if code == 200:
                return p, base, seen
        except httpx.TransportError:
            pass
        why = (
            f"exited with status {p.returncode}"
            if p.poll() is not None
            else f"not healthy within {timeout:.0f} s"
            if time.monotonic() >= deadline
            else None
        )
        if why:
            tail = log_tail(p)
            stop_server(p)
            raise RuntimeError(
                f"tailgate serve on {base} {why} (/health codes seen: {seen}); its last log lines:\n{tail}"
            )
        time.sleep(0.05)


def chat_on_directory(d, messages, max_tokens: int) -> tuple[dict, str]:
    """Serve the checkpoint directory `d`, send one chat completion, stop the server: (the response
    body, the directory's own chat template from tokenizer_config.json)."""
    p, base, _ = start_server(args=["--model", str(d)])
    try:
        r = httpx.post(
            base + "/v1/chat/completions",
            json={"model": d.name, "messages": messages, "max_tokens": max_tokens},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return r.json(), json.loads((d / "tokenizer_config.json").read_text())["chat_template"]
    finally:
        stop_server(p)


def metric(base, name: str, **labels) -> float:
    """One sample of /metrics: the line of family `name` whose labels include `labels`; 0 if none."""
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith((name + " ", name + "{")) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def feed_ticks(base, since=-1, headers=None):
    """(event, payload) pairs of /dashboard/feed, as they arrive."""
    with httpx.stream("GET", f"{base}/dashboard/feed?since={since}", headers=headers, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                yield event, json.loads(line[6:])


def until(cond, timeout: float = 60) -> bool:
    """Poll `cond` until it holds (True) or `timeout` seconds pass (False): a ceiling on waiting
    for a condition, not a bound on how fast the host is."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)
    return True


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
    return httpx.post(
        base + path,
        content=body if raw else json.dumps(body),
        headers={"content-type": "application/json"},
        timeout=120,
    )
