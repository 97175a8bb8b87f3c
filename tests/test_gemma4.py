"""Gemma 4 text models against HF transformers' reference, on tiny random checkpoints (fp32)."""

from __future__ import annotations

import json
import subprocess
import sys

import jinja2
import pytest
import torch

from tailgate.model.runtime import serial
from tailgate.model.check import check_against_hf, report
from tailgate.model.formats.hf_loader import read_spec
from tailgate.model.runtime.kv_cache import token_bytes
from tailgate.model.formats.weights import load_model
import gemma4_tiny
from harness import Harness, ids
from live import chat_on_directory


@pytest.fixture(scope="module")
def tiny(loaded, tmp_path_factory):
    """name -> checkpoint directory, built once per module (~8 s each)."""
    root = tmp_path_factory.mktemp("gemma4")
    tok = root / "tokenizer.json"
    loaded("gemma3-270m").tokenizer._tok.save(str(tok))
    built = {}

    def get(name):
        if name not in built:
            cfg = gemma4_tiny.DENSE if name == "dense" else gemma4_tiny.EVERYTHING
            built[name] = gemma4_tiny.build(
                root / name,
                tok,
                multimodal=name == "multimodal",
                dtype=torch.bfloat16 if name == "bf16" else torch.float32,
                **cfg,
            )
        return built[name]

    return get


@pytest.fixture(scope="module")
def everything(tiny):
    return load_model(str(tiny("everything")), log=lambda m: None)


@pytest.mark.parametrize(
    "name,kernels",
    [("everything", "auto"), ("everything", "torch"), ("dense", "auto"), ("multimodal", "auto"), ("bf16", "auto")],
)
def test_gemma4_logits_and_greedy_tokens_match_hf_past_the_sliding_window(tiny, name, kernels):
    res = check_against_hf(tiny(name), kernels=kernels, log=lambda m: None)
    print(report(res))
    assert max(s.length for s in res.sequences) > 12 + 48  # the long one crosses the 12-token window
    assert all(s.ok for s in res.sequences), report(res)
    assert len(res.greedy_hf) >= 8 and res.greedy_ours == res.greedy_hf


def test_bf16_weights_load_as_stored_and_the_per_layer_table_stays_narrow(tiny):
    from tailgate.engine.pages import pool_pages
    from tailgate.model.runtime.runner import ModelRunner

    m = load_model(str(tiny("bf16")), log=lambda m: None)
    assert m.weights["layers.0.q"].dtype == torch.bfloat16 and m.weights["layers.0.attn_norm"].dtype == torch.float32
    r = ModelRunner(m.spec, m.weights, pool_pages(64, 1, m.spec.sliding_window), dtype="fp32", device="cpu")
    assert r.w["ple_embed"].dtype == torch.bfloat16 and r.w["embed"].dtype == torch.float32


def test_a_bf16_runtime_runs_every_switch(everything):
    """The MoE router's fp32 scales and the experts' dense dtype meet bf16 activations here."""
    from tailgate.engine.pages import KVBook, SeqPages, pool_pages
    from tailgate.engine.plan import Segment
    from tailgate.model.runtime.runner import ModelRunner

    out = []
    for dtype in ("fp32", "bf16"):
        pages = pool_pages(64, 1, everything.spec.sliding_window)
        r = ModelRunner(everything.spec, everything.weights, pages, dtype=dtype, device="cpu", kernels="torch")
        book, seq = KVBook(pages["global"], pages.get("local"), everything.spec.sliding_window), SeqPages()
        assert book.reserve(seq, 40)
        out.append(r.step([Segment(ids(40, 5), 0, seq, all_logits=True)]).float())
    assert out[1].dtype == torch.float32 and torch.isfinite(out[1]).all()
    # bf16 drifts far on this random, narrow-logit model: HF's own bf16 logits correlate 0.89 with its
    # fp32 ones here, ours 0.95 (Intel Xeon); the bar is loose: it is there for crashes, NaNs and gross errors.
    assert torch.corrcoef(torch.stack([out[0].flatten(), out[1].flatten()]))[0, 1] > 0.8


def test_a_composite_config_ties_the_head_from_its_top_level_and_a_null_layer_table_means_none(tmp_path):
    from transformers import Gemma4TextConfig

    text = {"num_hidden_layers": 6, "hidden_size": 64, "head_dim": 32, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(
        json.dumps(
            {"model_type": "gemma4", "tie_word_embeddings": False, "text_config": {**text, "per_layer_config": None}}
        )
    )
    spec = read_spec(tmp_path)
    assert spec.tie_embeddings is False
    hf = Gemma4TextConfig(**text, per_layer_config=None)
    assert spec.layer_head_dim == tuple(hf.per_layer_config[i].head_dim for i in range(6)) == (32,) * 6


def test_the_spec_reads_per_layer_shapes_and_kv_sharing_as_hf_does(tiny):
    from transformers import AutoConfig

    spec = read_spec(tiny("everything"))
    hf = AutoConfig.from_pretrained(str(tiny("everything")))
    n = hf.num_hidden_layers
    assert spec.layer_head_dim == tuple(hf.per_layer_config[i].head_dim for i in range(n)) == (32, 32, 64, 32, 32, 64)
    assert spec.layer_kv_heads == tuple(hf.per_layer_config[i].num_key_value_heads for i in range(n))
    modes = hf.kv_sharing_modes
    assert [i for i in range(n) if spec.kv_source[i] != i] == [i for i in range(n) if modes[i] == "reuse"]
    assert {spec.kv_source[i] for i in range(n) if spec.kv_source[i] != i} == {
        i for i in range(n) if modes[i] == "store"
    }
    # only the four layers that own KV take pool memory: 3 sliding (2 heads x 32), 1 global (1 x 64)
    assert token_bytes(spec, torch.float32) == {"global": 2 * 64 * 4, "local": 3 * 2 * 2 * 32 * 4}


def test_a_config_in_the_older_form_means_what_it_means_to_hf(tmp_path):
    """global_head_dim / num_global_key_value_heads at the top level, no per_layer_config."""
    from transformers import Gemma4TextConfig

    cfg = {
        "model_type": "gemma4_text",
        "num_hidden_layers": 6,
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = read_spec(tmp_path)
    hf = Gemma4TextConfig(**{k: v for k, v in cfg.items() if k != "model_type"})
    assert spec.layer_head_dim == tuple(hf.per_layer_config[i].head_dim for i in range(6)) == (32,) * 5 + (512,)
    assert spec.layer_kv_heads == tuple(hf.per_layer_config[i].num_key_value_heads for i in range(6))
    assert spec.layer_sliding == tuple(t == "sliding_attention" for t in hf.layer_types)
    assert spec.rope_fraction == 0.25 and spec.rope_theta == 1e6 and spec.rope_local_theta == 1e4


@pytest.mark.parametrize(
    "change,named",
    [
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_activation": "silu"}, "hidden_activation"),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "yarn", "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default"},
                }
            },
            "yarn",
        ),
        ({"per_layer_config": {"5": {"intermediate_size": 256}}}, "intermediate_size"),
        ({"enable_moe_block": True, "num_experts": 4}, "enable_moe_block"),
        ({"num_kv_shared_layers": 6}, "num_kv_shared_layers"),
        ({"vocab_size_per_layer_input": 1000}, "vocab_size_per_layer_input"),
        ({"rope_parameters": {"full_attention": {"rope_type": "default"}}}, "rope_parameters"),
    ],
)
def test_an_unsupported_switch_refuses_by_name_before_any_weights_load(tmp_path, change, named):
    cfg = {"model_type": "gemma4_text", "num_hidden_layers": 6, "hidden_size": 64, **change}
    (tmp_path / "config.json").write_text(json.dumps(cfg))  # no weights at all: the refusal comes first
    with pytest.raises(ValueError, match=named):
        read_spec(tmp_path)


def test_check_and_serve_refuse_an_unsupported_config_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4_text", "attention_bias": True}))
    for cmd in (["check", "--against-hf"], ["serve", "--model"]):
        p = subprocess.run(
            [sys.executable, "-m", "tailgate.cli", *cmd, str(tmp_path)], capture_output=True, text=True, timeout=120
        )
        assert p.returncode != 0 and "attention_bias" in p.stderr, p.stderr[-2000:]


def test_gemma4_gather_mixed_steps_and_the_walk_are_token_exact_vs_serial(everything):
    from tailgate.engine.pages import KVBook, pool_pages
    from tailgate.model.runtime.runner import ModelRunner

    pages = pool_pages(1024, 1, everything.spec.sliding_window)
    runner = ModelRunner(everything.spec, everything.weights, pages, dtype="fp32", device="cpu")
    book = KVBook(pages["global"], pages.get("local"), everything.spec.sliding_window)
    stream, long_prompt = ids(20, 7), ids(150, 9)  # 150 rows: walk rounds of 64, 64, 22, past the window
    gathered = [ids(24, s) for s in range(4)]
    want = [serial.generate(runner, book, p, 10) for p in [stream] + gathered + [long_prompt]]
    with Harness(everything, dtype="fp32", DECODE_SLOTS="8", MIX_CHUNK_TOKENS="64") as h:
        live = h.submit(stream, max_tokens=900)
        assert h.wait(lambda: len(h.tokens(live)) >= 1)
        with h.engine._cv:  # four coincident arrivals ride the live batch together
            rs = [h.submit(p, max_tokens=10) for p in gathered]
        walker = h.submit(long_prompt, max_tokens=10)
        assert h.wait(lambda: all(h.done(x) for x in rs + [walker]))
        assert not h.done(live), "the stream should still be live while the others finish"
        assert len({h.scheduled_step(x) for x in rs}) == 1
        assert [h.tokens(live)[:10]] + [h.tokens(x) for x in rs + [walker]] == want
        h.engine.abort(live)
        assert h.wait(lambda: h.done(live))


def test_a_gemma4_directory_serves_over_http_with_its_chat_template(tiny, everything):
    d = tiny("everything")
    messages = [{"role": "user", "content": "Name three rivers."}]
    body, template = chat_on_directory(d, messages, 6)
    assert body["usage"]["completion_tokens"] == 6 and body["choices"][0]["message"]["content"]
    text = jinja2.Template(template).render(messages=messages, bos_token="<bos>", add_generation_prompt=True)
    assert text.startswith("<bos>A tiny Gemma 4.")  # the directory's template, not the built-in one
    assert body["usage"]["prompt_tokens"] == len(everything.tokenizer.encode(text, add_bos=False))


def test_a_gemma4_directory_without_a_chat_template_refuses_chat_not_guesses(tiny):
    from tailgate.model.tokenizer import Tokenizer

    d = tiny("everything")
    tok = Tokenizer(str(d / "tokenizer.json"), {"family": "gemma4", "bos_id": 2, "add_bos": True})
    with pytest.raises(ValueError, match="no chat template"):
        tok.render_chat([{"role": "user", "content": "hi"}])
    assert tok.encode("hi")[0] == 2  # completions still work
