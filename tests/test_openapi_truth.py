"""/openapi.json says what the server enforces (schemathesis' --checks all reads it that way)."""
from __future__ import annotations

import httpx
from fastapi.testclient import TestClient

from tailgate.server.app import ServerState, create_app
from live import MODEL


def test_a_405_names_every_method_the_path_takes():
    c = TestClient(create_app(ServerState(served_name="m")))
    for method, path, allow in (("DELETE", "/v1/models", "GET, HEAD"), ("GET", "/v1/completions", "POST"),
                                ("PUT", "/metrics", "GET, HEAD")):
        r = c.request(method, path)
        assert r.status_code == 405 and r.headers["allow"] == allow and r.json()["error"]["code"] == 405


def test_the_schema_documents_metrics_as_prometheus_text_and_each_path_once():
    doc = TestClient(create_app(ServerState(served_name="m"))).get("/openapi.json").json()
    assert list(doc["paths"]["/metrics"]) == ["get"]
    assert list(doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    ops = [op["operationId"] for p in doc["paths"].values() for op in p.values()]
    assert len(ops) == len(set(ops))


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
