"""`tailgate bench soak`: minutes of hostile mixed load against a server it starts itself, then
an audit of what came back.

The load: Poisson arrivals at ~1.5x the server's measured capacity (a short closed-loop
calibration first), greedy completions and chats from a fixed pool of distinct bodies, streamed or
not; a share of clients hang up mid-request; a share of requests are bad (malformed JSON, NaN,
wrong types, refused fields, a text/plain POST, an impossible fan-out); every so often a burst
larger than the server's queue. The audit: status counts, every completed response compared with
a greedy re-run of the same body on the idle server afterwards (lost or garbled responses), KV
pages after the drain, and the server's RSS at the start and the end.

The default server runs `--dtype fp32`: the exact path, where a row's tokens do not depend on the
batch it rode in (with `--kernels auto` small steps take the q8 kernel and large ones oneDNN fp32,
so a greedy text may legitimately differ with the load).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from .ab import free_port, wait_healthy

WORDS = (
    "river town market baker bell noon cloth spice keys door story light stone boat winter garden "
    "music letter window road mountain evening friend machine number reason answer question"
).split()
BAD = [  # (path, content type, raw body): each must be refused with a 4xx and an OpenAI error body
    ("/v1/completions", "application/json", b'{"prompt": "hi", "temperature": NaN}'),
    ("/v1/completions", "application/json", b'{"prompt": 7}'),
    ("/v1/completions", "application/json", b'{"prompt": "hi", "max_tokens": -1}'),
    ("/v1/completions", "application/json", b'{"prompt": "hi", "bad_words": ["x"]}'),
    ("/v1/completions", "text/plain", b'{"prompt": "hi"}'),
    ("/v1/completions", "application/json", b"{not json"),
    ("/v1/chat/completions", "application/json", b'{"messages": []}'),
    ("/v1/completions", "application/json", b'{"prompt": [5, 1000000000]}'),
    ("/v1/completions", "application/json", b'{"prompt": "hi", "seed": ' + str(1 << 70).encode() + b"}"),
    ("/v1/completions", "application/json", b'{"prompt": ' + b"[" * 20000 + b"]" * 20000 + b"}"),
    ("/v1/completions", "application/json", b'{"prompt": ["a", "b", "c"], "n": 16, "max_tokens": 4}'),
    ("/v1/chat/completions", "application/json", b'{"messages": [{"role": "user", "content": "\\ud800"}]}'),
]


@dataclass
class Outcome:
    kind: str  # "good" | "bad" | "burst"
    body: int = -1  # index into the pool (good and burst requests)
    stream: bool = False
    hangup: bool = False  # this client meant to leave early
    status: int = 0  # HTTP status; 0: no response (transport error)
    text: str | None = None  # completed output text
    complete: bool = False  # a whole response: finish_reason (and [DONE] when streamed)
    error: str = ""


@dataclass
class Soak:
    base: str
    pool: list[tuple[str, dict]]
    outcomes: list[Outcome] = field(default_factory=list)


def make_pool(n: int, seed: int) -> list[tuple[str, dict]]:
    """n distinct greedy request bodies: (path, body)."""
    rng = random.Random(seed)
    pool = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 160)))
        mt = rng.randint(8, 48)
        if i % 3 == 2:
            pool.append(
                (
                    "/v1/chat/completions",
                    {"messages": [{"role": "user", "content": words}], "max_tokens": mt, "temperature": 0},
                )
            )
        else:
            pool.append(("/v1/completions", {"prompt": words, "max_tokens": mt, "temperature": 0}))
    return pool


def _piece(obj: dict) -> tuple[str, str | None]:
    ch = obj["choices"][0]
    text = ch.get("text") if "text" in ch else (ch.get("delta") or ch.get("message") or {}).get("content")
    return text or "", ch.get("finish_reason")


async def send(client: httpx.AsyncClient, s: Soak, o: Outcome, rng: random.Random) -> None:
    path, body = s.pool[o.body]
    body = {**body, "stream": o.stream}
    leave_after = rng.randint(1, 6)  # chunks (streamed) before a hang-up
    try:
        if not o.stream:
            timeout = rng.uniform(0.3, 3.0) if o.hangup else 600
            r = await client.post(s.base + path, json=body, timeout=timeout)
            o.status = r.status_code
            if r.status_code == 200:
                o.text, fin = _piece(r.json())
                o.complete = fin is not None
            else:
                o.error = r.text[:200]
            return
        async with client.stream("POST", s.base + path, json=body, timeout=600) as r:
            o.status = r.status_code
            if r.status_code != 200:
                o.error = (await r.aread()).decode(errors="replace")[:200]
                return
            parts, fin, done, n = [], None, False, 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                obj = json.loads(line[6:])
                if "error" in obj:
                    o.error = json.dumps(obj)[:200]
                    return
                text, f = _piece(obj)
                parts.append(text)
                fin = fin or f
                n += 1
                if o.hangup and n >= leave_after:
                    return  # leaving the `with` closes the connection mid-stream
            o.text, o.complete = "".join(parts), done and fin is not None
    except httpx.TimeoutException:
        o.error = "client timeout" if o.hangup else "timeout"
    except httpx.HTTPError as e:
        o.error = f"transport: {e!r}"


async def send_bad(client: httpx.AsyncClient, s: Soak, o: Outcome, which: int) -> None:
    path, ctype, raw = BAD[which]
    try:
        r = await client.post(s.base + path, content=raw, headers={"content-type": ctype}, timeout=120)
        o.status = r.status_code
        o.complete = "error" in r.json()
    except (httpx.HTTPError, ValueError) as e:
        o.error = repr(e)[:200]


async def calibrate(s: Soak, seconds: float, concurrency: int) -> float:
    """Completed requests per second of a closed loop at `concurrency` (non-streamed pool bodies)."""
    done, end = 0, time.monotonic() + seconds
    rng = random.Random(1)

    async def worker(client):
        nonlocal done
        while time.monotonic() < end:
            o = Outcome("good", rng.randrange(len(s.pool)))
            await send(client, s, o, rng)
            done += o.status == 200

    t0 = time.monotonic()
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return done / (time.monotonic() - t0)


async def load(
    s: Soak,
    seconds: float,
    rate: float,
    hangup: float,
    bad: float,
    stream: float,
    burst_every: float,
    burst_size: int,
    seed: int,
) -> None:
    rng = random.Random(seed)
    tasks, t0 = [], time.monotonic()
    next_burst = t0 + burst_every
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None)) as client:
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(rng.expovariate(rate))
            if rng.random() < bad:
                o = Outcome("bad")
                tasks.append(asyncio.create_task(send_bad(client, s, o, rng.randrange(len(BAD)))))
            else:
                o = Outcome("good", rng.randrange(len(s.pool)), rng.random() < stream, rng.random() < hangup)
                tasks.append(asyncio.create_task(send(client, s, o, random.Random(rng.random()))))
            s.outcomes.append(o)
            if time.monotonic() >= next_burst:
                next_burst += burst_every
                for _ in range(burst_size):
                    b = Outcome("burst", rng.randrange(len(s.pool)), True)
                    s.outcomes.append(b)
                    tasks.append(asyncio.create_task(send(client, s, b, random.Random(rng.random()))))
        await asyncio.gather(*tasks)


def scrape(base: str, name: str) -> float:
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def audit(s: Soak) -> dict:
    """Re-run every pool body that completed at least once, alone and greedy; compare."""
    used = sorted({o.body for o in s.outcomes if o.kind != "bad" and o.complete and o.text is not None})
    ref = {}
    for i in used:
        path, body = s.pool[i]
        ref[i] = _piece(httpx.post(s.base + path, json=body, timeout=600).json())[0]
    good = [o for o in s.outcomes if o.kind != "bad"]
    bad = [o for o in s.outcomes if o.kind == "bad"]
    completed = [o for o in good if o.complete]
    garbled = [o for o in completed if o.text != ref[o.body]]
    # Lost: a client that stayed got neither a whole response nor an HTTP error status.
    lost = [o for o in good if not o.hangup and not o.complete and not 400 <= o.status < 600]
    codes = Counter(o.status for o in good)
    return {
        "requests": len(s.outcomes),
        "good": len(good),
        "bad": len(bad),
        "completed": len(completed),
        "hung_up": sum(o.hangup for o in good),
        "status_2xx": sum(200 <= o.status < 300 for o in good),
        "status_429": codes.get(429, 0),
        "status_4xx_good": sum(400 <= o.status < 500 and o.status != 429 for o in good),
        "status_5xx": sum(o.status >= 500 for o in s.outcomes),
        "bad_refused_4xx": sum(400 <= o.status < 500 and o.complete for o in bad),
        "bad_not_refused": [o.status for o in bad if not (400 <= o.status < 500 and o.complete)],
        "lost": len(lost),
        "lost_examples": [o.error for o in lost[:5]],
        "garbled": len(garbled),
        "distinct_bodies_checked": len(ref),
    }


def main(args) -> int:
    port = free_port()
    cmd = args.server_cmd.format(port=port, python=sys.executable)
    log = open(args.log, "w") if args.log else subprocess.DEVNULL
    p = subprocess.Popen(shlex.split(cmd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, p, 600)
        s = Soak(base, make_pool(args.pool, args.seed))
        rate = args.rate
        if rate is None:
            cap = asyncio.run(calibrate(s, args.calibrate_s, args.calibrate_concurrency))
            rate = 1.5 * cap
            print(
                f"calibration: {cap:.2f} req/s closed loop at c={args.calibrate_concurrency}; load at {rate:.2f} req/s"
            )
        rss0 = rss_mb(p.pid)
        t0 = time.monotonic()
        asyncio.run(
            load(
                s,
                args.minutes * 60,
                rate,
                args.hangup,
                args.bad,
                args.stream,
                args.burst_every,
                args.burst_size,
                args.seed,
            )
        )
        wall = time.monotonic() - t0
        end = time.monotonic() + 300
        while time.monotonic() < end and (
            scrape(base, "tailgate:kv_pages_used") or scrape(base, "vllm:num_requests_running")
        ):
            time.sleep(0.5)
        pages = scrape(base, "tailgate:kv_pages_used")
        rss1 = rss_mb(p.pid)
        out = {
            "minutes": args.minutes,
            "wall_s": round(wall, 1),
            "rate_req_s": round(rate, 3),
            "server_cmd": args.server_cmd,
            **audit(s),
            "kv_pages_after_drain": pages,
            "rss_start_mb": round(rss0),
            "rss_end_mb": round(rss1),
            "alive_after": httpx.get(base + "/health", timeout=10).status_code == 200,
        }
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    for k, v in out.items():
        print(f"{k:26s} {v}")
    if args.save:
        with open(args.save, "w") as f:
            json.dump(out, f, indent=1)
    ok = not (
        out["status_5xx"] or out["lost"] or out["garbled"] or out["bad_not_refused"] or out["kv_pages_after_drain"]
    )
    return 0 if ok and out["alive_after"] else 1


def add_args(p) -> None:
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument(
        "--server-cmd",
        default="{python} -m tailgate.cli serve --dtype fp32 --max-queued-requests 32 "
        "--log-level warning --port {port}",
        help="the server to start ({port} and {python} are filled in)",
    )
    p.add_argument("--rate", type=float, default=None, help="arrivals per second (default: 1.5x calibrated capacity)")
    p.add_argument("--calibrate-s", type=float, default=60)
    p.add_argument("--calibrate-concurrency", type=int, default=16)
    p.add_argument("--hangup", type=float, default=0.2, help="share of good clients that leave mid-request")
    p.add_argument("--bad", type=float, default=0.1, help="share of arrivals that are bad requests")
    p.add_argument("--stream", type=float, default=0.7, help="share of good requests that stream")
    p.add_argument("--burst-every", type=float, default=120, help="seconds between bursts past the queue limit")
    p.add_argument("--burst-size", type=int, default=48)
    p.add_argument("--pool", type=int, default=48, help="distinct request bodies")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None)
    p.add_argument("--log", default=None, help="write the server's output here")
