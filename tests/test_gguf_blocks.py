"""GGUF matrices kept as stored (model/kernels/blocks.py, csrc/blocks.c): every block format dequantizes to
gguf's own values, the block matmul is the exact product of the blocks and the rounded activations,
the panels made from blocks are the q8 plan's, and the gguf plan holds no fp32 matrix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tailgate.model.kernels import native
from tailgate.model.kernels.blocks import (
    BLOCK,
    BlockMatmul,
    Blocks,
    PanelRows,
    Panels,
    SegmentPanels,
    dequantize_all,
    q8_panels,
)
from tailgate.model.kernels.choice import Linear
from tailgate.model.kernels.cpu import this_cpu
from tailgate.model.runtime.runner import resident_bytes

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
            n, k // per, 2
        )

    at = {"Q6_K": [208]}.get(qtype, [0, 2] if qtype in ("Q4_1", "Q5_1", "Q4_K", "Q5_K") else [0])
    for i, off in enumerate(at):
        v[..., off : off + 2] = f16(-0.02, 0.02) if i and qtype in ("Q4_1", "Q5_1") else f16(1e-4, 5e-3)
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
        assert torch.equal(mm(x[i : i + 1])[0], whole[i])
    assert torch.equal(mm(x[3:7]), whole[3:7])


def test_q8_panels_made_from_blocks_a_chunk_at_a_time_are_the_panels_of_the_whole_matrix():
    parts = [random_blocks("Q5_K", 96, 256, 4), random_blocks("Q8_0", 32, 256, 5)]
    q, d, code = q8_panels(parts, "avx512_vnni", 16, chunk=32)  # packing only: no AVX-512 needed to make them
    rq, rd, rcode = native.q8_quantize(dequantize_all(parts), "avx512_vnni")
    assert torch.equal(q, rq) and torch.equal(d, rd) and code == rcode


def test_avx2_panels_of_a_fused_matrix_are_each_parts_own_panels_made_a_chunk_at_a_time():
    """AVX2: one form per part (random Q8_0 bits have blocks whose max |q| is not 127: quantized)."""
    parts = [random_blocks("Q6_K", 96, 256, 4), random_blocks("Q8_0", 32, 256, 5), random_blocks("Q5_0", 16, 256, 6)]
    segs = q8_panels(parts, "avx2", 8, chunk=32)
    assert isinstance(segs, SegmentPanels) and [s[2] for s in segs] == [0, 0, native.Q5_PANELS]
    for s, p in zip(segs[:2], parts):
        rq, rd, _ = native.q8_quantize(p.dequantize(), "avx2")
        assert torch.equal(s[0], rq) and torch.equal(s[1], rd)


def panel_rows(panels, rows: torch.Tensor) -> torch.Tensor:
    """Rows read back from 5-bit (Q5_0) or 4-bit (Q4_K) panels (csrc/blocks.c, for the tests)."""
    q, d, code = panels
    read = {native.Q5_PANELS: native._lib().gq_q5_panel_rows, native.Q4K_PANELS: native._lib().gq_q4_k_panel_rows}
    idx = rows.to(torch.int64).contiguous()
    k = d.shape[1] * 32 if code == native.Q5_PANELS else d.shape[1] * 128
    out = torch.empty(idx.numel(), k)
    read[code](q.data_ptr(), d.data_ptr(), k, idx.data_ptr(), idx.numel(), out.data_ptr())
    return out


# the bit panels: (file type, code, bytes per 256 values: the file's 176 / 144 (Q4_K's 6-bit fields as bytes: 148))
BIT_PANELS = {"Q5_0": (native.Q5_PANELS, 176), "Q4_K": (native.Q4K_PANELS, 148)}


@pytest.mark.parametrize("qtype,k", [("Q5_0", 64), ("Q5_0", 640), ("Q5_0", 2048), ("Q4_K", 256), ("Q4_K", 2048)])
def test_q5_0_and_q4_k_blocks_moved_into_bit_panels_keep_their_own_values_in_the_files_size(qtype, k):
    b = random_blocks(qtype, 24, k, seed=k)
    p = q8_panels([b], "avx2", 8, chunk=8)
    code, per256 = BIT_PANELS[qtype]
    assert isinstance(p, Panels) and p[2] == code and p.as_stored
    assert torch.equal(panel_rows(p, torch.arange(24)), b.dequantize())  # every value, bit for bit
    assert sum(t.numel() * t.element_size() for t in p.tensors()) == 24 * k * per256 // 256


@pytest.mark.parametrize("qtype", ["Q5_0", "Q4_K"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 70])  # partial and whole groups of 4 rows, past a 64-row block
def test_the_bit_panel_matmul_is_the_exact_product_of_the_blocks_and_the_rounded_activations(qtype, m):
    b = random_blocks(qtype, 40, 768 if qtype == "Q4_K" else 640, seed=m)
    p = q8_panels([b], "avx2", 8)
    x = torch.randn(m, b.shape[1], generator=torch.Generator().manual_seed(m))
    ref = rounded_activations(x.numpy()) @ b.dequantize().double().numpy().T
    y = p.linear(x)
    assert p[2] == BIT_PANELS[qtype][0] and np.abs(y.double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()
    for i in {0, m // 2, m - 1}:  # a row's result does not depend on its batch
        assert torch.equal(p.linear(x[i : i + 1])[0], y[i])


def test_q4_k_blocks_in_16_output_panels_are_the_8_output_4_bit_panels_bytes_moved_in_the_files_size():
    """Packing only (no AVX-512 needed): the wide 4-bit panels hold each output's nibbles, scales,
    mins, d and dmin of the 8-output ones, so the same 148 bytes per 256 values."""
    b = random_blocks("Q4_K", 48, 512, 7)
    narrow = q8_panels([b], "avx2", 8)
    for variant, code in native.Q4K_WIDE.items():
        p = q8_panels([b], variant, 16)
        assert isinstance(p, Panels) and p[2] == code and p.as_stored
        assert sorted(p[0].flatten().tolist()) == sorted(narrow[0].flatten().tolist())
        assert torch.equal(p[1].view(3, 2, 2, 2, 8).permute(0, 3, 1, 2, 4).reshape(48, 4), narrow[1])
        assert sum(t.numel() * t.element_size() for t in p.tensors()) == 48 * 512 * 148 // 256


def can_run(variant: str) -> bool:
    """Whether this CPU has the 16-output panels' instructions (AMX CPUs have AVX-512 VNNI too)."""
    here = this_cpu().q8_variant
    return here == "amx" and native.amx_ready() if variant == "amx" else here in ("amx", "avx512_vnni")


@pytest.mark.parametrize("variant", list(native.Q4K_WIDE))
@pytest.mark.parametrize("m", [1, 3, 8, 11, 12, 16, 17, 40, 70])  # both sides of the AMX tile cut, past 64 rows
def test_the_wide_4_bit_panel_matmul_gives_the_avx2_4_bit_panels_bits_at_every_row_count(variant, m):
    if not can_run(variant):
        pytest.skip(f"this CPU cannot run the {variant} panels")
    # 48 x 768: one panel a chunk; 640 x 256: chunks of several, run two panels at a time, one left over
    for n, k in ((48, 768), (640, 256)):
        b = random_blocks("Q4_K", n, k, seed=m)
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        y = q8_panels([b], variant, 16).linear(x)
        assert torch.equal(y, q8_panels([b], "avx2", 8).linear(x))  # the exact sums, the same float steps
        ref = rounded_activations(x.numpy()) @ b.dequantize().double().numpy().T
        assert np.abs(y.double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()


def bf16_product(x: torch.Tensor, w: torch.Tensor) -> np.ndarray:
    """x @ w.T with both sides rounded to bf16 (as the BF16 tiles read them), summed in fp64."""
    return x.to(torch.bfloat16).double().numpy() @ w.to(torch.bfloat16).double().numpy().T


def can_tile_bf16() -> bool:
    return can_run("amx") and "amx_bf16" in this_cpu().flags


def amx_int8_values(p: Panels) -> torch.Tensor:
    """The values an AMX int8 panel form (code 3) holds, [N, K]: q * d, undoing the 16-output interleave."""
    q, d, code = p
    assert code == native.Q8_VARIANTS["amx"]
    n, nb = d.shape
    q8 = q.view(n // 16, nb, 8, 2, 32).permute(0, 3, 1, 2, 4).reshape(n // 8, nb, 8, 8, 4)  # 8-output panels
    w = q8.permute(0, 3, 1, 2, 4).reshape(n, nb, 32).float()  # [output, block, input]
    scales = d.view(n // 16, nb, 2, 8).permute(0, 2, 3, 1).reshape(n, nb)
    return (w * scales[..., None]).reshape(n, nb * 32)


@pytest.mark.parametrize("m,int8_rows,four_rows", [(45, 0, 40), (70, 64, 64), (70, 48, 64), (33, 0, 0)])
def test_rows_on_bf16_tiles_are_the_bf16_product_and_every_other_row_keeps_the_int8_bits(m, int8_rows, four_rows):
    """A fused matrix (4-bit, int8 and 4-bit forms side by side): the leading rows each form is
    told to tile are the product of the bf16-rounded weights and activations (fp32 sums in any
    order); every other row keeps the int8 path's bits."""
    if not can_tile_bf16():
        pytest.skip("this CPU has no AMX BF16 tiles")
    parts = [random_blocks("Q4_K", 48, 768, 1), random_blocks("Q8_0", 32, 768, 2), random_blocks("Q4_K", 16, 768, 3)]
    x = torch.randn(m, 768, generator=torch.Generator().manual_seed(m)) * 3
    p = q8_panels(parts, "amx", 16)
    assert [s[2] for s in p] == [8, 3, 8]
    int8 = p.linear(x)
    y = p.linear(x, tiles=(int8_rows, four_rows))
    held = [parts[0].dequantize(), amx_int8_values(p[1]), parts[2].dequantize()]
    for cols, w, t in zip((slice(0, 48), slice(48, 80), slice(80, 96)), held, (four_rows, int8_rows, four_rows)):
        assert torch.equal(y[t:, cols], int8[t:, cols])
        if t:
            ref = bf16_product(x[:t], w)
            assert np.abs(y[:t, cols].double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()
    if four_rows:
        exact = x.double().numpy() @ dequantize_all(parts[:1]).double().numpy().T
        err = lambda got: np.abs(got[:four_rows, :48].double().numpy() - exact[:four_rows]).max()  # noqa: E731
        assert err(y) <= err(int8)  # bf16 activations lose less than int8 blocks of 32


def test_a_step_puts_its_long_prompt_segments_first_and_tiles_by_each_segments_own_length():
    from tailgate.engine.pages import SeqPages
    from tailgate.engine.plan import Segment
    from tailgate.model.runtime.context import build_context

    def pages():
        p = SeqPages()
        p.global_pages = list(range(8))
        return p

    def seg(n):
        return Segment(list(range(n)), 0, pages())

    short, four, both, decode = seg(20), seg(40), seg(50), Segment([1], 5, pages())
    ctx = build_context([decode, short, four, both], {"global": None}, "cpu")
    assert ctx.tile_rows == (50, 90)  # the 50-row segment in every form, the 40-row one in the 4-bit panels
    assert ctx.tokens.tolist()[:50] == list(range(50)) and ctx.tokens.tolist()[50:90] == list(range(40))
    assert ctx.decode_rows == (110, 111)
    alone = build_context([four], {"global": None}, "cpu")
    assert alone.tile_rows == (0, 40)  # the same rows tiled alone or beside others


@pytest.mark.parametrize("k", [256, 2048 + 256])  # one chunk; chunks of the L2 cut with a narrower last one
def test_bf16_tiles_cover_every_chunk_of_a_long_row_and_every_panel_split_between_threads(k):
    if not can_tile_bf16():
        pytest.skip("this CPU has no AMX BF16 tiles")
    b = random_blocks("Q4_K", 16 * 7, k, 4)  # an odd number of panels: a thread ends on a single one
    x = torch.randn(300, k, generator=torch.Generator().manual_seed(k))  # 1 MiB of bf16 rows: several chunks
    y = q8_panels([b], "amx", 16).linear(x, tiles=(300, 300))
    ref = bf16_product(x, b.dequantize())
    assert np.abs(y.double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()


def test_q6_k_blocks_in_the_heads_16_output_panels_keep_their_own_values_in_the_files_size():
    b = random_blocks("Q6_K", 32, 768, 8)
    six = {**{v: native.Q6K_WIDE for v in native.Q4K_WIDE}, "avx2": native.Q6K_HALVES}  # AVX2 reads them by halves
    for variant, code in six.items():
        assert q8_panels([b], variant, 16)[2] == native.Q8_VARIANTS[variant]  # without `six`: int8 (AMX's layers)
        p = q8_panels([b], variant, 16, six=True)  # the head's
        assert isinstance(p, Panels) and p[2] == code and p.as_stored
        rows = torch.arange(0, 32, 4)
        out = torch.empty(len(rows), 768)
        native._lib().gq_q6_k_wide_rows(
            p[0].data_ptr(), p[1].data_ptr(), 768, rows.data_ptr(), len(rows), out.data_ptr()
        )
        assert torch.equal(out, b.dequantize(rows))  # every value, bit for bit
        assert torch.equal(PanelRows(p)[rows.view(2, -1)], b.dequantize(rows).view(2, -1, 768))  # a tied table's lookup
        assert sum(t.numel() * t.element_size() for t in p.tensors()) == 32 * 768 * 210 // 256


@pytest.mark.parametrize("m", [1, 3, 8, 9, 17, 70])
@pytest.mark.parametrize("variant", ["avx2", "avx512_vnni"])
def test_the_6_bit_panel_matmul_whole_or_by_halves_is_the_exact_product_of_the_blocks_and_the_rounded_activations(
    m, variant
):
    """The 16-output 6-bit panels read whole on AVX-512 VNNI (code 9) and by 8-output halves on AVX2
    (code 10, every x86 class with the native kernels): the same bytes, the same bits out."""
    if variant != "avx2" and not can_run(variant):
        pytest.skip("this CPU has no AVX-512 VNNI")
    b = random_blocks("Q6_K", 48, 768, seed=m)
    x = torch.randn(m, 768, generator=torch.Generator().manual_seed(m))
    p = q8_panels([b], variant, 16, six=True)
    y = p.linear(x)
    ref = rounded_activations(x.numpy()) @ b.dequantize().double().numpy().T
    code = native.Q6K_HALVES if variant == "avx2" else native.Q6K_WIDE
    assert p[2] == code and np.abs(y.double().numpy() - ref).max() <= 1e-5 * np.abs(ref).max()
    for i in {0, m // 2, m - 1}:  # a row's result does not depend on its batch
        assert torch.equal(p.linear(x[i : i + 1])[0], y[i])
    if can_run("avx512_vnni"):  # the halves are the whole panel's bits
        assert torch.equal(y, q8_panels([b], "avx512_vnni", 16, six=True).linear(x))


@pytest.mark.parametrize("variant", list(native.Q4K_WIDE))
def test_a_fused_q4_k_q6_k_and_q8_0_matrix_is_bit_and_int8_wide_panels_side_by_side_in_one_call(variant):
    if not can_run(variant):
        pytest.skip(f"this CPU cannot run the {variant} panels")
    parts = [random_blocks("Q4_K", 32, 512, 1), random_blocks("Q6_K", 16, 512, 2), q8_0_blocks(16, 512, 3)]
    segs = q8_panels(parts, variant, 16, six=True)
    codes = [s[2] for s in segs]
    assert isinstance(segs, SegmentPanels) and codes == [
        native.Q4K_WIDE[variant],
        native.Q6K_WIDE,
        native.Q8_VARIANTS[variant],
    ]
    assert segs.as_stored  # the Q8_0 part's int8 panels hold its values too
    for m in (1, 6, 19):
        x = torch.randn(m, 512)
        y = segs.linear(x)
        assert torch.equal(y, torch.cat([s.linear(x) for s in segs], 1))
        assert torch.equal(y[:, 48:], native.q8_linear(x, *native.q8_quantize(parts[2].dequantize(), variant)))


@pytest.mark.parametrize("variant", list(native.Q4K_WIDE))
def test_the_wide_panels_give_the_same_bits_with_their_weights_prefetched_near_or_far(variant):
    """csrc/q8.c prefetch_ahead: 32 KB ahead into L2 (AMD) or four blocks ahead into L1 (elsewhere)
    moves when bytes arrive, never what is summed; the matrix spans many 32 KB strides."""
    if not can_run(variant):
        pytest.skip(f"this CPU cannot run the {variant} panels")
    parts = [random_blocks("Q4_K", 256, 1024, 1), random_blocks("Q6_K", 64, 1024, 2), q8_0_blocks(64, 1024, 3)]
    segs = q8_panels(parts, variant, 16, six=True)
    x = torch.randn(5, 1024, generator=torch.Generator().manual_seed(5))
    try:
        seen = []
        for far in (0, 1):
            _LIB.q8_prefetch_far(far)
            seen.append([segs.linear(x[:m]) for m in (1, 4, 5)])
    finally:
        _LIB.q8_prefetch_far(1 if this_cpu().prefetch_far else 0)
    assert all(torch.equal(a, b) for a, b in zip(*seen))


@pytest.mark.parametrize("six", [False, True])
def test_a_fused_matrix_in_panels_of_different_forms_is_their_products_side_by_side_in_one_call(six):
    parts = [
        random_blocks("Q5_0", 32, 256, 1),
        random_blocks("Q6_K", 16, 256, 5),
        random_blocks("Q5_0", 8, 256, 2),
        q8_0_blocks(16, 256, 3),
        random_blocks("Q4_K", 8, 256, 4),
    ]
    segs = q8_panels(parts, "avx2", 8, six=six)
    q6 = native.Q6K_HALVES if six else 0  # with `six` the Q6_K part's own bits, read by halves
    assert [s[2] for s in segs] == [native.Q5_PANELS, q6, native.Q5_PANELS, native.Q8_F16_SCALES, native.Q4K_PANELS]
    for m in (1, 6, 67):
        x = torch.randn(m, 256)
        assert torch.equal(segs.linear(x), torch.cat([s.linear(x) for s in segs], 1))


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


def odd_q8_0_blocks() -> Blocks:
    """llama.cpp-style Q8_0 blocks with the corner cases the move must keep: a block of zero values
    under a nonzero scale, a negative scale, a zero scale over nonzero values."""
    b = q8_0_blocks(48, 256)
    v = b.data.reshape(48, 8, 34)
    v[3, 2, 2:] = 0
    v[4, 5, :2] = np.frombuffer(np.float16(-0.03).tobytes(), np.uint8)
    v[5, 1, :2] = 0
    return b


def test_q8_0_blocks_moved_into_the_panels_are_the_panels_quantized_from_their_values():
    """gq_q8_0_panels moves llama.cpp-style Q8_0 blocks (and all-zero ones, of either sign of scale)
    into the AVX2 panels with q8_quantize's values, their scales kept as the file's fp16 (code 4:
    half the bytes of q8_quantize's fp32 scales, the same numbers), and the matmul gives the fp32-
    scaled panels' bits."""
    b = odd_q8_0_blocks()
    p = q8_panels([b], "avx2", 8, chunk=16)
    rq, rd, _ = native.q8_quantize(b.dequantize(), "avx2")
    assert p.as_stored and p[2] == native.Q8_F16_SCALES and p[1].dtype == torch.float16
    assert torch.equal(p[0], rq) and torch.equal(p[1].float(), rd)
    for m in (1, 5, 66):
        x = torch.randn(m, 256)
        assert torch.equal(p.linear(x), native.q8_linear(x, rq, rd, 0))


def test_embedding_rows_read_from_panels_are_the_blocks_rows_bit_for_bit_refuse_ids_out_of_range_name_their_device():
    from device_guard import DeviceGuard

    b = odd_q8_0_blocks()
    p = q8_panels([b], "avx2", 8, chunk=16)
    rows = PanelRows(p)
    assert rows.shape == (48, 256) and rows.device == torch.device("cpu") and rows.dtype == torch.float32
    ids = torch.tensor([[0, 47, 3], [4, 5, 20]])
    guard = DeviceGuard("cpu")
    with guard:
        got = rows[ids]
    assert guard.deviceless == [] and guard.elsewhere == [] and got.device == rows.device
    assert torch.equal(got, b.dequantize(ids)) and got.shape == (2, 3, 256)
    assert torch.equal(rows[torch.arange(48)], b.dequantize())  # every row
    for bad in ([48], [-1], [0, 1000]):
        with pytest.raises(IndexError):
            rows[torch.tensor(bad)]
    rq, rd, _ = native.q8_quantize(b.dequantize(), "avx2")  # the fp32-scaled panels read back the same rows
    fp32 = Panels((rq, rd, 0))
    fp32.as_stored = True
    assert torch.equal(PanelRows(fp32)[ids], got)


@pytest.mark.parametrize("variant", ["avx512_vnni", "amx"])
def test_embedding_rows_read_from_16_output_panels_are_the_blocks_rows_bit_for_bit(variant):
    """The AVX-512 VNNI and AMX panels (16 outputs interleaved, VNNI's bytes offset) are only made
    here, never run, so this holds on any CPU: rows read back are the file's, and blocks that would
    requantize differently leave the panels not `as_stored` (lookups then read the blocks)."""
    b = odd_q8_0_blocks()
    p = q8_panels([b], variant, 16, chunk=16)
    assert p.as_stored and p[2] == native.Q8_VARIANTS[variant]
    rows = PanelRows(p)
    ids = torch.tensor([[0, 47, 3], [4, 5, 20], [15, 16, 31]])
    assert torch.equal(rows[ids], b.dequantize(ids)) and rows[ids].shape == (3, 3, 256)
    assert torch.equal(rows[torch.arange(48)], b.dequantize())
    v = b.data.reshape(48, 8, 34)
    v[9, 1, 2:] = (v[9, 1, 2:].view(np.int8) // 2).view(np.uint8)  # max |q| 63: requantizes to other values
    assert not q8_panels([b], variant, 16, chunk=16).as_stored


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
    segs = q8_panels([b, q8_0_blocks(16, 128, 2)], "avx2", 8, chunk=16)
    p = segs[0]  # the odd part; the other is moved
    rq, rd, _ = native.q8_quantize(b.dequantize(), "avx2")
    assert not p.as_stored and p[2] == 0 and segs[1].as_stored and not segs.as_stored
    assert torch.equal(p[0], rq) and (torch.equal(p[1], rd) if odd != "inf" else True)
    for panels in (p, segs):
        with pytest.raises(ValueError):
            PanelRows(panels)


def test_the_gguf_plan_holds_no_fp32_matrix_and_its_panels_are_the_q8_plans(loaded):
    """On whatever panel variant this CPU runs (AVX2's 8-output panels with the file's fp16 scales,
    or the 16-output AVX-512 VNNI / AMX ones with fp32 scales): the tied Q8_0 table's lookups read
    the head's panels and give the file's rows bit for bit, no matrix has a dense copy, and the
    kernels hold one int8 a weight plus its block's scale, nothing else."""
    from conftest import Rig
    from tailgate.model.kernels.choice import choose

    m = loaded("smollm2-135m")
    stored = Rig(m, "fp32", slots=1, max_context=64, kernels="gguf")
    w = stored.runner.w
    head = w["head"].wide
    assert isinstance(w["embed"], PanelRows) and w["head"].w is None and head.as_stored
    assert w["embed"].q is head[0]
    assert head[2] == (
        native.Q8_F16_SCALES
        if stored.runner.plan.q8_variant == "avx2"
        else native.Q8_VARIANTS[stored.runner.plan.q8_variant]
    )
    ids = torch.tensor([[0, 1, m.spec.vocab_size - 1], [5, 8, 13]])
    assert torch.equal(w["embed"][ids], m.weights["embed"][ids])
    assert all(t.dim() <= 1 for t in w.values() if isinstance(t, torch.Tensor))  # norms only
    assert all(v.w is None for v in w.values() if isinstance(v, Linear))  # no dense copy of any matrix
    forms = lambda v: [v.wide] if isinstance(v.wide, Panels) else list(v.wide)  # noqa: E731
    expect = sum(
        p[0].numel() * (1 + p[1].element_size() / 32) for v in w.values() if isinstance(v, Linear) for p in forms(v)
    )
    assert all(
        p[0].element_size() == 1 and p[0].numel() == p[1].numel() * 32
        for v in w.values()
        if isinstance(v, Linear)
        for p in forms(v)
    )  # an int8 per weight
    assert resident_bytes(w)["kernels"] == expect
    # The q8 plan quantizes the same values into the same panels: the same bits on every call it runs q8.
    q8 = choose("fp32", "q8", "cpu")
    x = torch.randn(5, m.spec.hidden)
    assert torch.equal(w["head"](x), Linear(m.weights["embed"].dequantize(), q8, "head")(x))
    qkv = torch.cat([m.weights[f"layers.3.{p}"].dequantize() for p in "qkv"])
    assert torch.equal(w["layers.3.qkv"](x), Linear(qkv, q8, "layers")(x))
    ids = m.tokenizer.encode("The capital of France is")
    assert stored.runner.step  # and it serves: greedy tokens from the blocks' embedding and the panels
    from tailgate.model.runtime import serial

    assert len(serial.generate(stored.runner, stored.book, ids, 4)) == 4
    stored.assert_no_leak()


def test_gemma3s_q5_0_and_q4_k_matrices_run_from_bit_panels_of_their_own_values_and_its_tied_head_from_moved_q8_0(rig):
    r = rig("gemma3-270m", "auto", "auto")
    if r.runner.plan.quant != "gguf" or r.runner.plan.q8_variant != "avx2":
        pytest.skip(f"the AVX2 panel forms; this plan: {r.runner.plan.line()}")
    w, raw = r.runner.w, r.model.weights
    gate_up = w["layers.0.gate_up"].wide
    assert isinstance(gate_up, SegmentPanels) and [s[2] for s in gate_up] == [native.Q5_PANELS] * 2
    assert torch.equal(
        panel_rows(gate_up[1], torch.arange(0, 2048, 97)), raw["layers.0.up"].dequantize(torch.arange(0, 2048, 97))
    )
    # o and half the downs: Q4_K in 4-bit panels; the other downs Q6_K in 6 bits, read by halves (AVX2)
    assert {w[f"layers.{i}.o"].wide[2] for i in range(r.model.spec.n_layers)} == {native.Q4K_PANELS}
    assert {w[f"layers.{i}.down"].wide[2] for i in range(r.model.spec.n_layers)} == {
        native.Q4K_PANELS,
        native.Q6K_HALVES,
    }
    assert torch.equal(
        panel_rows(w["layers.0.o"].wide, torch.arange(0, 640, 31)),
        raw["layers.0.o"].dequantize(torch.arange(0, 640, 31)),
    )
    # q/k/v: 5-bit q and k; v is Q5_0 in half the layers, Q8_0 (moved, fp16 scales) in the others
    forms = {tuple(s[2] for s in w[f"layers.{i}.qkv"].wide) for i in range(r.model.spec.n_layers)}
    assert forms == {(5, 5, 5), (5, 5, 4)}
    head = w["head"].wide
    assert head[2] == native.Q8_F16_SCALES and head.as_stored and w["embed"].q is head[0]
    x = torch.randn(3, r.model.spec.hidden)
    ref = rounded_activations(x.numpy()) @ raw["layers.0.up"].dequantize().double().numpy().T
    y = w["layers.0.gate_up"](x)[:, 2048:].double().numpy()
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_outside_amx_a_layers_q6_k_matrices_stay_in_their_6_bits_and_run_the_exact_product(rig):
    """Gemma 3 270M's Q4_K_M file stores half its downs as Q6_K: on AVX-512 VNNI without AMX and on
    AVX2 (choice.six_bits) they are read in the file's bits at every call, not as int8 panels
    quantized from them; on AMX they stay int8, whose prompt rows the tiles take."""
    from tailgate.model.kernels.choice import six_bits

    assert six_bits("avx512_vnni", "layers") and six_bits("avx2", "layers")
    assert six_bits("amx", "head") and six_bits("avx2", "head") and not six_bits("amx", "layers")
    r = rig("gemma3-270m", "auto", "auto")
    variant = r.runner.plan.q8_variant
    if r.runner.plan.quant != "gguf" or variant not in ("avx512_vnni", "avx2"):
        pytest.skip(f"the AVX-512 VNNI or AVX2 panel forms; this plan: {r.runner.plan.line()}")
    w, raw = r.runner.w, r.model.weights
    downs = {i: w[f"layers.{i}.down"].wide for i in range(r.model.spec.n_layers)}
    four, six = (
        (native.Q4K_WIDE[variant], native.Q6K_WIDE) if variant != "avx2" else (native.Q4K_PANELS, native.Q6K_HALVES)
    )
    assert {p[2] for p in downs.values()} == {four, six}
    i = next(i for i, p in downs.items() if p[2] == six)
    assert raw[f"layers.{i}.down"].qtype == "Q6_K" and downs[i].as_stored
    b = raw[f"layers.{i}.down"]
    assert sum(t.numel() * t.element_size() for t in downs[i].tensors()) == b.shape[0] * b.shape[1] * 210 // 256
    x = torch.randn(5, b.shape[1], generator=torch.Generator().manual_seed(3))
    ref = rounded_activations(x.numpy()) @ b.dequantize().double().numpy().T
    y = w[f"layers.{i}.down"](x).double().numpy()
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()
