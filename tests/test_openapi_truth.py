"""/openapi.json says what the server enforces (schemathesis' --checks all reads it that way)."""

from __future__ import annotations

import httpx
import jsonschema
import jsonschema_rs
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import response_schema_conformance

from tailgate.server.app import ServerState, below, create_app
from live import MODEL

CONTEXT, VOCAB = 512, 262144  # the live test server's (tests/live.py) and Gemma 3's
NEW_FIELDS = (
    "logit_bias",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
CHAT_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call")


def test_a_405_names_every_method_the_path_takes():
    c = TestClient(create_app(ServerState(served_name="m")))
    for method, path, allow in (
        ("DELETE", "/v1/models", "GET, HEAD"),
        ("GET", "/v1/completions", "POST"),
        ("PUT", "/metrics", "GET, HEAD"),
    ):
        r = c.request(method, path)
        assert r.status_code == 405 and r.headers["allow"] == allow and r.json()["error"]["code"] == 405


def test_the_schema_documents_metrics_as_prometheus_text_and_each_path_once():
    doc = TestClient(create_app(ServerState(served_name="m"))).get("/openapi.json").json()
    assert list(doc["paths"]["/metrics"]) == ["get"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    ops = [op["operationId"] for p in doc["paths"].values() for op in p.values()]
    assert len(ops) == len(set(ops))


def test_the_schema_declares_the_fields_that_shape_an_answer():
    props = {
        n: s["properties"]
        for n, s in TestClient(create_app(ServerState(served_name="m")))
        .get("/openapi.json")
        .json()["components"]["schemas"]
        .items()
        if "properties" in s
    }
    for f in NEW_FIELDS:
        assert f in props["CompletionRequest"] and f in props["ChatCompletionRequest"], f
    for f in CHAT_FIELDS:
        assert f in props["ChatCompletionRequest"] and f not in props["CompletionRequest"], f


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
def test_schemathesis_can_draw_each_request_body(path):
    """With one cross-field rule too many, schemathesis' generator gives up on a body ("does not
    support this part of it") and the fuzz and `--checks all` would test nothing there."""
    schema = schemathesis.openapi.from_dict(
        TestClient(create_app(ServerState(served_name="m"))).get("/openapi.json").json()
    )
    drawn = []

    @settings(
        max_examples=5, database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    @given(case=schema[path]["POST"].as_strategy(generation_mode=GenerationMode.POSITIVE))
    def draw(case):
        drawn.append(case.body)

    draw()
    assert drawn and all(isinstance(b, dict) for b in drawn)


@pytest.mark.parametrize("n", [1, 2, 10, 11, 99, 100, 1000, 49152, VOCAB])
def test_the_logit_bias_key_pattern_takes_exactly_the_token_ids_below_n(n):
    """Read as JSON Schema reads a pattern (ECMA-262, jsonschema_rs: what schemathesis runs), it
    takes what structured.logit_bias does: ASCII digits (leading zeros too) naming an id below n."""
    ok = jsonschema_rs.validator_for({"type": "string", "pattern": below(n)}).is_valid
    assert [i for i in range(min(n + 1200, 300000)) if ok(str(i))] == list(range(n))
    assert (
        ok("00" + str(n - 1))
        and not ok(str(n) + "0")
        and not any(ok(s) for s in ("", "-1", "1.0", "+1", " 1", f"{n - 1}\n", "\u0661"))
    )


def test_the_live_schema_bounds_model_names_and_token_ids_as_the_server_does(server):
    base = server[0]
    doc = httpx.get(base + "/openapi.json").json()["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        assert doc[name]["properties"]["model"]["anyOf"][0]["enum"] == [MODEL, "default"]
    top = doc["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"]
    assert httpx.post(base + "/detokenize", json={"tokens": [top]}).status_code == 200
    assert httpx.post(base + "/detokenize", json={"tokens": [top + 1]}).status_code == 400
    assert doc["TokenizeRequest"]["properties"]["prompt"]["type"] == "string"  # not nullable
    assert httpx.post(base + "/tokenize", json={"prompt": None}).status_code == 400
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        for f in ("max_tokens", "max_completion_tokens"):
            assert doc[name]["properties"][f]["anyOf"][0]["maximum"] == CONTEXT - 1
        key = doc[name]["properties"]["logit_bias"]["anyOf"][0]["propertyNames"]["pattern"]
        assert key == below(VOCAB)


CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}],
}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
HI = [{"role": "user", "content": "Hi"}]
# (path, body, served): what the published schema admits is served, what it refuses is a 400.
CASES = [
    ("/tokenize", {"messages": [CALL]}, True),  # no arguments: vLLM's rule, not a 400
    ("/tokenize", {"messages": [{**CALL, "tool_calls": [{"function": {"name": "f", "arguments": "(x"}}]}]}, True),
    ("/tokenize", {"messages": HI, "continue_final_message": True}, False),  # add_generation_prompt is true
    ("/tokenize", {"messages": HI, "continue_final_message": True, "add_generation_prompt": False}, True),
    ("/tokenize", {"messages": HI, "chat_template_kwargs": {"tools": []}}, False),  # reserved
    ("/tokenize", {"prompt": "Hi", "continue_final_message": True}, True),  # template fields bind messages only
    ("/v1/chat/completions", {"messages": HI, "tools": [TOOL, TOOL]}, True),  # names need not be unique
    ("/v1/chat/completions", {"messages": HI, "tools": [{"function": {"name": "f", "description": None}}]}, True),
    ("/v1/chat/completions", {"messages": HI, "tools": [{"function": {"name": "f", "description": 5}}]}, False),
    ("/v1/chat/completions", {"messages": HI, "tools": [TOOL], "tool_choice": "none"}, True),
    ("/v1/chat/completions", {"messages": HI, "tool_choice": "auto"}, False),  # needs tools
    ("/v1/chat/completions", {"messages": HI, "parallel_tool_calls": 5}, False),  # checked without tools too
    (
        "/v1/chat/completions",
        {"messages": HI, "tools": [TOOL], "tool_choice": "required", "guided_choice": ["a"]},
        False,
    ),  # a forced call and a constraint
    ("/v1/completions", {"prompt": "Hi", "structured_outputs": {"json": 0}}, False),  # 0 is not false
    ("/v1/completions", {"prompt": "Hi", "structured_outputs": {"json": None, "backend": ""}}, True),
    ("/v1/completions", {"prompt": "Hi", "structured_outputs": {"disable_any_whitespace": True}}, False),
    ("/v1/completions", {"prompt": "Hi", "structured_outputs": {"regex": "a", "choice": ["a"]}}, False),
    ("/v1/completions", {"prompt": "Hi", "guided_regex": "a", "response_format": {"type": "json_object"}}, False),
    ("/v1/completions", {"prompt": "Hi", "response_format": {"type": "text"}, "guided_json": False}, False),
    ("/v1/completions", {"prompt": "Hi", "response_format": {"type": "json_schema", "json_schema": {}}}, False),
    # a JSON schema is any object, and JSON has no integer bound: one past 64 bits is served
    ("/v1/completions", {"prompt": "Hi", "guided_json": {"type": "object", "x-n": -25164186452009787850752}}, True),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {str(VOCAB - 1): 1, "007": -100}}, True),
    ("/v1/completions", {"prompt": "Hi", "logit_bias": {str(VOCAB): 1}}, False),
    # stop: at most 16 strings (empty ones too: the schema cannot count only the non-empty) of <= 256 characters
    ("/v1/completions", {"prompt": "Hi", "stop": ["x" * 256] + [""] * 15}, True),
    ("/v1/completions", {"prompt": "Hi", "stop": [""] * 17}, False),
    ("/v1/chat/completions", {"messages": HI, "stop": ["", "a"] * 5 + [str(i) for i in range(12)]}, False),
    ("/v1/completions", {"prompt": "Hi", "stop": "x" * 257}, False),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": CONTEXT}, False),  # no prompt leaves room
    ("/v1/chat/completions", {"messages": HI, "max_completion_tokens": CONTEXT, "max_tokens": 1}, False),
]


@pytest.fixture(scope="module")
def validators(server):
    doc = httpx.get(server[0] + "/openapi.json").json()
    ref = {
        p: op["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        for p, op in doc["paths"].items()
        if "post" in op
    }
    return {p: jsonschema.Draft202012Validator({"$ref": r, "components": doc["components"]}) for p, r in ref.items()}


@pytest.mark.parametrize("path,body,served", CASES, ids=[f"{i}-{c[0]}" for i, c in enumerate(CASES)])
def test_the_schema_admits_what_the_server_serves_and_nothing_it_refuses(server, validators, path, body, served):
    errors = [e.message for e in validators[path].iter_errors(body)]
    assert (not errors) == served, errors
    r = httpx.post(
        server[0] + path,
        json={**body, "max_tokens": body.get("max_tokens", 1)} if path != "/tokenize" else body,
        timeout=120,
    )
    assert r.status_code == (200 if served else 400), r.text
    if not served:
        assert r.json()["error"]["message"]


STREAMS = [
    ("/v1/completions", {"prompt": "Hi", "logprobs": 2, "echo": True, "n": 2}),
    ("/v1/completions", {"prompt": [[1000, 1001]], "prompt_logprobs": 1, "stream_options": {"include_usage": True}}),
    (
        "/v1/chat/completions",
        {"messages": HI, "logprobs": True, "top_logprobs": 2, "stream_options": {"include_usage": True}},
    ),
]


@pytest.mark.parametrize("path,body", STREAMS, ids=[f"{i}-{c[0]}" for i, c in enumerate(STREAMS)])
def test_every_event_of_a_stream_is_one_the_schema_describes(server, path, body):
    """A text/event-stream `schema` (OpenAPI 3.1) describes one event, and schemathesis' --checks all
    holds each event's `data` to it (ST108): a chunk of the endpoint's kind as JSON, or [DONE]."""
    base = server[0]
    schema = schemathesis.openapi.from_url(base + "/openapi.json")
    case = schema[path]["POST"].Case(body={**body, "stream": True, "max_tokens": 3})
    r = case.call(base_url=base, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"][0].startswith("text/event-stream"), r.text
    events = [e for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert len(events) >= 3 and events[-1] == "data: [DONE]", r.text
    case.validate_response(r, checks=[response_schema_conformance])


def test_max_tokens_past_what_the_prompt_leaves_ends_at_the_context(server):
    """The schema cannot count a prompt's tokens, so a max_tokens it admits is served: the answer
    stops where the context does (finish "length"), not refused for this prompt."""
    prompt = list(range(1000, 1000 + CONTEXT - 6))
    r = httpx.post(
        server[0] + "/v1/completions",
        json={"prompt": prompt, "max_tokens": CONTEXT - 1, "ignore_eos": True},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 6 and body["choices"][0]["finish_reason"] == "length"
