"""/v1/embeddings: each input's last-token final hidden state, L2-normalized (vLLM's pooling for a
decoder LM), computed on the engine thread; checked against HF transformers and through the
openai SDK."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest
import torch

from conftest import MODELS
from live import MODEL, post, wait_idle
from tailgate.model.runtime.pooling import NoRoom, embed

TEXTS = ["The capital of France is Paris.", "Embeddings pool a decoder's last hidden state."]


@pytest.mark.parametrize("name", MODELS)
def test_an_embedding_is_hf_transformers_normalized_last_token_hidden_state(rig, hf_model, loaded, name):
    r = rig(name, "fp32")
    tok = loaded(name).tokenizer
    prompts = [tok.encode(t) for t in TEXTS]
    got = embed(r.runner, r.book, prompts)
    r.assert_no_leak()
    hf = hf_model(name)
    with torch.inference_mode():
        want = torch.stack(
            [hf.model(torch.tensor([p])).last_hidden_state[0, -1].float() for p in prompts]
        )  # HF's last_hidden_state is after the final norm
    want = torch.nn.functional.normalize(want, dim=-1)
    assert got.shape == (2, loaded(name).spec.hidden)
    assert torch.allclose(got.norm(dim=-1), torch.ones(2), atol=1e-5)
    assert (got - want).abs().max().item() < 2e-4, (got - want).abs().max().item()
    # one pass over both inputs is each input's own pass
    alone = torch.cat([embed(r.runner, r.book, [p]) for p in prompts])
    assert (got - alone).abs().max().item() < 1e-4


def test_an_embedding_that_does_not_fit_the_pools_reserves_nothing(rig):
    r = rig(MODEL, "fp32")
    too_many = [[2] * 2048] * 64  # far past the rig's pools
    with pytest.raises(NoRoom):
        embed(r.runner, r.book, too_many)
    r.assert_no_leak()


def test_an_engine_call_runs_on_the_engine_thread_between_steps_and_returns_its_error():
    from test_scheduler import make, req

    from tailgate.engine.loop import Engine

    s = make(slots=1)
    engine = Engine(s).start()
    try:
        engine.submit(req(10, max_tokens=50))
        assert engine.call(lambda: threading.current_thread().name).result(timeout=30) == "tailgate-engine"

        def boom():
            raise ValueError("mine")

        with pytest.raises(ValueError, match="mine"):
            engine.call(boom).result(timeout=30)
        assert engine.error is None and engine.call(lambda: 7).result(timeout=30) == 7  # idle: still served
    finally:
        engine.stop()


def test_the_openai_sdk_gets_one_unit_vector_per_input_equal_to_the_engines(client, server, rig):
    r = rig(MODEL, "auto")  # the live server's plan
    tok = r.model.tokenizer
    prompts = [tok.encode(t) for t in TEXTS]
    # the server packs a request's inputs into one pass: compared with the same pass here (a plan's
    # kernels may differ with a pass's row count)
    pair = embed(r.runner, r.book, prompts).numpy()
    alone = [embed(r.runner, r.book, [p]).numpy()[0] for p in prompts]
    got = client.embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64 and decodes it
    assert [d.index for d in got.data] == [0, 1] and got.model == MODEL
    vecs = np.array([d.embedding for d in got.data])
    assert vecs.shape == (2, r.model.spec.hidden) and np.abs(vecs - pair).max() < 1e-4
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1, atol=1e-5)
    assert got.usage.prompt_tokens == got.usage.total_tokens == sum(map(len, prompts))
    floats = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    assert np.abs(np.array(floats.data[0].embedding) - alone[0]).max() < 1e-4
    ids = client.embeddings.create(
        model=MODEL, input=prompts[1], encoding_format="float", dimensions=r.model.spec.hidden
    )
    assert np.abs(np.array(ids.data[0].embedding) - alone[1]).max() < 1e-4
    lists = client.embeddings.create(model=MODEL, input=prompts, encoding_format="float")
    assert np.abs(np.array([d.embedding for d in lists.data]) - pair).max() < 1e-4
    assert wait_idle(server[0]) == 0


def test_an_embedding_beside_a_live_stream_leaves_the_stream_whole(client, server):
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=20, temperature=0, stream=True
    )
    first = next(iter(stream))  # the stream is live in the engine
    e = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    rest = list(stream)
    assert first.choices[0].text is not None and len(e.data) == 2
    assert rest[-1].choices[0].finish_reason == "length"
    assert wait_idle(server[0]) == 0


@pytest.mark.parametrize(
    "body,param",
    [
        ({"input": "hi", "dimensions": 3}, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [262144]}, "input"),
        ({"input": [5] * 600}, "input"),  # past the test server's 512-token context
        ({"input": "hi", "model": "nope"}, "model"),
        ({}, "input"),
    ],
)
def test_a_bad_embeddings_request_is_a_400_naming_its_field(server, body, param):
    r = post(server[0], "/v1/embeddings", body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "BadRequestError", err


def test_the_published_schema_says_dimensions_is_the_hidden_size(server, loaded):
    doc = httpx.get(server[0] + "/openapi.json", timeout=60).json()
    dims = doc["components"]["schemas"]["EmbeddingRequest"]["properties"]["dimensions"]["anyOf"][0]
    assert dims["minimum"] == dims["maximum"] == loaded(MODEL).spec.hidden
    assert "/v1/embeddings" in doc["paths"]
