"""The serving benchmark against a tiny scripted OpenAI server: timings, schedules, caps, failures."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tailgate.bench import serve
from tailgate.bench.serve import Result, Sample, compute_metrics, gamma_offsets, run_load

FIRST_S, GAP_S, TOKENS = 0.10, 0.05, 5


class ScriptClock:
    """The benchmark's clock (`time.perf_counter` inside tailgate.bench.serve), moved by the
    scripted server: it shows each chunk's scripted time until the client has read it (stamped
    the chunk), so the client's stamps are the script's, however fast or slow the host is."""

    def __init__(self, t: float = 1000.0):
        self.t = t
        self.reads = 0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.reads += 1
            return self.t


class _ClockedTime:
    """Stands in for the `time` module inside tailgate.bench.serve: perf_counter is the script's."""

    def __init__(self, clock):
        self.perf_counter = clock

    def __getattr__(self, name):
        return getattr(time, name)


async def until(cond, timeout: float = 30.0) -> bool:
    """Poll `cond` on the server's loop until it holds; a ceiling, not a bound on the host's speed."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(0.001)
    return True


class FakeServer:
    """Streams TOKENS chunks: the first FIRST_S after the request, then one every GAP_S; counts
    requests in flight (from arrival to just before its final `[DONE]`, so a closed-loop client
    cannot send its next request before this one is counted out).

    With a ScriptClock the delays are the clock's, not slept: the server sets each chunk's time,
    sends it and waits for the client's stamp (one request at a time only). `meet`: the first
    chunk waits until that many requests have been in flight at once (a ceiling of 30 s), so a
    client that keeps C requests in flight is seen with C however it is scheduled."""

    def __init__(self, fail=False, clock: ScriptClock | None = None, meet: int = 0):
        self.fail = fail
        self.clock = clock
        self.meet = meet
        self.inflight = 0
        self.max_inflight = 0
        self.bodies = []  # every request body as received

        async def completions(req):
            if self.fail:
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            body = await req.json()
            self.bodies.append(body)
            start = self.clock.t if self.clock else None  # the client's send stamp: nothing moved it since
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)

            def chunk(i, last):
                return (
                    "data: "
                    + json.dumps(
                        {"choices": [{"index": 0, "text": f"t{i}", "finish_reason": "length" if last else None}]}
                    )
                    + "\n\n"
                )

            async def gen():
                try:
                    await until(lambda: self.max_inflight >= self.meet)
                    for i in range(body["max_tokens"]):
                        last = i == body["max_tokens"] - 1
                        if self.clock is None:
                            await asyncio.sleep(FIRST_S if i == 0 else GAP_S)
                            yield chunk(i, last)
                            continue
                        self.clock.t = start + FIRST_S + i * GAP_S
                        reads = self.clock.reads
                        yield chunk(i, last)
                        if not await until(lambda: self.clock.reads > reads):
                            raise RuntimeError(f"the client never stamped chunk {i}")
                    yield (
                        "data: "
                        + json.dumps({"choices": [], "usage": {"completion_tokens": body["max_tokens"]}})
                        + "\n\n"
                    )
                finally:
                    self.inflight -= 1
                yield "data: [DONE]\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream")

        app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"])])
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)
        return self

    def __exit__(self, *a):
        self.server.should_exit = True
        self.thread.join(10)

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"


def samples(n, out=TOKENS):
    return [Sample([1, 2, 3], 3, out) for _ in range(n)]


def test_metrics_equal_hand_computed_values():
    r1 = Result(3, 3, False, send=0.0, chunk_times=[0.1, 0.3, 0.4], output_tokens=3, success=True)
    r2 = Result(3, 2, False, send=1.0, chunk_times=[1.5, 1.6], output_tokens=2, success=True)
    m = compute_metrics([r1, r2], duration=2.0, percentiles=(50, 99))
    assert m["mean_ttft_ms"] == pytest.approx(300.0) and m["median_ttft_ms"] == pytest.approx(300.0)
    assert m["p99_ttft_ms"] == pytest.approx(100 + 400 * 0.99)
    # ITL pools every gap: 200, 100, 100 ms.
    assert m["mean_itl_ms"] == pytest.approx(400 / 3) and m["median_itl_ms"] == pytest.approx(100.0)
    # TPOT = (E2EL - TTFT) / (tokens - 1): 150 and 100 ms.
    assert m["mean_tpot_ms"] == pytest.approx(125.0)
    assert m["mean_e2el_ms"] == pytest.approx(500.0)
    assert m["output_throughput"] == pytest.approx(2.5) and m["request_throughput"] == pytest.approx(1.0)


def test_a_live_scripted_server_is_timed_as_scripted(monkeypatch):
    # The benchmark's clock is the script's (ScriptClock): every stamp is exact, at any host speed.
    clock = ScriptClock()
    monkeypatch.setattr(serve, "time", _ClockedTime(clock))
    with FakeServer(clock=clock) as fs:
        res, dur = asyncio.run(
            run_load(fs.base, "/v1/completions", "m", samples(3), float("inf"), 1.0, 1, [], 0.0, True, progress=False)
        )
    m = compute_metrics(res, dur)
    assert m["completed"] == 3 and m["failed"] == 0 and m["total_output_tokens"] == 3 * TOKENS
    for r in res:  # one stamp per content chunk (not the usage chunk), each at its scripted time
        assert r.chunk_times == pytest.approx([r.send + FIRST_S + i * GAP_S for i in range(TOKENS)], abs=1e-9)
    for stat in ("mean", "median", "p99"):
        assert m[f"{stat}_ttft_ms"] == pytest.approx(1e3 * FIRST_S)
        assert m[f"{stat}_itl_ms"] == pytest.approx(1e3 * GAP_S)
        assert m[f"{stat}_tpot_ms"] == pytest.approx(1e3 * GAP_S)
        assert m[f"{stat}_e2el_ms"] == pytest.approx(1e3 * (FIRST_S + (TOKENS - 1) * GAP_S))
    assert dur == pytest.approx(3 * (FIRST_S + (TOKENS - 1) * GAP_S))  # one at a time, back to back


def test_real_time_stamps_can_only_trail_the_script():
    # The same server on real sleeps: the client's perf_counter stamps cannot come earlier than the
    # script put the chunks out (a lower bound that holds at any speed; nothing bounds them above).
    with FakeServer() as fs:
        res, dur = asyncio.run(
            run_load(
                fs.base, "/v1/completions", "m", samples(3), float("inf"), 1.0, None, [], 0.0, True, progress=False
            )
        )
    m = compute_metrics(res, dur)
    assert m["completed"] == 3 and m["failed"] == 0 and m["total_output_tokens"] == 3 * TOKENS
    tick = 1e-6  # asyncio may wake a timer up to its clock's resolution early
    for r in res:
        t = r.chunk_times
        assert len(t) == TOKENS and t == sorted(t)
        assert t[0] - r.send >= FIRST_S - tick and t[-1] - r.send >= FIRST_S + (TOKENS - 1) * GAP_S - tick
    assert dur >= FIRST_S + (TOKENS - 1) * GAP_S - tick


def test_gamma_schedules_have_the_right_mean_and_end_at_n_over_r():
    for burst in (1.0, 0.5, 3.0):
        t = gamma_offsets(2000, rate=4.0, burstiness=burst, seed=1)
        assert t[-1] == pytest.approx(2000 / 4.0)
        gaps = [b - a for a, b in zip([0.0] + t, t)]
        assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=1e-6)
        cv = (sum((g - 0.25) ** 2 for g in gaps) / len(gaps)) ** 0.5 / 0.25
        assert cv == pytest.approx(1 / burst**0.5, rel=0.15)  # gamma: CV = 1/sqrt(shape)


def test_a_closed_loop_never_exceeds_its_concurrency():
    # meet=2: the first streams wait until two are in flight, so reaching the cap does not depend
    # on the client sending its second request within the first one's lifetime.
    with FakeServer(meet=2) as fs:
        res, _ = asyncio.run(
            run_load(
                fs.base, "/v1/completions", "m", samples(8, 2), float("inf"), 1.0, 2, [], 0.0, True, progress=False
            )
        )
        assert fs.max_inflight == 2 and all(r.success for r in res)


def test_result_fields_carry_vllm_names():
    r = Result(3, 3, False, send=0.0, chunk_times=[0.1, 0.2, 0.3], output_tokens=3, success=True)
    m = compute_metrics([r], 1.0)
    for k in (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p90_tpot_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "p50_e2el_ms",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
    ):
        assert k in m, k


def test_an_extra_body_reaches_every_request_and_overrides_nothing_it_should_not():
    extra = {"structured_outputs": {"regex": "[a-z]+"}, "temperature": 0.5}
    with FakeServer() as fs:
        res, _ = asyncio.run(
            run_load(
                fs.base,
                "/v1/completions",
                "m",
                samples(3),
                float("inf"),
                1.0,
                2,
                [],
                0.0,
                True,
                progress=False,
                extra=extra,
            )
        )
    assert all(r.success for r in res) and len(fs.bodies) == 3
    for b in fs.bodies:  # merged last: the arm's body wins over the client's defaults it names
        assert b["structured_outputs"] == {"regex": "[a-z]+"} and b["temperature"] == 0.5
        assert b["max_tokens"] == TOKENS and b["stream"] is True


def test_a_failing_server_shows_up_as_failures_not_fast_requests():
    with FakeServer(fail=True) as fs:
        res, dur = asyncio.run(
            run_load(
                fs.base, "/v1/completions", "m", samples(4), float("inf"), 1.0, None, [], 0.0, True, progress=False
            )
        )
    m = compute_metrics(res, dur)
    assert m["failed"] == 4 and m["completed"] == 0 and m["mean_ttft_ms"] == 0.0
    assert "HTTP 500" in res[0].error


def test_ab_rotates_boot_order_and_refuses_rounds_with_short_output(tmp_path, loaded):
    import sys

    from tailgate.bench import ab

    fake = f"{sys.executable} {__file__.rsplit('/', 1)[0]}/fake_openai.py --port {{port}}"
    lines = []
    w = {"num_prompts": 4, "input_len": 8, "output_len": 4, "rate": float("inf"), "concurrency": 2}
    res = ab.run(
        [("fast", fake + " --gap-ms 2"), ("short", fake + " --short")],
        loaded("gemma3-270m").tokenizer,
        [w],
        rounds=2,
        cool_s=0.0,
        log_dir=str(tmp_path),
        health_timeout=60,
        emit=lines.append,
    )
    assert [line.split()[3].rstrip(":") for line in lines] == ["fast", "short", "short", "fast"]  # rotated
    cell = ab.cell_name(w)
    assert len(res["cells"][cell]["fast"]) == 2 and res["cells"][cell]["short"] == []
    assert len(res["refused"]) == 2 and "fewer/more tokens" in res["refused"][0]["problems"][0]
    assert "fast" in ab.table(res)


def test_dataset_files_load_as_jsonl_or_sharegpt(tmp_path, loaded):
    from tailgate.bench.serve import file_dataset

    tok = loaded("gemma3-270m").tokenizer
    jl = tmp_path / "p.jsonl"
    jl.write_text(json.dumps({"prompt": "Hello there"}) + "\n" + json.dumps({"prompt": "Hi", "output_len": 7}) + "\n")
    a = file_dataset(str(jl), tok, 10, 32)
    assert [s.output_len for s in a] == [32, 7] and a[0].prompt_len == len(tok.encode("Hello there"))
    sg = tmp_path / "s.json"
    sg.write_text(
        json.dumps(
            [
                {"conversations": [{"value": "Tell me a joke"}, {"value": "No jokes today"}]},
                {"conversations": [{"value": "alone"}]},
            ]
        )
    )
    b = file_dataset(str(sg), tok, 10, 32)
    assert (
        len(b) == 1
        and b[0].prompt == "Tell me a joke"
        and b[0].output_len == len(tok.encode("No jokes today", add_bos=False))
    )
