"""The fleet's front without Ray: what the router matches a request on, the merged /metrics, the
merged dashboard feed, and that one replica (or a fleet flag without replicas) never imports Ray."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from tailgate.fleet.dashboard import SUMMED, FleetWindow, events
from tailgate.fleet.front import route_key
from tailgate.fleet.metrics import render


def test_the_router_matches_on_the_prompt_ids_or_text_or_the_chat_messages_in_order():
    assert route_key("/v1/completions", b'{"prompt": "Once upon"}') == "Once upon"
    assert route_key("/v1/completions", b'{"prompt": [1, 2, 3]}') == (1, 2, 3)
    assert route_key("/v1/completions", b'{"prompt": [[4, 5], [6]]}') == (4, 5)
    chat = route_key(
        "/v1/chat/completions",
        b'{"messages": [{"role": "system", "content": "Be brief."}, '
        b'{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}',
    )
    assert chat.startswith("system\x1fBe brief.\x1e") and chat.endswith("user\x1fHi\x1e")
    # Whatever the body, a key (the replica's own app answers the bad ones with their error).
    for body in (b"", b"not json", b"[1]", b'{"prompt": 5}', b'{"messages": "x"}'):
        assert route_key("/v1/completions", body) in ("", ())
    assert route_key("/health", b'{"prompt": "x"}') == ""


def test_fleet_metrics_label_every_replica_sample_and_count_routes_by_reason():
    one = (
        "# HELP vllm:prompt_tokens_total Prefilled.\n# TYPE vllm:prompt_tokens_total counter\n"
        'vllm:prompt_tokens_total{model_name="m"} 7.0\n'
        '# HELP vllm:ttft Time.\n# TYPE vllm:ttft histogram\nvllm:ttft_bucket{le="1.0",model_name="m"} 1.0\n'
        'vllm:ttft_bucket{le="+Inf",model_name="m"} 1.0\nvllm:ttft_count{model_name="m"} 1.0\n'
        'vllm:ttft_sum{model_name="m"} 0.5\n'
    )
    text = render(
        {"r1": one, "r2": one.replace(" 7.0", " 9.0")},
        {"prefix": 5, "imbalance": 1},
        {"retries": 2, "stream_errors": 1},
        {"running": 1, "target": 2},
    ).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    prompt = {s.labels["replica"]: s.value for s in fams["vllm:prompt_tokens"].samples}
    assert prompt == {"r1": 7.0, "r2": 9.0}
    assert {s.labels["replica"] for s in fams["vllm:ttft"].samples} == {"r1", "r2"}
    routes = {s.labels["reason"]: s.value for s in fams["tailgate:route"].samples if s.name.endswith("_total")}
    assert routes == {"prefix": 5.0, "imbalance": 1.0}
    assert "tailgate:fleet_retries_total 2.0" in text and 'tailgate:fleet_replicas{state="running"} 1.0' in text


def test_one_replica_imports_nothing_of_ray_and_fleet_flags_without_replicas_refuse():
    code = (
        "import sys; from tailgate.cli import main; rc = main(['serve', '--ray-address', 'auto']); "
        "print(rc, 'ray' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.split() == ["2", "False"], p.stderr
    assert "--ray-address 'auto' needs --replicas N with N > 1" in p.stderr
    code = (
        "import sys; from tailgate.cli import main; "
        "rc = main(['sim', '--replicas', '2', '--num-prompts', '4', '--random-input-len', '32', "
        "'--random-output-len', '2']); print(rc, 'ray' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout.split()[-2:] == ["0", "False"], p.stderr


def report(now, steps=(), gaps=(), running=0, kv_usage=0.0, replica="a", **counts):
    """One replica's answer to the front, as `server/feed.report` and `EngineReplica.feed` shape it."""
    base = {k: 0 for k in SUMMED}
    return {
        **base,
        "replica": replica,
        **counts,
        "running": running,
        "now": now,
        "kv_usage": kv_usage,
        "steps": [{"seq": s, "at": now - 1, "duration_s": 0.01, "kind": "decode"} for s in steps],
        "gaps": [list(g) for g in gaps],
        "error": None,
    }


def test_a_fleet_tick_sums_the_replicas_and_its_itl_percentiles_are_those_of_every_gap_together():
    w = FleetWindow()
    a_gaps = [(150.0 + i / 4, 0.010) for i in range(90)]  # replica a: 90 gaps of 10 ms
    b_gaps = [(5.0 + i, 0.200) for i in range(10)]  # replica b (its own clock): 10 gaps of 200 ms
    t = w.merge(
        {
            "a": report(190.0, steps=[7, 8], gaps=a_gaps, running=2, kv_usage=0.5, prefix_hits=3, preemptions=1),
            "b": report(15.0, steps=[0], gaps=b_gaps, running=1, kv_usage=0.1, prefix_hits=4, replica="b"),
        },
        ["a", "b"],
    )
    assert (t["running"], t["prefix_hits"], t["preemptions"]) == (3, 7, 1)
    assert abs(t["kv_usage"] - 0.3) < 1e-9
    # Exact over the union: 90 of 100 gaps are 10 ms, so p50 is 10 ms and p99 is 200 ms; an
    # average of the replicas' own p99s (10 and 200 ms) would say 105.
    assert t["itl"]["n"] == 100 and t["itl"]["p50_s"] == 0.010 and t["itl"]["p99_s"] == 0.200
    assert [(s["replica"], s["seq"]) for s in t["steps"]] == [("a", 7), ("a", 8), ("b", 0)]
    assert [(r["id"], r["running"], r["itl"]["p99_s"]) for r in t["replicas"]] == [("a", 2, 0.010), ("b", 1, 0.200)]
    # The next ask for each replica starts after what it already sent.
    assert w.ask("a") == (8, 172.25) and w.ask("b") == (0, 14.0) and w.ask("c") == (-1, None)
    # A replica that misses a tick but is still a member keeps its cursors (no step sent twice).
    t = w.merge({"a": report(190.5)}, ["a", "b"])
    assert [r["id"] for r in t["replicas"]] == ["a"] and w.ask("b") == (0, 14.0)
    # A minute later replica a's old gaps leave the window; b has left the fleet and is forgotten.
    t = w.merge({"a": report(220.0, gaps=[(219.0, 0.020)])}, ["a"])
    assert [r["id"] for r in t["replicas"]] == ["a"] and w.ask("b") == (-1, None)
    assert t["itl"]["n"] == 1 + sum(1 for at, _ in a_gaps if at >= 220.0 - 60.0) == 1 + 50


def test_a_fleet_connection_that_asks_a_longer_window_keeps_its_gaps_that_long():
    gaps = [(10.0, 0.5), (100.0, 0.1)]
    assert FleetWindow().merge({"a": report(100.0, gaps=gaps)}, ["a"])["itl"]["n"] == 1
    t = FleetWindow(120.0).merge({"a": report(100.0, gaps=gaps)}, ["a"])
    assert t["itl"] == {"n": 2, "p50_s": 0.5, "p99_s": 0.5, "window_s": 120.0}


def test_a_replicas_cursor_moves_past_what_it_sent_even_when_all_of_it_is_older_than_the_window():
    """Replicas keep 900 s of gaps; a connection trims to its own minute. Gaps all older than that
    still move the cursor, or every tick would ask for (and be sent) everything the replica keeps."""
    w = FleetWindow()
    t = w.merge({"a": report(400.0, gaps=[(200.0, 0.1), (300.0, 0.2)])}, ["a"])
    assert t["itl"]["n"] == 0 and w.ask("a") == (-1, 300.0)


def test_a_replica_sends_its_gaps_after_the_cursor_oldest_first():
    from tailgate.engine.request import Token
    from tailgate.server.feed import ItlWindow

    w = ItlWindow()
    w.pending.append([Token("a", at=1.0, gap=0.1), Token("b", at=2.0, gap=0.2), Token("a", at=3.0, gap=0.3)])
    assert w.after(3.0, None) == [[1.0, 0.1], [2.0, 0.2], [3.0, 0.3]]
    assert w.after(3.0, 1.0) == [[2.0, 0.2], [3.0, 0.3]] and w.after(3.0, 3.0) == []


def test_a_fleet_feed_says_hello_once_then_ticks_and_ends_with_an_error_when_no_replica_answers():
    asked, alive = [], {"a", "b"}

    async def ask(rid, since, after, hello):
        asked.append((rid, since, hello))
        if rid not in alive:
            return None
        out = report(10.0 + len(asked), steps=[len(asked)], replica=rid)
        return {**out, "hello": {"model": "m", "knobs": {}, "kernels": {}}} if hello else out

    async def members():
        return sorted(alive)

    async def run():
        out = []
        async for text in events(ask, members, FleetWindow(), period=0):
            kind = text.split("\n", 1)[0].removeprefix("event: ")
            out.append((kind, json.loads(text.split("data: ", 1)[1])))
            if len(out) == 3:
                alive.clear()  # every replica gone: the next tick has nobody to ask
        return out

    out = asyncio.run(run())
    assert [k for k, _ in out] == ["hello", "tick", "tick", "error"]
    assert out[0][1]["replicas"] == ["a", "b"] and out[0][1]["model"] == "m"
    assert [len(t["replicas"]) for k, t in out if k == "tick"] == [2, 2]
    # hello asked of each replica on the first round only; later rounds ask after the last step sent
    assert [h for _, _, h in asked[:2]] == [True, True] and not any(h for _, _, h in asked[2:])
    assert [s for r, s, _ in asked[2:4]] == [1, 2]


def test_under_json_logs_each_worker_line_ray_carries_prints_as_one_json_line(capsys):
    """fleet/logs.py: a replica's own JSON line passes as it is; Serve's and the raylet's text is
    wrapped (its level read from its start, its worker named); empty lines are dropped."""
    from tailgate.fleet.logs import print_batch

    own = {"time": "2026-01-01T00:00:00.000Z", "level": "info", "logger": "tailgate.access", "replica": "r1"}
    print_batch(
        {
            "lines": [json.dumps(own), "WARNING 2026-01-01 controller 12 -- slow", "\x1b[33mplain\x1b[0m", ""],
            "pid": 12,
            "actor_name": "ServeController",
            "is_err": True,
        }
    )
    out = capsys.readouterr()
    assert out.out == ""
    got = [json.loads(x) for x in out.err.splitlines()]
    assert got[0] == own and len(got) == 3
    assert got[1]["level"] == "warning" and got[1]["source"] == "ServeController pid=12"
    assert got[2]["message"] == "plain" and got[2]["level"] == "info" and got[2]["logger"] == "ray"


def test_a_replicas_json_lines_name_it(monkeypatch):
    import io
    import logging

    from tailgate.server.logs import configure

    monkeypatch.setenv("TQDM_DISABLE", "1")  # configure's json sets it: restored (unset) after the test
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    buf = io.StringIO()
    try:
        configure("info", "json", {"replica": "r9"}, stream=buf)
        logging.getLogger("tailgate").info("hello")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    line = json.loads(buf.getvalue())
    assert line["replica"] == "r9" and line["message"] == "hello" and line["logger"] == "tailgate"
