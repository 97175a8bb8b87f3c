"""Loaders: an HF directory of the same weights serves the same logits; bad input is refused."""

from __future__ import annotations

import json

import pytest
import torch

from tailgate.model.runtime import serial
from tailgate.model.formats.gguf_loader import internal_name
from tailgate.model.formats.weights import load_model, resolve_model_path
from conftest import MODELS, Rig, hf_reads_gguf_once


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
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": bos, "add_bos_token": ours.model.tokenizer.add_bos})
    )
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


def test_the_stored_loader_gives_the_gguf_readers_values_for_every_tensor(loaded):
    """Blocks (un-permuted q/k included) and fp32 tensors alike hold what gguf's own reader and
    dequantizer give, with our names and orientation."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    from tailgate.model import families
    from tailgate.model.kernels.blocks import Blocks
    from tailgate.model.formats.gguf_loader import _unpermute

    m = loaded("smollm2-135m")
    family = families.get(m.spec.arch)
    with hf_reads_gguf_once():  # gguf's own reader, over a plain array view of the file's map (conftest.py)
        reader = gguf.GGUFReader(str(m.source))
    assert len(reader.tensors) == len(m.weights)
    for t in reader.tensors:
        name = internal_name(t.name, family)
        want = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        part = name.split(".")[2] if name.startswith("layers.") else ""
        if part in ("q", "k"):
            want = _unpermute(want, m.spec.n_heads if part == "q" else m.spec.n_kv_heads)
        ours = m.weights[name]
        assert isinstance(ours, Blocks) == (want.ndim == 2), name  # every matrix here is Q4_1 or Q8_0
        assert torch.equal(ours.dequantize() if isinstance(ours, Blocks) else ours, torch.from_numpy(want)), name


def test_the_loaders_block_sizes_and_float_formats_are_ggufs_own():
    """read_stored sizes every tensor from its own table and widens F32 / F16 / BF16 itself (a start
    imports no gguf): the table is gguf's, and the widened values are gguf's dequantizer's, bit for bit."""
    import gguf
    import numpy as np
    from gguf.quants import dequantize

    from tailgate.model.formats.gguf_loader import QUANT_SIZES, _widen

    assert QUANT_SIZES == {k: gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[k]] for k in QUANT_SIZES}
    raw = np.random.default_rng(0).integers(0, 256, size=(3, 64), dtype=np.uint8)
    for qtype in ("F32", "F16", "BF16"):
        want = np.asarray(dequantize(raw, gguf.GGMLQuantizationType[qtype]), dtype=np.float32)
        got = _widen(raw, qtype)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32)), qtype


def test_the_cache_key_reads_the_size_mtime_and_header_not_the_tensor_data(tmp_path):
    import os

    import gguf
    import numpy as np

    from tailgate.model.formats.weights import _cache_dir

    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-a")
    w.add_tensor("token_embd.weight", np.arange(128, dtype=np.float32).reshape(4, 32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    st = path.stat()
    key = _cache_dir(path)

    def rewrite(old: bytes, new: bytes, at_end: bool):
        data = path.read_bytes()
        i = data.rindex(old) if at_end else data.index(old)
        path.write_bytes(data[:i] + new + data[i + len(old) :])
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))

    rewrite(np.float32(127).tobytes(), np.float32(-1).tobytes(), at_end=True)  # tensor data: same key
    assert _cache_dir(path) == key
    rewrite(b"tiny-a", b"tiny-b", at_end=False)  # the header: a new key
    assert _cache_dir(path) != key
    rewrite(b"tiny-b", b"tiny-a", at_end=False)
    assert _cache_dir(path) == key
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: a new key
    assert _cache_dir(path) != key
