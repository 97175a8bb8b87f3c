"""`tailgate bench serve`: a serving benchmark for any OpenAI-compatible server, timed exactly as
vLLM's `bench serve` defines TTFT, ITL, TPOT and E2EL, with vLLM's result field names."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

from ..server.feed import KEEP_S

# The workload generators and the metric arithmetic live in workload.py (the simulator reads them
# without this module's HTTP client); imported here under their old names for every caller.
from .workload import (
    Result,
    Sample,
    add_workload_args,
    checks,
    compute_metrics,
    file_dataset,  # noqa: F401
    gamma_offsets,
    print_table,
    probe_schedule,
    random_dataset,
)


async def send_one(
    client, url, sample: Sample, model, kind, temperature, ignore_eos, headers, extra: dict | None = None
) -> Result:
    res = Result(sample.prompt_len, sample.output_len, sample.probe)
    if kind == "chat":
        body = {
            "model": model,
            "messages": [{"role": "user", "content": sample.prompt}],
            "max_completion_tokens": sample.output_len,
        }
    else:
        body = {"model": model, "prompt": sample.prompt, "max_tokens": sample.output_len}
    body.update(
        {
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": ignore_eos,
        }
    )
    body.update(extra or {})  # e.g. a constraint every request carries (`bench ab --arm-body`)
    res.send = time.perf_counter()
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data.strip() == "[DONE]":
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res.error = str(obj["error"])[:200]
                    return res
                now = time.perf_counter()
                if obj.get("choices"):
                    ch = obj["choices"][0]
                    delta = ch.get("delta") or {}
                    # A token's chunk: TTFT on the first, an ITL gap for each after. Its text may be
                    # empty (held back: a partial character), as vLLM's client counts it too; chat's
                    # role-only opening carries no token.
                    token = "text" in ch if kind != "chat" else ("content" in delta and "role" not in delta)
                    if token or delta.get("tool_calls"):
                        res.chunk_times.append(now)
                        res.chunk_causes.append((obj.get("tailgate") or {}).get("cause"))
                    if ch.get("finish_reason"):
                        res.finish_reasons.append(ch["finish_reason"])
                if obj.get("usage"):
                    res.output_tokens = obj["usage"].get("completion_tokens") or 0
        res.success = bool(res.chunk_times)
        if not res.success:
            res.error = "no content chunk"
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


async def run_load(
    base_url,
    endpoint,
    model,
    samples,
    rate,
    burstiness,
    concurrency,
    probes,
    temperature,
    ignore_eos,
    api_key=None,
    seed=0,
    progress=True,
    extra=None,
) -> tuple[list[Result], float]:
    kind = "chat" if "chat" in endpoint else "completion"
    url = base_url.rstrip("/") + endpoint
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(samples) + len(probes), desc="requests", file=sys.stderr)
    async with httpx.AsyncClient(timeout=httpx.Timeout(6 * 3600.0), limits=limits) as client:

        async def go(s: Sample, at: float, t0: float):
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            q0 = time.perf_counter()
            if sem is not None and not s.probe:  # probes bypass the cap: they measure a newcomer's stall
                async with sem:
                    r = await send_one(client, url, s, model, kind, temperature, ignore_eos, headers, extra)
            else:
                r = await send_one(client, url, s, model, kind, temperature, ignore_eos, headers, extra)
            r.queued = r.send - q0
            if bar:
                bar.update(1)
            return r

        offsets = gamma_offsets(len(samples), rate, burstiness, seed)
        t0 = time.perf_counter()
        tasks = [go(s, at, t0) for s, at in zip(samples, offsets)]
        tasks += [go(s, at, t0) for s, at in probes]
        results = await asyncio.gather(*tasks)
        dur = time.perf_counter() - t0
    if bar:
        bar.close()
    return list(results), dur


async def engine_view(
    base_url: str, api_key=None, hello_only: bool = False, window_s: float | None = None
) -> dict | None:
    """A tailgate server's own view from its dashboard feed (/dashboard/feed): the first tick's
    engine ITL, socket ITL and delivery delay over the last `window_s` seconds (the run's, so the
    server's figures cover the run the client timed; the feed's minute unless given; None from a
    server without one). Read once before a run with `hello_only`, it starts the server's gap
    window (which a server nobody watches does not keep)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    query = f"?window={min(max(window_s, 1.0), KEEP_S):.1f}" if window_s is not None else ""
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            async with client.stream("GET", base_url.rstrip("/") + "/dashboard/feed" + query, headers=headers) as r:
                if r.status_code != 200:
                    return None
                kind = None
                async for line in r.aiter_lines():
                    if line.startswith("event: "):
                        kind = line[7:]
                    elif line.startswith("data: ") and (kind == "tick" or hello_only):
                        return json.loads(line[6:])
    except (httpx.HTTPError, json.JSONDecodeError):
        return None
    return None


def print_engine_view(view: dict | None) -> None:
    """The server's figures beside the client's (say which is which: docs/bench.md)."""
    if not view or "itl" not in view:
        return
    ms = lambda v: "-" if v is None else f"{1000 * v:.2f}"  # noqa: E731
    title = f" Server's own view (last {view['itl'].get('window_s', 60):.0f} s) "
    print("{s:{c}^{n}}".format(s=title, n=50, c="-"))
    for label, key in (("engine ITL", "itl"), ("socket ITL", "socket_itl"), ("delivery delay", "delivery")):
        if key in view:
            v = view[key]
            print("{:<40}{:<10}".format(f"{label} p50 / p99 (ms):", f"{ms(v['p50_s'])} / {ms(v['p99_s'])}"))


def main(args) -> int:
    from ..model.formats.weights import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    chat = "chat" in args.endpoint
    n = args.num_prompts
    if args.dataset_path:
        samples = file_dataset(args.dataset_path, tok, n, args.random_output_len)
    else:
        samples = random_dataset(
            tok,
            n,
            args.random_input_len,
            args.random_output_len,
            args.random_range_ratio,
            args.random_prefix_len,
            args.seed,
            chat,
        )
    horizon = n / args.request_rate if args.request_rate != float("inf") else 30.0
    probes = probe_schedule(tok, args.probe_request_rate, horizon, args.seed, chat)
    pct = tuple(float(p) for p in args.metric_percentiles.split(","))
    goodput = dict((k, float(v)) for k, v in (g.split(":") for g in args.goodput)) if args.goodput else None
    asyncio.run(engine_view(args.base_url, args.api_key, hello_only=True))
    began = time.monotonic()
    results, dur = asyncio.run(
        run_load(
            args.base_url,
            args.endpoint,
            args.model,
            samples,
            args.request_rate,
            args.burstiness,
            args.max_concurrency,
            probes,
            args.temperature,
            args.ignore_eos,
            args.api_key,
            args.seed,
            extra=json.loads(args.extra_body) if args.extra_body else None,
        )
    )
    m = compute_metrics(results, dur, pct, goodput)
    print_table(m, pct)
    # The server's gaps over the whole run (and a second's slack), not only its last minute.
    view = asyncio.run(engine_view(args.base_url, args.api_key, window_s=time.monotonic() - began + 1.0))
    print_engine_view(view)
    for w in checks(results, args.ignore_eos):
        print("WARNING:", w, file=sys.stderr)
    if args.save_result:
        out = {
            "date": time.strftime("%Y%m%d-%H%M%S"),
            "backend": "openai",
            "model_id": args.model,
            "num_prompts": n,
            "request_rate": args.request_rate,
            "burstiness": args.burstiness,
            "max_concurrency": args.max_concurrency,
            **m,
        }
        if view and "itl" in view:  # the server's own figures, beside the client's
            out["server_view"] = {k: view[k] for k in ("itl", "socket_itl", "delivery") if k in view}
        if args.save_detailed:
            ok = [r for r in results if not r.probe]
            out.update(
                {
                    "input_lens": [r.prompt_len for r in ok],
                    "output_lens": [r.output_tokens for r in ok],
                    "ttfts": [(r.chunk_times[0] - r.send) if r.chunk_times else None for r in ok],
                    "itls": [[b - a for a, b in zip(r.chunk_times, r.chunk_times[1:])] for r in ok],
                    "start_times": [r.send for r in ok],
                    "token_times": [r.chunk_times for r in ok],
                    "token_causes": [r.chunk_causes for r in ok],
                    "errors": [r.error for r in ok],
                }
            )
        with open(args.save_result, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if checks(results, args.ignore_eos) and args.strict else 0


def add_args(p) -> None:
    add_workload_args(p)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default="gemma3-270m", help="the served model name sent in requests")
    p.add_argument("--tokenizer", default="gemma3-270m", help="tokenizer to build exact-length prompts with")
    p.add_argument("--dataset-name", default="random", choices=["random"])
    p.add_argument("--dataset-path", default=None, help='JSONL of {"prompt": ...} or a ShareGPT JSON file')
    p.add_argument("--random-prefix-len", type=int, default=0)
    p.add_argument("--probe-request-rate", type=float, default=0.0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--goodput", nargs="*", default=None, help="e.g. ttft:500 itl:100")
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--extra-body",
        default=None,
        help='a JSON object merged into every request body, e.g. \'{"structured_outputs": {"regex": "[a-z ]+"}}\'',
    )
    p.add_argument("--save-result", default=None)
    p.add_argument("--save-detailed", action="store_true")
    p.add_argument("--strict", action="store_true", help="exit 1 when a trust check fails")
