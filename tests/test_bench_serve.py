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

from tailgate.bench.serve import Result, Sample, compute_metrics, gamma_offsets, run_load

FIRST_S, GAP_S, TOKENS = 0.10, 0.05, 5


class FakeServer:
    """Streams TOKENS chunks: the first after FIRST_S, then one every GAP_S; counts concurrency."""

    def __init__(self, fail=False):
        self.fail = fail
        self.inflight = 0
        self.max_inflight = 0

        async def completions(req):
            if self.fail:
                return JSONResponse({"error": {"message": "boom"}}, status_code=500)
            body = await req.json()

            async def gen():
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
                try:
                    await asyncio.sleep(FIRST_S)
                    for i in range(body["max_tokens"]):
                        if i:
                            await asyncio.sleep(GAP_S)
                        last = i == body["max_tokens"] - 1
                        yield "data: " + json.dumps({"choices": [{"index": 0, "text": f"t{i}",
                                                                  "finish_reason": "length" if last else None}]}) + "\n\n"
                    yield "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}) + "\n\n"
                    yield "data: [DONE]\n\n"
                finally:
                    self.inflight -= 1
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


def test_a_live_scripted_server_is_timed_as_scripted():
    with FakeServer() as fs:
        res, dur = asyncio.run(run_load(fs.base, "/v1/completions", "m", samples(3), float("inf"), 1.0, None, [],
                                        0.0, True, progress=False))
    m = compute_metrics(res, dur)
    assert m["completed"] == 3 and m["failed"] == 0 and m["total_output_tokens"] == 3 * TOKENS
    assert m["median_ttft_ms"] == pytest.approx(1e3 * FIRST_S, abs=30)
    assert m["median_itl_ms"] == pytest.approx(1e3 * GAP_S, abs=15)
    assert m["median_tpot_ms"] == pytest.approx(1e3 * GAP_S, abs=15)


def test_gamma_schedules_have_the_right_mean_and_end_at_n_over_r():
    for burst in (1.0, 0.5, 3.0):
        t = gamma_offsets(2000, rate=4.0, burstiness=burst, seed=1)
        assert t[-1] == pytest.approx(2000 / 4.0)
        gaps = [b - a for a, b in zip([0.0] + t, t)]
        assert sum(gaps) / len(gaps) == pytest.approx(0.25, rel=1e-6)
        cv = (sum((g - 0.25) ** 2 for g in gaps) / len(gaps)) ** 0.5 / 0.25
        assert cv == pytest.approx(1 / burst ** 0.5, rel=0.15)  # gamma: CV = 1/sqrt(shape)


def test_a_closed_loop_never_exceeds_its_concurrency():
    with FakeServer() as fs:
        res, _ = asyncio.run(run_load(fs.base, "/v1/completions", "m", samples(8, 2), float("inf"), 1.0, 2, [],
                                      0.0, True, progress=False))
        assert fs.max_inflight == 2 and all(r.success for r in res)


def test_result_fields_carry_vllm_names():
    r = Result(3, 3, False, send=0.0, chunk_times=[0.1, 0.2, 0.3], output_tokens=3, success=True)
    m = compute_metrics([r], 1.0)
    for k in ("completed", "total_input_tokens", "total_output_tokens", "request_throughput", "output_throughput",
              "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms",
              "mean_tpot_ms", "p90_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p50_e2el_ms",
              "max_output_tokens_per_s", "max_concurrent_requests"):
        assert k in m, k


def test_a_failing_server_shows_up_as_failures_not_fast_requests():
    with FakeServer(fail=True) as fs:
        res, dur = asyncio.run(run_load(fs.base, "/v1/completions", "m", samples(4), float("inf"), 1.0, None, [],
                                        0.0, True, progress=False))
    m = compute_metrics(res, dur)
    assert m["failed"] == 4 and m["completed"] == 0 and m["mean_ttft_ms"] == 0.0
    assert "HTTP 500" in res[0].error


def test_ab_rotates_boot_order_and_refuses_rounds_with_short_output(tmp_path, loaded):
    import sys

    from tailgate.bench import ab

    fake = f"{sys.executable} {__file__.rsplit('/', 1)[0]}/fake_openai.py --port {{port}}"
    lines = []
    w = {"num_prompts": 4, "input_len": 8, "output_len": 4, "rate": float("inf"), "concurrency": 2}
    res = ab.run([("fast", fake + " --gap-ms 2"), ("short", fake + " --short")], loaded("gemma3-270m").tokenizer,
                 [w], rounds=2, cool_s=0.0, log_dir=str(tmp_path), health_timeout=60, emit=lines.append)
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
    sg.write_text(json.dumps([{"conversations": [{"value": "Tell me a joke"}, {"value": "No jokes today"}]},
                              {"conversations": [{"value": "alone"}]}]))
    b = file_dataset(str(sg), tok, 10, 32)
    assert len(b) == 1 and b[0].prompt == "Tell me a joke" and b[0].output_len == len(tok.encode("No jokes today", add_bos=False))
