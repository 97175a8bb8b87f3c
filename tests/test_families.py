"""The Llama-shaped families (Llama 3.x, Qwen2/2.5, Qwen3, Mistral) against HF transformers' own
implementation, on tiny random checkpoints (fp32), as HF directories and GGUF files; each serves over
HTTP with its own chat template; the family registry answers the loaders and the runner."""

from __future__ import annotations

import dataclasses
import json

import jinja2
import pytest
import torch
import torch.nn.functional as F

from tailgate.model import families
from tailgate.model.check import check_against_hf, precision_class, report
from tailgate.model.formats.hf_loader import read_spec
from tailgate.model.kernels.choice import BiasedLinear, Linear, runnable_plans
from tailgate.model.formats.weights import load_model
import families_tiny
from live import chat_on_directory

NAMES = list(families_tiny.FAMILIES)
GGUF = [n for n in NAMES if families_tiny.FAMILIES[n][3]]


@pytest.fixture(scope="module")
def tiny(loaded, tmp_path_factory):
    """name -> checkpoint directory, built once per module (a second or two each)."""
    root = tmp_path_factory.mktemp("families")
    loaded("smollm2-135m").tokenizer._tok.save(str(root / "smollm2.json"))
    tok = families_tiny.tiny_tokenizer(root / "smollm2.json", root / "tokenizer.json")
    built = {}

    def get(name):
        if name not in built:
            built[name] = families_tiny.build(root / name, name, tok)
        return built[name]

    return get


def _assert_matches(res):
    print(report(res))
    assert all(s.ok for s in res.sequences), report(res)
    assert len(res.greedy_hf) == 16 and res.greedy_ours == res.greedy_hf
    assert len(set(res.greedy_hf)) > 4  # the random model does not just repeat one token


@pytest.mark.parametrize("name", NAMES)
def test_a_family_directory_matches_hf_logits_and_greedy_tokens(tiny, name):
    """What each family adds is in its spec or its weights, and the check covers it: without the
    llama3 remap, the q/k/v biases, the q/k norms or the window the same check fails (mean |Δlp|
    0.003..0.36, 1.7..2.1, 1.0..2.0, 0.34 from the first prompt past the window; measured once)."""
    from tailgate.engine.pages import pool_pages
    from tailgate.model.runtime.runner import ModelRunner

    d = tiny(name)
    spec = read_spec(d)
    assert spec.arch == {"llama3": "llama"}.get(name, name)
    m = load_model(str(d), log=lambda _: None)
    w = ModelRunner(m.spec, m.weights, pool_pages(64, 1, spec.sliding_window), dtype="fp32", device="cpu").w
    biased = {k for k, v in w.items() if isinstance(v, BiasedLinear)}
    assert biased == ({f"layers.{i}.qkv" for i in range(3)} if name == "qwen2" else set())
    assert all(type(v) is Linear for k, v in w.items() if isinstance(v, Linear) and k not in biased)
    assert ("layers.0.q_norm" in w) == (name == "qwen3")
    assert spec.tie_embeddings == (name in ("llama3", "qwen2"))
    assert spec.rope_llama3 == ((32.0, 1.0, 4.0, 8192.0) if name == "llama3" else ())
    assert spec.layer_sliding == ((True,) * 3 if name == "mistral" else (False,) * 3)
    assert spec.sliding_window == (12 if name == "mistral" else None)
    res = check_against_hf(d, log=lambda _: None)
    _assert_matches(res)
    if name == "mistral":
        assert max(s.length for s in res.sequences) == 12 + 64  # crosses the window


@pytest.mark.parametrize("name", GGUF)
def test_the_gguf_form_matches_hf(tiny, name, tmp_path, monkeypatch):
    """The GGUF llama.cpp's converter would write (F32; Llama's q/k permuted and its llama3 remap as
    the `rope_freqs` tensor; Qwen's biases and q/k norms as stored) against HF on the directory."""
    monkeypatch.setenv("TAILGATE_CACHE_DIR", str(tmp_path / "cache"))
    d = tiny(name)
    g = families_tiny.to_gguf(d, tmp_path / f"{name}.gguf", families_tiny.FAMILIES[name][3])
    res = check_against_hf(d, model=g, log=lambda _: None)
    _assert_matches(res)
    m, ref = load_model(str(g), log=lambda _: None), load_model(str(d), log=lambda _: None)
    # The same spec, but that GGUF carries Llama 3's remap as a tensor, not as metadata, and its eps in fp32.
    assert m.spec.eps == pytest.approx(ref.spec.eps, rel=1e-6)
    assert dataclasses.replace(m.spec, rope_llama3=ref.spec.rope_llama3, eps=ref.spec.eps) == ref.spec
    assert ("rope_freqs" in m.weights) == (name == "llama3")
    text = "The river town woke slowly, and the baker counted loaves."
    assert m.tokenizer.encode(text) == ref.tokenizer.encode(text)


@pytest.mark.parametrize("name", NAMES)
def test_a_family_directory_serves_chat_over_http_with_its_template(tiny, name):
    d = tiny(name)
    messages = [{"role": "user", "content": "Name three rivers."}]
    body, template = chat_on_directory(d, messages, 4)
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["message"]["content"]
    tc = json.loads((d / "tokenizer_config.json").read_text())
    text = jinja2.Template(template).render(
        messages=messages, add_generation_prompt=True, bos_token=tc["bos_token"] or ""
    )
    tok = load_model(str(d), log=lambda _: None).tokenizer
    assert body["usage"]["prompt_tokens"] == len(tok.encode(text, add_bos=False))  # its template, not ChatML


def test_a_bias_rides_every_kernel_a_plan_can_choose():
    """BiasedLinear = F.linear(x, w, b) on every plan this CPU runs (q8, int8/int4, oneDNN, F.linear),
    at 1 and 80 rows (under and over the quantized kernels' row cuts), within the plan's precision."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(96, 64, generator=g) / 8, torch.randn(96, generator=g)
    for plan in runnable_plans():
        lin, plain = BiasedLinear(w, plan, "layers", b), Linear(w, plan, "layers")
        for rows in (1, 80):
            x = torch.randn(rows, 64, generator=g)
            # the bias is added in fp32 to whatever product the kernel made (bf16 from dense bf16
            # weights): exactly plain's product plus b, then cast to the activations' dtype
            assert torch.equal(lin.raw(x).float(), plain.raw(x).float() + b), plan.line()
            assert torch.equal(lin(x), (plain.raw(x).float() + b).to(x.dtype)), plan.line()
            if precision_class(plan) == "fp32":
                assert torch.allclose(lin(x), F.linear(x, w, b), atol=1e-5, rtol=0), plan.line()


@pytest.mark.parametrize(
    "change,named",
    [
        ({"model_type": "mamba"}, "unsupported model_type 'mamba'"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "yarn"),
        ({"rope_scaling": {"type": "llama3", "factor": 8.0}, "rope_theta": 5e5}, "low_freq_factor"),
        ({"hidden_act": "gelu"}, "hidden_act"),
    ],
)
def test_a_config_we_cannot_run_refuses_by_name_before_any_weights_load(tmp_path, change, named):
    cfg = {
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        **change,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=named):
        read_spec(tmp_path)


def test_the_registry_reads_older_config_forms_as_hf_does(tmp_path):
    """`rope_scaling` + top-level `rope_theta` (Llama 3.1/3.2 as published), Qwen's
    use_sliding_window / max_window_layers, and a Mistral config without a window."""
    from transformers import AutoConfig

    base = {
        "vocab_size": 64,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 128,
    }
    cases = [
        {
            "model_type": "llama",
            "rope_theta": 5e5,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            "tie_word_embeddings": True,
        },
        {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 16, "max_window_layers": 2},
        {"model_type": "qwen3", "use_sliding_window": False, "sliding_window": 16},
        {"model_type": "mistral", "sliding_window": None},
    ]
    for c in cases:
        (tmp_path / "config.json").write_text(json.dumps({**base, **c}))
        spec, hf = read_spec(tmp_path), AutoConfig.from_pretrained(str(tmp_path))
        types = getattr(hf, "layer_types", None) or ["full_attention"] * 4
        window = hf.sliding_window if "sliding_attention" in types or c["model_type"] == "mistral" else None
        assert spec.sliding_window == window, c
        assert spec.layer_sliding == (tuple(t == "sliding_attention" for t in types) if window else (False,) * 4)
        assert spec.rope_theta == hf.rope_parameters["rope_theta"] and spec.tie_embeddings == hf.tie_word_embeddings
        assert spec.head_dim == getattr(hf, "head_dim", 16) and spec.n_kv_heads == hf.num_key_value_heads
        assert spec.max_position == hf.max_position_embeddings and spec.vocab_size == hf.vocab_size


def test_every_family_is_registered_once_and_runs_a_forward():
    hf = [t for f in families.FAMILIES.values() for t in f.hf_types + f.hf_composite]
    gg = [a for f in families.FAMILIES.values() for a in f.gguf_archs]
    assert len(hf) == len(set(hf)) and len(gg) == len(set(gg))
    assert {"llama", "qwen2", "qwen3", "mistral", "gemma3", "gemma4"} <= set(families.FAMILIES)
    for f in families.FAMILIES.values():
        assert callable(f.forward_fn) and f.read_hf is not None
    with pytest.raises(ValueError, match="unknown GGUF tensor"):  # Llama 3's rope_freqs is Llama's alone
        from tailgate.model.formats.gguf_loader import internal_name

        internal_name("rope_freqs.weight", families.get("qwen2"))


def test_a_mistral_format_tool_call_over_http_comes_back_as_tool_calls(tiny, tmp_path):
    """Mistral's `[TOOL_CALLS][...]` (server/tool_formats.py), on the tiny Mistral checkpoint given a
    template that writes it: a forced call is written in that format under its grammar and parsed
    back into `tool_calls` (issue 37: it fell back to the Hermes parser and came back as text)."""
    import shutil

    import httpx

    from live import start_server, stop_server
    from test_tool_stream import MISTRAL_TEMPLATE

    d = tmp_path / "mistral-tools"
    shutil.copytree(tiny("mistral"), d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": MISTRAL_TEMPLATE}))
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Oslo"]}},  # short: a random model writes it whole
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    p, base, _ = start_server(args=["--model", str(d)])
    try:
        body = {
            "model": d.name,
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [tool],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "max_tokens": 64,
        }
        r = httpx.post(base + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        msg = r.json()["choices"][0]
        assert msg["finish_reason"] == "stop", msg  # a named tool_choice ends "stop", as OpenAI's does
        (call,) = msg["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Oslo")
        assert not msg["message"]["content"]
    finally:
        stop_server(p)
