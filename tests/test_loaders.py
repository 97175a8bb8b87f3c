"""Loaders: an HF directory of the same weights serves the same logits; bad input is refused."""
from __future__ import annotations

import json

import pytest
import torch

from tailgate.model import serial
from tailgate.model.gguf_loader import internal_name
from tailgate.model.weights import load_model, resolve_model_path
from conftest import MODELS, Rig


@pytest.mark.parametrize("name", MODELS)
def test_an_hf_directory_of_the_same_weights_gives_the_same_logits(name, rig, hf_model, tmp_path):
    hf = hf_model(name)
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(hf.config.to_dict()))
    ours = rig(name, "fp32")
    ours.model.tokenizer._tok.save(str(tmp_path / "tokenizer.json"))
    bos = ours.model.tokenizer.bos_token
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": bos, "add_bos_token": ours.model.tokenizer.add_bos}))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(tmp_path), log=lambda _: None)
    assert m.spec == ours.model.spec
    ids = m.tokenizer.encode("The capital of France is")
    assert ids == ours.model.tokenizer.encode("The capital of France is")
    other = Rig(m, "fp32", slots=1, max_context=64)
    a = serial.teacher_forced_logits(other.runner, other.book, ids)
    b = serial.teacher_forced_logits(ours.runner, ours.book, ids)
    assert torch.allclose(a, b, atol=1e-4, rtol=0)


def test_an_unknown_architecture_is_refused_by_name(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 8}))
    with pytest.raises(ValueError, match="unsupported model_type 'mamba'"):
        load_model(str(tmp_path))


def test_unknown_gguf_tensors_and_paths_are_refused():
    with pytest.raises(ValueError, match="unknown GGUF tensor"):
        internal_name("blk.0.attn_qkv.weight")
    with pytest.raises(FileNotFoundError, match="not a short name"):
        resolve_model_path("no-such-model")


def test_bos_is_added_exactly_once(loaded):
    tok = loaded("gemma3-270m").tokenizer
    ids = tok.encode("Hello")
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert tok.encode("<bos>Hello") == ids  # a prompt that spells <bos> does not get a second one
    chat = tok.encode_chat([{"role": "user", "content": "Hello"}])
    assert chat.count(tok.bos_id) == 1 and chat[0] == tok.bos_id
