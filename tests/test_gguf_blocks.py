"""GGUF matrices kept as stored (model/blocks.py, csrc/blocks.c): every block format dequantizes to
gguf's own values, the block matmul is the exact product of the blocks and the rounded activations,
the panels made from blocks are the q8 plan's, and the gguf plan holds no fp32 matrix."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tailgate.model import native
from tailgate.model.blocks import BLOCK, BlockMatmul, Blocks, PanelRows, dequantize_all, q8_panels
from tailgate.model.kernels import Linear
from tailgate.model.runner import resident_bytes

_LIB, _WHY = native.load()
pytestmark = pytest.mark.skipif(_LIB is None, reason=f"{_WHY}: no block kernels here")
FORMATS = list(BLOCK)


def random_blocks(qtype: str, n: int, k: int, seed: int = 0) -> Blocks:
    """Random bits in every field of every block, but finite, model-sized fp16 scales and minimums."""
    rng = np.random.default_rng(seed)
    per, nbytes = BLOCK[qtype]
    data = rng.integers(0, 256, size=(n, k // per * nbytes), dtype=np.uint8)
    v = data.reshape(n, k // per, nbytes)

    def f16(lo, hi):
        return np.frombuffer(rng.uniform(lo, hi, (n, k // per)).astype(np.float16).tobytes(), np.uint8).reshape(
            n, k // per, 2)

    at = {"Q6_K": [208]}.get(qtype, [0, 2] if qtype in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [0])
    for i, off in enumerate(at):
        v[..., off:off + 2] = f16(-0.02, 0.02) if i and qtype in ("Q4_1", "Q5_1") else f16(1e-4, 5e-3)
    return Blocks(data, qtype, (n, k))


def rounded_activations(x: np.ndarray) -> np.ndarray:
    """x as the kernel sees it: int8 in blocks of 32, scale amax / 127, round half to even (fp32 steps)."""
    b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(b).max(-1, keepdims=True)
    mul = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    return (np.round((b * mul).astype(np.float32)) * (amax / np.float32(127))).reshape(x.shape).astype(np.float64)


@pytest.mark.parametrize("qtype", FORMATS)
def test_every_block_format_dequantizes_to_ggufs_own_values(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    b = random_blocks(qtype, 48, 512)
    ref = torch.from_numpy(np.asarray(dequantize(b.data, GGMLQuantizationType[qtype]), dtype=np.float32))
    assert torch.equal(b.dequantize(), ref)
    rows = torch.tensor([[5, 0], [47, 5]])
    assert torch.equal(b[rows], ref[rows])  # the embedding lookup: any index shape
    with pytest.raises(IndexError):
        b[torch.tensor([48])]


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 4, 7])  # a partial and whole groups of 4 rows
def test_the_block_matmul_is_the_exact_product_of_the_blocks_and_the_rounded_activations(qtype, m):
    b = random_blocks(qtype, 40, 512, seed=m)
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
    ref = rounded_activations(x.numpy()) @ b.dequantize().double().numpy().T
    y = BlockMatmul([b])(x).double().numpy()
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_a_fused_matmul_over_parts_in_different_formats_is_their_products_side_by_side():
    parts = [random_blocks("Q5_0", 64, 256, 1), random_blocks("Q8_0", 16, 256, 2), random_blocks("Q4_K", 24, 256, 3)]
    x = torch.randn(5, 256)
    y = BlockMatmul(parts)(x)
    assert torch.equal(y, torch.cat([BlockMatmul([p])(x) for p in parts], 1))


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q5_0"])
def test_a_block_matmul_row_gets_the_same_bits_alone_or_in_any_batch(qtype):
    mm = BlockMatmul([random_blocks(qtype, 72, 512)])
    x = torch.randn(9, 512)
    whole = mm(x)
    for i in (0, 4, 8):
        assert torch.equal(mm(x[i:i + 1])[0], whole[i])
    assert torch.equal(mm(x[3:7]), whole[3:7])


@pytest.mark.parametrize("variant", ["avx2", "avx512_vnni"])  # packing only: no AVX-512 needed to make them
def test_q8_panels_made_from_blocks_a_chunk_at_a_time_are_the_panels_of_the_whole_matrix(variant):
    parts = [random_blocks("Q4_K", 96, 256, 4), random_blocks("Q8_0", 32, 256, 5)]
    q, d, code = q8_panels(parts, variant, 16, chunk=32)
    rq, rd, rcode = native.q8_quantize(dequantize_all(parts), variant)
    assert torch.equal(q, rq) and torch.equal(d, rd) and code == rcode


def q8_0_blocks(n: int, k: int, seed: int = 0) -> Blocks:
    """Q8_0 blocks as llama.cpp writes them: d = amax / 127 (fp16), q = round(x / d), so every
    block holds a q of +-127."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, k // 32, 32)).astype(np.float32) * rng.uniform(0.01, 0.1, (n, k // 32, 1))
    d = (np.abs(x).max(-1, keepdims=True) / 127).astype(np.float16)
    q = np.clip(np.round(x / d.astype(np.float32)), -127, 127).astype(np.int8)
    assert (np.abs(q).max(-1) == 127).all()
    data = np.concatenate([d.view(np.uint8), q.view(np.uint8)], -1).reshape(n, k // 32 * 34)
    return Blocks(np.ascontiguousarray(data), "Q8_0", (n, k))


def test_q8_0_blocks_moved_into_the_panels_are_the_panels_quantized_from_their_values():
    """gq_q8_0_panels moves llama.cpp-style Q8_0 blocks (and all-zero ones, of either sign of scale)
    into the AVX2 panels with q8_quantize's bits, and the rows read back are the blocks' own."""
    b = q8_0_blocks(48, 256)
    v = b.data.reshape(48, 8, 34)
    v[3, 2, 2:] = 0  # a block of zero values under a nonzero scale
    v[4, 5, :2] = np.frombuffer(np.float16(-0.03).tobytes(), np.uint8)  # a negative scale
    v[5, 1, :2] = 0  # a zero scale over nonzero values
    p = q8_panels([b], "avx2", 8, chunk=16)
    rq, rd, _ = native.q8_quantize(b.dequantize(), "avx2")
    assert p.as_stored and torch.equal(p[0], rq) and torch.equal(p[1], rd)
    rows = PanelRows(p)
    ids = torch.tensor([[0, 47, 3], [4, 5, 20]])
    assert torch.equal(rows[ids], b.dequantize(ids)) and rows[ids].shape == (2, 3, 256)
    with pytest.raises(IndexError):
        rows[torch.tensor([48])]


@pytest.mark.parametrize("odd", ["small", "minus128", "inf"])
def test_q8_0_blocks_that_quantize_differently_are_quantized_not_moved(odd):
    """A block whose max |q| is not 127 (another writer), a q of -128 or a scale that is not finite:
    the panels are quantized from the values as before (the q8 plan's bits), and not read back."""
    b = q8_0_blocks(32, 128, 1)
    v = b.data.reshape(32, 4, 34)
    if odd == "small":
        v[9, 1, 2:] = (v[9, 1, 2:].view(np.int8) // 2).view(np.uint8)
    elif odd == "minus128":
        v[9, 1, 2] = 0x80
    else:
        v[9, 1, :2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    p = q8_panels([b, q8_0_blocks(16, 128, 2)], "avx2", 8, chunk=16)
    rq, rd, _ = native.q8_quantize(dequantize_all([b, q8_0_blocks(16, 128, 2)]), "avx2")
    assert not p.as_stored
    assert torch.equal(p[0], rq) and (torch.equal(p[1], rd) if odd != "inf" else True)
    with pytest.raises(ValueError):
        PanelRows(p)


def test_the_gguf_plan_holds_no_fp32_matrix_and_its_panels_are_the_q8_plans(loaded):
    from conftest import Rig
    from tailgate.model.kernels import choose

    m = loaded("smollm2-135m")
    stored = Rig(m, "fp32", slots=1, max_context=64, kernels="gguf")
    w = stored.runner.w
    # the tied Q8_0 table: the head's panels hold it as stored, and lookups read them
    assert isinstance(w["embed"], PanelRows) and w["head"].w is None and w["head"].wide.as_stored
    ids = torch.tensor([[0, 1, m.spec.vocab_size - 1], [5, 8, 13]])
    assert torch.equal(w["embed"][ids], m.weights["embed"][ids])
    assert all(t.dim() <= 1 for t in w.values() if isinstance(t, torch.Tensor))  # norms only
    assert all(v.w is None for v in w.values() if isinstance(v, Linear))  # no dense copy of any matrix
    weights = sum(v.out_features * (v.wide[0].shape[1]) for v in w.values() if isinstance(v, Linear))
    assert resident_bytes(w)["kernels"] == weights * (1 + 4 / 32)  # q8 panels only: an int8 and 1/32 of a scale each
    # The q8 plan quantizes the same values into the same panels: the same bits on every call it runs q8.
    q8 = choose("fp32", "q8", "cpu")
    x = torch.randn(5, m.spec.hidden)
    assert torch.equal(w["head"](x), Linear(m.weights["embed"].dequantize(), q8, "head")(x))
    qkv = torch.cat([m.weights[f"layers.3.{p}"].dequantize() for p in "qkv"])
    assert torch.equal(w["layers.3.qkv"](x), Linear(qkv, q8, "layers")(x))
    ids = m.tokenizer.encode("The capital of France is")
    assert stored.runner.step  # and it serves: greedy tokens from the blocks' embedding and the panels
    from tailgate.model import serial

    assert len(serial.generate(stored.runner, stored.book, ids, 4)) == 4
    stored.assert_no_leak()
