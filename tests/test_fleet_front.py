"""The fleet's front without Ray: what the router matches a request on, the merged /metrics, and
that one replica (or a fleet flag without replicas) never imports Ray."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

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
