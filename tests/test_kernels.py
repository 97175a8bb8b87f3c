"""The per-CPU kernel choice (from a faked cpuinfo) and every kernel's arithmetic on this CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from tailgate.model.kernels import native
from tailgate.model.kernels.cpu import parse_cpuinfo, this_cpu
from tailgate.model.kernels.choice import KernelError, Linear, choose, quantize_int4
from tailgate.model.runtime.runner import ModelRunner

EPYC = parse_cpuinfo("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse sse2 avx f16c fma avx2 bmi2\n")
XEON = parse_cpuinfo(
    "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: avx avx2 fma f16c avx512f avx512bw "
    "avx512vl avx512dq avx512_bf16 amx_bf16 amx_tile amx_int8\n"
)
OLD = parse_cpuinfo("model name\t: Some CPU\nflags\t\t: sse sse2\n")


def test_cpuinfo_is_read_into_the_model_name_and_an_isa_class():
    assert (EPYC.model, EPYC.isa, EPYC.native_bf16, EPYC.onednn_bf16) == ("AMD EPYC 7B13", "avx2", False, False)
    assert (XEON.isa, XEON.native_bf16, XEON.onednn_bf16) == ("amx", True, True)
    assert OLD.isa == "baseline"
    assert (native.attention_lanes(EPYC), native.attention_lanes(XEON)) == (8, 16)  # decode attention's width
    assert (EPYC.prefetch_far, XEON.prefetch_far, OLD.prefetch_far) == (True, False, False)  # csrc/q8.c


# Our C kernels need a C compiler on x86-64; where there is none the plan falls back (tested
# above with a fake) and the tests of the kernels' arithmetic skip.
_LIB, _WHY = native.load()
needs_native = pytest.mark.skipif(_LIB is None, reason=f"{_WHY}: torch's kernels serve")
Q8 = pytest.param("q8", marks=needs_native)
BUILT = lambda: (object(), None)  # noqa: E731  (a q8 library that built)
NO_CC = lambda: (None, "q8 kernel could not be built: cc not found")  # noqa: E731


def test_an_avx2_cpu_serves_the_gguf_files_blocks_through_q8_panels_made_from_them():
    p = choose(cpu=EPYC, mkldnn=True, cuda=False, native_build=BUILT)
    assert (p.dtype, p.dense, p.quant) == (torch.float32, "onednn", "gguf")
    assert "AMD EPYC 7B13" in p.line() and "GGUF blocks as stored" in p.line() and "q8 int8 x int8" in p.line()
    q8 = choose("auto", "q8", cpu=EPYC, mkldnn=True, cuda=False, native_build=BUILT)  # still chosen by name
    assert q8.quant == "q8" and min(q8.quant_rows) >= 1
    assert p.kv == torch.float16 and "float16 KV" in p.line() and p.as_dict()["kv_dtype"] == "float16"


def test_without_a_compiler_auto_falls_back_to_int8_and_says_why_but_a_forced_q8_refuses():
    p = choose(cpu=EPYC, mkldnn=True, cuda=False, native_build=NO_CC)
    assert p.quant == "int8" and "cc not found; using int8" in p.line() and p.as_dict()["note"]
    assert p.kv == torch.float32 and p.attention == "torch"  # torch's attention reads the runtime dtype
    with pytest.raises(KernelError, match="--kernels q8 refused: q8 kernel could not be built: cc not found"):
        choose("auto", "q8", cpu=EPYC, mkldnn=True, cuda=False, native_build=NO_CC)
    with pytest.raises(KernelError, match="native kernels need AVX2, FMA and F16C, which this CPU .* lacks"):
        choose("auto", "q8", cpu=OLD, mkldnn=True, cuda=False, native_build=BUILT)


def test_an_amx_cpu_serves_the_gguf_blocks_as_stored_and_q8_by_name_keeps_bf16_weights_for_large_steps():
    # auto: one form per matrix (q8 panels made from the blocks, every call), fp32 activations
    p = choose(cpu=XEON, mkldnn=True, cuda=False, native_build=BUILT)
    assert (p.dtype, p.dense, p.quant, p.quant_rows, p.attention, p.kv) == (
        torch.float32,
        "onednn",
        "gguf",
        (0, 0),
        "native",
        torch.float16,
    )
    assert "bfloat16 weights" not in p.line() and p.as_dict()["dense_dtype"] == "float32"
    # --kernels q8 (dtype auto): fp32 activations over bf16 dense weights, q8 for the small calls
    q = choose("auto", "q8", cpu=XEON, mkldnn=True, cuda=False, native_build=BUILT)
    assert (q.dtype, q.dense_dtype, q.dense, q.quant, q.attention, q.kv) == (
        torch.float32,
        torch.bfloat16,
        "onednn",
        "q8",
        "native",
        torch.float16,
    )
    assert 1 <= min(q.quant_rows) and max(q.quant_rows) <= 64 and "bfloat16 weights" in q.line()
    assert q.as_dict()["dense_dtype"] == "bfloat16"
    # prompt rows attend in bf16 there (decode rows keep the fp32 kernel); an explicit fp32 plan does not
    assert p.prompt_attention == torch.bfloat16 and p.as_dict()["prompt_attention"] == "bfloat16"
    assert "bfloat16 prompt attention" in p.line()
    f = choose("fp32", "auto", cpu=XEON, mkldnn=True, cuda=False, native_build=BUILT)
    assert f.prompt_attention is None and f.as_dict()["prompt_attention"] == "float32"


def test_an_amx_cpu_without_our_kernels_keeps_the_all_bf16_plan_and_says_why():
    p = choose(cpu=XEON, mkldnn=True, cuda=False, native_build=NO_CC)
    assert (p.dtype, p.dense_dtype, p.dense, p.quant, p.attention) == (torch.bfloat16, None, "onednn", None, "torch")
    assert "cc not found" in p.line()
    # an explicit bf16 (the exactness and peer comparisons) stays all-bf16 and dense
    p = choose("bf16", cpu=XEON, mkldnn=True, cuda=False, native_build=BUILT)
    assert (p.dtype, p.dense_dtype, p.quant) == (torch.bfloat16, None, None)


@pytest.mark.skipif(
    not torch.backends.mkldnn.is_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="oneDNN has no bf16 path on this CPU",
)
def test_bf16_weights_under_fp32_activations_compute_the_product_within_bf16_precision():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(256, 320, generator=g) * 0.05
    lin = Linear(w, dataclasses.replace(_plan(None), dense_dtype=torch.bfloat16), "layers")
    x = torch.randn(24, 320, generator=g)
    y, want = lin(x), F.linear(x, w)
    assert y.dtype == torch.float32 and (y - want).norm() / want.norm() < 1e-2


def test_an_explicit_dtype_keeps_the_weights_dense_for_the_exactness_gates():
    for cpu in (EPYC, XEON):
        p = choose("fp32", cpu=cpu, mkldnn=True, cuda=False)
        assert (p.dtype, p.dense, p.quant, p.kv) == (torch.float32, "onednn", None, torch.float32)


def test_bf16_without_onednn_support_falls_back_to_f_linear_and_a_forced_onednn_refuses():
    p = choose("bf16", cpu=EPYC, mkldnn=True, cuda=False)
    assert (p.dtype, p.dense) == (torch.bfloat16, "torch")
    with pytest.raises(KernelError, match="AVX-512 BW/VL/DQ or AVX-NE-CONVERT.*AMD EPYC 7B13"):
        choose("bf16", "onednn", cpu=EPYC, mkldnn=True, cuda=False)
    assert choose("bf16", "onednn", cpu=XEON, mkldnn=True, cuda=False).dense == "onednn"


def test_without_onednn_everything_is_f_linear():
    assert choose(cpu=EPYC, mkldnn=False, cuda=False).dense == "torch"
    with pytest.raises(KernelError, match="without oneDNN"):
        choose("fp32", "onednn", cpu=EPYC, mkldnn=False, cuda=False)


@pytest.mark.parametrize(
    "dtype,kernels,match",
    [
        ("bf17", "auto", r"--dtype 'bf17' not recognized \(accepted: auto \| bf16 \| fp32 \| fp16\)"),
        (
            "auto",
            "int9",
            r"--kernels \(TAILGATE_KERNELS\) 'int9' not recognized \(accepted: auto \| torch \| onednn \| q8 \| gguf \| int8 \| int4\)",
        ),
        ("fp16", "int8", "fp32 or bf16 activations"),
    ],
)
def test_unknown_or_impossible_choices_refuse_naming_the_grammar(dtype, kernels, match):
    with pytest.raises(KernelError, match=match):
        choose(dtype, kernels, cpu=EPYC, mkldnn=True, cuda=False)


def test_cpu_kernels_refuse_on_cuda():
    with pytest.raises(KernelError, match="CPU kernel"):
        choose("auto", "int8", device="cuda", cpu=EPYC, mkldnn=True, cuda=True)


def test_a_forced_quantized_kernel_applies_on_any_cpu():
    p = choose("auto", "int4", cpu=XEON, mkldnn=True, cuda=False)
    assert p.quant == "int4" and p.dtype == torch.bfloat16


def _plan(kind, rows=10**9):
    dense = "onednn" if torch.backends.mkldnn.is_available() else "torch"
    base = choose("fp32", "torch" if dense == "torch" else "auto", device="cpu")
    return dataclasses.replace(base, quant=kind, quant_rows=(rows, rows) if kind else (0, 0))


@pytest.mark.parametrize(
    "kind,tol", [(None, 1e-5), pytest.param("q8", 2e-2, marks=needs_native), ("int8", 2e-2), ("int4", 0.15)]
)
def test_every_kernel_computes_the_same_product_within_its_precision(kind, tol):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 320, generator=g) * 0.05
    lin = Linear(w, _plan(kind), "layers")
    for rows in (1, 5, 64):
        x = torch.randn(rows, 320, generator=g)
        want = F.linear(x, w)
        err = (lin(x) - want).norm() / want.norm()
        assert err < tol, (kind, rows, err.item())


def test_the_q8_panels_follow_the_cpus_int8_instructions():
    assert (
        EPYC.q8_variant == "avx2" and choose(cpu=EPYC, mkldnn=True, cuda=False, native_build=BUILT).q8_variant == "avx2"
    )
    p = choose("auto", "q8", cpu=XEON, mkldnn=True, cuda=False, native_build=BUILT)
    assert (p.q8_variant, p.as_dict()["q8_variant"], p.quant_rows) == ("amx", "amx", (64, 32))
    assert "q8 int8 x int8 (amx)" in p.line()
    assert choose(cpu=XEON, mkldnn=True, cuda=False, native_build=BUILT).q8_variant == "amx"  # auto's panels too
    # the OS may refuse the tiles: the plan steps down to the widest VNNI and says so
    p = choose("auto", "q8", cpu=XEON, mkldnn=True, cuda=False, native_build=BUILT, amx_grant=lambda: False)
    assert p.q8_variant == "avx2" and "did not grant AMX tiles: q8 on avx2" in p.line()
    vnni = parse_cpuinfo(f"model name\t: {XEON.model}\nflags\t\t: {' '.join(XEON.flags)} avx512_vnni avx_vnni\n")
    p = choose("auto", "q8", cpu=vnni, mkldnn=True, cuda=False, native_build=BUILT, amx_grant=lambda: False)
    assert p.q8_variant == "avx512_vnni" and p.quant_rows == (32, 16)  # the wide panels' own crossover on AMX
    alder = parse_cpuinfo("model name\t: Intel(R) Core(TM) i7-12700\nflags\t\t: avx avx2 fma f16c avx_vnni\n")
    assert choose(cpu=alder, mkldnn=True, cuda=False, native_build=BUILT).q8_variant == "avx_vnni"
    assert (
        choose("fp32", "onednn", cpu=vnni, mkldnn=True, cuda=False, native_build=BUILT).as_dict()["q8_variant"] is None
    )


# The CPU classes tailgate has met, with their real /proc/cpuinfo flags (the Zen 3 line is the
# AVX2 EPYC's; Zen 5's from an EPYC of family 26), and the plan `auto` must give each.
ZEN3 = parse_cpuinfo(
    "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 fma f16c avx avx2 bmi1 bmi2 vaes "
    "vpclmulqdq sha_ni popcnt\n"
)
ZEN5 = parse_cpuinfo(
    "model name\t: AMD EPYC 9B45\nflags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 fma f16c avx avx2 bmi1 bmi2 "
    "avx_vnni avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vbmi2 "
    "gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_vp2intersect\n"
)
XEON_VNNI = parse_cpuinfo(
    f"model name\t: {XEON.model}\nflags\t\t: {' '.join(sorted(XEON.flags))} avx512_vnni avx_vnni\n"
)
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
EVERY = 1 << 31
PLANS = {  # (cpu, q8 builds, OS grants AMX) -> (dtype, dense, dense_dtype, quant, cuts, variant, attention, kv, prompt)
    # prompt rows attend through the native kernel wherever attention is native, except on AMX (bf16 SDPA there)
    "AVX2-only EPYC (Zen 3)": (
        (ZEN3, True, False),
        (F32, "onednn", None, "gguf", (0, 0), "avx2", "native", F16, "native"),
    ),
    # every class serves the GGUF's blocks as stored, through the widest q8 panels it has (issue 35:
    # one form per matrix, and no row cut to tune per class); bf16 is only the prompt rows' attention
    "AMX Xeon": ((XEON_VNNI, True, True), (F32, "onednn", BF16, "gguf", (0, 0), "amx", "native", F16, "bfloat16")),
    "AMX refused by the OS": (
        (XEON_VNNI, True, False),
        (F32, "onednn", BF16, "gguf", (0, 0), "avx512_vnni", "native", F16, "bfloat16"),
    ),
    "AVX-512 BF16 without AMX (Zen 5)": (
        (ZEN5, True, False),
        (F32, "onednn", BF16, "gguf", (0, 0), "avx512_vnni", "native", F16, "native"),
    ),
    "no compiler, AVX2": (
        (ZEN3, False, False),
        (F32, "onednn", None, "int8", (16, 6), "avx2", "torch", F32, "float32"),
    ),
    "no compiler, AVX-512 BF16": (
        (ZEN5, False, False),
        (BF16, "onednn", None, None, (0, 0), "avx2", "torch", BF16, "bfloat16"),
    ),
}


@pytest.mark.parametrize("cls", list(PLANS))
def test_every_known_cpu_class_gets_its_plan(cls):
    (cpu, builds, grant), want = PLANS[cls]
    p = choose(cpu=cpu, mkldnn=True, cuda=False, native_build=BUILT if builds else NO_CC, amx_grant=lambda: grant)
    got = (p.dtype, p.dense, p.dense_dtype, p.quant, p.quant_rows, p.q8_variant, p.attention, p.kv)
    got += (p.as_dict()["prompt_attention"],)
    assert got == want, f"{cls}: {p.line()}"
    assert cpu.model in p.line() and p.as_dict()["cpu"] == cpu.model


@needs_native
@pytest.mark.parametrize("variant", [v for v in native.Q8_VARIANTS if v != "avx2"])
def test_every_other_q8_panel_gives_the_avx2_panels_bits(variant):
    have = {
        "avx_vnni": {"avx_vnni"},
        "avx512_vnni": {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni"},
        "amx": {"avx512f", "avx512bw", "avx512dq", "avx512vl", "amx_tile", "amx_int8"},
    }
    if not have[variant] <= this_cpu().flags or (variant == "amx" and not native.amx_ready()):
        pytest.skip(f"this CPU ({this_cpu().model}) or its OS offers no {variant}")
    g = torch.Generator().manual_seed(5)
    # 608: an odd number of blocks (AMX pairs them); 640 x 256: chunks of several panels, which the
    # VNNI kernel runs two at a time, with one left over
    for n, k in ((96, 576), (64, 2048), (32, 608), (640, 256)):
        w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)  # scales differ per output
        base, other = native.q8_quantize(w, "avx2"), native.q8_quantize(w, variant)
        for rows in (0, 1, 3, 4, 5, 8, 9, 16, 17, 70):  # every remainder of the 4-, 8-, 16-row sweeps, past 64; none
            x = torch.randn(rows, k, generator=g) * 4
            assert torch.equal(native.q8_linear(x, *other), native.q8_linear(x, *base)), (variant, n, k, rows)


@needs_native
def test_a_q8_row_gets_the_same_bits_alone_or_in_any_batch():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(96, 576, generator=g)  # K = 576: super-blocks of 64, as in SmolLM2
    lin = Linear(w, _plan("q8"), "layers")
    x = torch.randn(11, 576, generator=g)
    full = lin(x)
    for rows in (slice(0, 1), slice(3, 5), slice(4, 11)):
        assert torch.equal(lin(x[rows]), full[rows])


def test_int4_reproduces_a_matrix_on_the_q4_grid_up_to_bf16_activations():
    # Every group holds q = 0..15 exactly, with power-of-two scales: the file's own Q4_K shape.
    g = torch.Generator().manual_seed(1)
    q = torch.stack([torch.randperm(32, generator=g) % 16 for _ in range(64 * 10)]).float().view(64, 320)
    scale = 2.0 ** -torch.randint(4, 8, (64, 10), generator=g).float()
    w = (q.view(64, 10, 32) * scale[..., None] - 8 * scale[..., None]).view(64, 320)
    packed, sz = quantize_int4(w)
    x = torch.randn(3, 320, generator=g)
    got = torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, 32, sz).float()
    want = F.linear(x.to(torch.bfloat16).float(), w)
    assert torch.allclose(got, want, rtol=1e-2, atol=1e-2)


def test_a_step_picks_its_kernel_by_row_count():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(64, 64, generator=g)
    lin = Linear(w, _plan("int8", rows=4), "layers")
    small, big = torch.randn(4, 64, generator=g), torch.randn(5, 64, generator=g)
    assert torch.allclose(lin(big), F.linear(big, w), atol=1e-4)  # dense above the cut
    assert not torch.allclose(lin(small), F.linear(small, w), atol=1e-4)  # quantized at the cut


def test_the_runner_reports_the_plan_it_was_built_with(rig):
    r = rig("gemma3-270m", "fp32")
    assert isinstance(r.runner, ModelRunner) and r.runner.plan.quant is None and r.runner.dtype == torch.float32


def test_bench_kernels_times_every_kernel_this_cpu_can_run(capsys):
    from tailgate.bench import kernels as bench_kernels

    rows = bench_kernels.run("smollm2-135m", rows=(2,), reps=1)
    names = [r["kernel"] for r in rows]
    assert {"fp32 F.linear", "int8", "int4"} | ({"q8"} if _LIB else set()) <= set(names) and all(
        r["layers_ms"] > 0 for r in rows
    )
    assert "CPU: " in capsys.readouterr().out


@needs_native
@pytest.mark.parametrize("pool", [torch.float32, torch.float16])  # fp16: the q8 plan's KV
# Gemma 3 270M, SmolLM2-135M, and head blocks of 4 + 2 with a d % 16 == 8 tail, 1 query head per kv head
@pytest.mark.parametrize("hq,hkv,d", [(4, 1, 256), (9, 3, 64), (6, 1, 40), (2, 2, 16)])
@pytest.mark.parametrize("lanes", [8, 16])  # the AVX2 and the AVX-512 build of the same kernel
def test_native_decode_attention_matches_sdpa_over_the_same_pages(hq, hkv, d, pool, lanes, monkeypatch):
    from tailgate.model.runtime.context import FamilyView
    from tailgate.model.runtime.layers import paged_attention

    if lanes == 16 and native.attention_lanes() < 16:
        pytest.skip(f"this CPU ({this_cpu().model}) has no AVX-512")
    monkeypatch.setattr(native, "attention_lanes", lambda cpu=None: lanes)

    g = torch.Generator().manual_seed(4)
    slots_n, lens = 400, [1, 37, 200, 129]
    k_pool, v_pool = (torch.randn(slots_n, hkv, d, generator=g).to(pool) for _ in range(2))
    slots = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    mask = torch.zeros(len(lens), 1, 1, max(lens), dtype=torch.bool)
    for b, n in enumerate(lens):  # scattered pages, padding reads slot 0 (as build_context pads)
        slots[b, :n] = torch.randperm(slots_n - 8, generator=g)[:n] + 8
        mask[b, 0, 0, :n] = True
    view = FamilyView(
        write_slots=torch.arange(len(lens)), decode_slots=slots, decode_mask=mask, decode_lens=torch.tensor(lens)
    )
    q = torch.randn(len(lens), hq, d, generator=g)
    new_k, new_v = torch.randn(len(lens), hkv, d, generator=g), torch.randn(len(lens), hkv, d, generator=g)
    outs = [
        paged_attention(q, new_k, new_v, k_pool.clone(), v_pool.clone(), view, (0, len(lens)), d**-0.5, native=n)
        for n in (False, True)
    ]
    assert torch.allclose(outs[0], outs[1], atol=2e-5, rtol=1e-4), (outs[0] - outs[1]).abs().max()
    one = paged_attention(
        q[2:3],
        new_k[2:3],
        new_v[2:3],
        k_pool.clone(),
        v_pool.clone(),
        FamilyView(
            write_slots=torch.arange(2, 3),
            decode_slots=slots[2:3],
            decode_mask=mask[2:3],
            decode_lens=torch.tensor(lens[2:3]),
        ),
        (0, 1),
        d**-0.5,
        native=True,
    )
    assert torch.equal(one[0], outs[1][2])  # a row's result does not depend on its batch
    q[1, 0, 0] = float("nan")  # a NaN score stays NaN in its row (the sampler reports it), as SDPA's does
    bad = paged_attention(q, new_k, new_v, k_pool.clone(), v_pool.clone(), view, (0, len(lens)), d**-0.5, native=True)
    assert torch.isnan(bad[1, 0]).all() and torch.isfinite(bad[0]).all()


def _prompt_views(segments, window, native_prompts):
    from tailgate.model.runtime.context import build_context

    fam = "global" if window is None else "local"
    return build_context(segments, {fam: window}, "cpu", True, None, torch.float32, native_prompts).families[fam]


@needs_native
@pytest.mark.parametrize("pool", [torch.float32, torch.float16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 1, 256), (9, 3, 64)])  # Gemma 3 270M, SmolLM2-135M
@pytest.mark.parametrize("window", [None, 24])  # 24: a sliding layer whose window the prompt passes
@pytest.mark.parametrize("lanes", [8, 16])
def test_native_prompt_attention_matches_masked_sdpa_for_fresh_walked_and_windowed_prompts(
    hq, hkv, d, pool, window, lanes, monkeypatch
):
    from tailgate.engine.pages import SeqPages
    from tailgate.engine.plan import Segment
    from tailgate.model.runtime.layers import paged_attention

    if lanes == 16 and native.attention_lanes() < 16:
        pytest.skip(f"this CPU ({this_cpu().model}) has no AVX-512")
    monkeypatch.setattr(native, "attention_lanes", lambda cpu=None: lanes)
    g = torch.Generator().manual_seed(d + (window or 0))

    def pages(first):  # scattered, out-of-order pages
        p = SeqPages()
        p.global_pages = p.local_pages = list(range(first + 7, first - 1, -1))
        return p

    # a fresh prompt within the window, a walked chunk 40 tokens in (keys read back from the pool),
    # and a fresh prompt longer than the window (gathered, each row's window a range of its keys)
    segs = [Segment(list(range(20)), 0, pages(0)), Segment(list(range(33)), 40, pages(8))]
    segs.append(Segment(list(range(30)), 0, pages(16)))
    rows = sum(len(s.tokens) for s in segs)
    k_pool, v_pool = (torch.randn(24 * 16, hkv, d, generator=g).to(pool) for _ in range(2))
    q, k_new, v_new = (torch.randn(rows, h, d, generator=g) for h in (hq, hkv, hkv))
    outs = [
        paged_attention(
            q, k_new, v_new, k_pool.clone(), v_pool.clone(), _prompt_views(segs, window, n), (rows, rows), d**-0.5, True
        )
        for n in (False, True)
    ]
    assert torch.allclose(outs[0], outs[1], atol=2e-5, rtol=1e-4), (outs[0] - outs[1]).abs().max()


@needs_native
@pytest.mark.parametrize("lanes", [8, 16])
def test_rows_split_into_spans_merge_to_sdpa_across_scratch_groups_and_alone(lanes):
    # 80 rows of 449-1000 keys, 8 spans each: 640 partial results, where one scratch group holds
    # 4 MiB / ((32 x 64 + 64) x 4 bytes) = 496 (csrc/attn.c ATTN_GROUP_BYTES), so the rows go in two
    # groups; Llama 3.2 1B's head shape (8 kv heads of 64, 4 query heads each)
    if lanes == 16 and native.attention_lanes() < 16:
        pytest.skip(f"this CPU ({this_cpu().model}) has no AVX-512")
    g = torch.Generator().manual_seed(11)
    hq, hkv, d, slots_n = 32, 8, 64, 2048
    k_pool, v_pool = (torch.randn(slots_n, hkv, d, generator=g).half() for _ in range(2))
    lens = torch.randint(449, 1001, (80,), generator=g)
    assert 80 * 8 * (hq * d + 2 * hq) * 4 > 4 << 20  # more partials than one group holds
    slots = torch.stack([torch.randperm(slots_n, generator=g)[:1000] for _ in lens])
    q = torch.randn(len(lens), hq, d, generator=g)
    out = native.decode_attention(q, k_pool, v_pool, slots, lens, d**-0.5, lanes=lanes)
    for i, n in enumerate(lens.tolist()):
        k, v = (p[slots[i, :n]].float().transpose(0, 1) for p in (k_pool, v_pool))  # [hkv, n, d]
        want = F.scaled_dot_product_attention(q[i].unsqueeze(1), k, v, scale=d**-0.5, enable_gqa=True)
        assert torch.allclose(out[i], want.squeeze(1), atol=2e-5, rtol=1e-4), (i, n)
    for i in (0, 47, 79):  # a row's bits do not depend on the rows beside it or on the group it fell in
        one = native.decode_attention(
            q[i : i + 1], k_pool, v_pool, slots[i : i + 1], lens[i : i + 1], d**-0.5, lanes=lanes
        )
        assert torch.equal(one[0], out[i])


@needs_native
def test_a_prompt_row_attends_with_the_bits_a_decode_row_at_its_position_gets():
    from tailgate.engine.pages import SeqPages
    from tailgate.engine.plan import Segment
    from tailgate.model.runtime.layers import paged_attention

    g = torch.Generator().manual_seed(7)
    hq, hkv, d = 4, 1, 256
    pages = SeqPages()
    pages.global_pages = [5, 2, 9, 0]
    k_pool, v_pool = (torch.randn(10 * 16, hkv, d, generator=g).half() for _ in range(2))
    q, k_new, v_new = (torch.randn(50, h, d, generator=g) for h in (hq, hkv, hkv))
    chunk = Segment(list(range(50)), 10, pages)  # positions 10..59, keys 0..59 (0..9 already in the pool)
    walked = paged_attention(
        q, k_new, v_new, k_pool, v_pool, _prompt_views([chunk], None, True), (50, 50), d**-0.5, True
    )
    for i in (0, 17, 49):  # the same rows as decode rows over the pool the chunk filled
        row = Segment([0], 10 + i, pages)
        one = paged_attention(
            q[i : i + 1], k_new[i : i + 1], v_new[i : i + 1], k_pool, v_pool,
            _prompt_views([row], None, True), (0, 1), d**-0.5, True, write=False,
        )  # fmt: skip
        assert torch.equal(one[0], walked[i])


@needs_native
@pytest.mark.parametrize("rows,heads,d", [(1, 4, 256), (16, 9, 64), (300, 4, 256)])  # 300: the threaded path
def test_the_fused_elementwise_ops_match_torch_and_do_not_depend_on_the_batch(rows, heads, d):
    from tailgate.model.runtime.layers import rope_tables
    from tailgate.model.runtime.ops import NATIVE, TORCH

    g = torch.Generator().manual_seed(rows)
    n, f = 640, 2053  # f: the GLUs' 8-lane body and their scalar tail
    h, a = torch.randn(rows, n, generator=g) * 3, torch.randn(rows, n, generator=g) * 40
    w1, w2 = torch.randn(n, generator=g), torch.randn(n, generator=g)
    src = torch.randn(rows, (heads + 2) * d, generator=g) * 4  # a fused qkv-like row: q heads, then k, v
    wn = torch.randn(d, generator=g)
    cos, sin = rope_tables(torch.arange(7, 7 + rows), d, 10000.0, torch.float32)
    gu = torch.randn(rows, 2 * f, generator=g) * 4
    gu[0, :3] = torch.tensor([-100.0, 100.0, -3e38])  # gates past the exp polynomial's range

    def run(op, lo, hi):
        hh, plain = h[lo:hi].clone(), h[lo:hi].clone()
        x = op.add_rms_norm_(hh, a[lo:hi], w1, w2, 1e-6)
        y = op.add_rms_norm_(plain, a[lo:hi], None, w2, 1e-6)  # a Llama block's residual add, then its norm
        narrow = h[lo:hi].clone()
        z = op.add_rms_norm_(narrow, a[lo:hi].bfloat16(), None, w2, 1e-6)  # a bf16 product added
        return [
            hh,
            x,
            plain,
            y,
            narrow,
            z,
            op.rms_norm(a[lo:hi], w1, 1e-6),
            op.geglu(gu[lo:hi]),
            op.swiglu(gu[lo:hi]),
            op.norm_rope(src[lo:hi], 0, heads, d, wn, 1e-6, cos[lo:hi], sin[lo:hi]),
            op.norm_rope(src[lo:hi], heads * d, 1, d, None, 1e-6, cos[lo:hi], sin[lo:hi]),
        ]

    for got, want in zip(run(NATIVE, 0, rows), run(TORCH, 0, rows)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
    # The last row alone gets the same bits as inside the whole batch.
    for alone, batched in zip(run(NATIVE, rows - 1, rows), run(NATIVE, 0, rows)):
        assert torch.equal(alone, batched[-1:])


@needs_native  # plain AVX2 (the conversions are integer ops): runs on every CPU, used where dense weights are bf16
@pytest.mark.parametrize("rows,f", [(1, 2048), (77, 2048), (300, 2048), (3, 13)])  # 13: the scalar tail
@pytest.mark.parametrize("act", ["geglu", "swiglu"])
def test_the_bf16_glu_gives_the_bits_of_the_fp32_one_then_a_cast(rows, f, act):
    fn = getattr(native, act)
    gu = (torch.randn(rows, 2 * f, generator=torch.Generator().manual_seed(rows)) * 4).bfloat16()
    gu[0, 0], gu[0, f] = float("inf"), 0.5  # an overflowing gate stays what the cast made of it
    got, want = fn(gu), fn(gu.float()).bfloat16()
    assert got.dtype == torch.bfloat16 and torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_the_mlp_keeps_the_gate_up_product_in_its_kernels_dtype_only_for_an_activation_that_takes_it():
    from tailgate.model.runtime.layers import glu_mlp

    plan = choose("bf16", "onednn") if this_cpu().onednn_bf16 and torch.backends.mkldnn.is_available() else None
    if plan is None:
        pytest.skip("no bf16 dense path on this CPU")
    plan = dataclasses.replace(plan, dtype=torch.float32, dense_dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    gate_up, down = (
        Linear(torch.randn(64, 32, generator=g), plan, "layers"),
        Linear(torch.randn(32, 32, generator=g), plan, "layers"),
    )
    x, seen = torch.randn(5, 32, generator=g), []

    def act(gu):
        seen.append(gu.dtype)
        return F.gelu(gu[:, :32].float(), approximate="tanh").to(gu.dtype) * gu[:, 32:]

    for fused_act in (True, False):
        assert glu_mlp(x, gate_up, down, act, fused_act).dtype == torch.float32
    assert seen == [torch.bfloat16, torch.float32]


@needs_native
@pytest.mark.parametrize("rows,n,d", [(1, 640, 256), (77, 640, 256), (300, 640, 256), (3, 13, 10)])  # 13, 10: tails
def test_the_fused_norms_read_and_write_bf16_with_the_bits_of_fp32_and_a_cast(rows, n, d):
    from tailgate.model.runtime.layers import rope_tables

    g = torch.Generator().manual_seed(rows)
    bits = lambda t: t.view(torch.int16)  # noqa: E731
    x, w1, w2 = torch.randn(rows, n, generator=g) * 30, torch.randn(n, generator=g), torch.randn(n, generator=g)
    x[0, 0] = 3e38  # rounds up past the largest bf16: inf, as the cast makes it
    xb = x.bfloat16()
    assert torch.equal(bits(native.rms_norm(xb, w1, 1e-6)), bits(native.rms_norm(xb.float(), w1, 1e-6).bfloat16()))
    assert torch.equal(
        bits(native.rms_norm(x, w1, 1e-6, torch.bfloat16)), bits(native.rms_norm(x, w1, 1e-6).bfloat16())
    )
    h = torch.randn(rows, n, generator=g)
    h1, h2 = h.clone(), h.clone()
    got = native.add_rms_norm_(h1, xb, w1, w2, 1e-6, torch.bfloat16)
    want = native.add_rms_norm_(h2, xb.float(), w1, w2, 1e-6)
    assert torch.equal(h1, h2) and torch.equal(bits(got), bits(want.bfloat16()))
    src = (torch.randn(rows, 3 * d, generator=g) * 4).bfloat16()
    cos, sin = rope_tables(torch.arange(rows), d, 10000.0, torch.float32)
    wn = torch.randn(d, generator=g)
    for col, w in ((0, wn), (2 * d, None)):
        assert torch.equal(
            native.norm_rope(src, col, 1, d, w, 1e-6, cos, sin),
            native.norm_rope(src.float(), col, 1, d, w, 1e-6, cos, sin),
        )


@needs_native
def test_the_fused_page_gather_gives_the_bits_of_a_gather_then_a_cast():
    g = torch.Generator().manual_seed(0)
    pool = (torch.randn(50, 1, 264, generator=g) * 100).half()  # 264: a scalar tail of 0 after 33 vectors
    pool[3, 0, :4] = torch.tensor([float("inf"), -float("inf"), 6e-8, 65504.0]).half()  # subnormal, max
    pool7 = (torch.randn(20, 7, generator=g)).half()  # rows of 7: the scalar path alone
    for p in (pool, pool7):
        idx = torch.randint(0, p.shape[0], (97,), generator=g)
        got = native.gather_f16_bf16(p, idx)
        want = F.embedding(idx, p.view(p.shape[0], -1)).view(got.shape).to(torch.bfloat16)
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@needs_native
def test_the_fused_page_write_gives_the_bits_of_a_cast_then_index_copy():
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(9, 3 * 264, generator=g) * 100
    qkv[0, 2 * 264] = 7e4  # past fp16's largest: inf, as the cast makes it
    slots = torch.randperm(40, generator=g)[:9]
    for src in (qkv, qkv.bfloat16()):
        v = src[:, 2 * 264 :].view(9, 1, 264)  # a column slice of the fused qkv output, as the model passes it
        got, want = torch.zeros(40, 1, 264, dtype=torch.float16), torch.zeros(40, 1, 264, dtype=torch.float16)
        native.kv_write_f16(got, slots, v)
        want.index_copy_(0, slots, v.to(torch.float16))
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))


@needs_native
@pytest.mark.skipif(not this_cpu().native_bf16, reason="bf16 dense weights under fp32 activations: AVX-512 BF16 CPUs")
@pytest.mark.parametrize("name", ["gemma3-270m", "smollm2-135m"])
def test_steps_on_bf16_dense_weights_give_the_logits_of_casting_around_every_matmul(name, rig, monkeypatch):
    """The norms writing bf16, the matmuls' outputs kept raw, the fused page writes and gathers
    and the additive masks change no bit of a prompt, a walk chunk beside decode rows, or a decode step."""
    import numpy as np

    from tailgate.engine.pages import SeqPages
    from tailgate.engine.plan import Segment
    from tailgate.model.runtime import context, layers
    from tailgate.model.families import gemma3_forward, llama_forward

    r = rig(name, "auto")
    assert r.runner.plan.dense_dtype == torch.bfloat16
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 5000, (n,), generator=g).tolist() for n in (100, 90, 192)]

    def steps():
        seqs = [SeqPages() for _ in prompts]
        try:
            for s in seqs:
                assert r.book.reserve(s, 260)
            out = [r.runner.step([Segment(prompts[i], 0, seqs[i])]) for i in (0, 1)]  # dense rows
            for c in range(3):  # a walk in 64-row chunks beside two decode rows: 66-row steps
                dec = [Segment([7 + c], len(prompts[i]) + c, seqs[i]) for i in (0, 1)]
                out.append(
                    r.runner.step([Segment(prompts[2][64 * c : 64 * c + 64], 64 * c, seqs[2], sample=c == 2)] + dec)
                )
            out.append(
                r.runner.step(
                    [Segment([9], 192, seqs[2])] + [Segment([9], len(prompts[i]) + 3, seqs[i]) for i in (0, 1)]
                )
            )  # q8 rows
            return out
        finally:
            for s in seqs:
                r.book.free(s)

    new = steps()
    monkeypatch.setattr(Linear, "takes", lambda self, rows: None)
    for mod in (gemma3_forward, llama_forward):
        monkeypatch.setattr(mod, "raw", layers.linear)
    monkeypatch.setattr(
        layers,
        "gather_f16_bf16",
        lambda pool, idx: (
            F.embedding(idx, pool.view(pool.shape[0], -1)).view(idx.shape[0], *pool.shape[1:]).to(torch.bfloat16)
        ),
    )
    monkeypatch.setattr(layers, "kv_write_f16", lambda pool, slots, src: pool.index_copy_(0, slots, src.to(pool.dtype)))
    monkeypatch.setattr(context, "_additive", lambda mask, dtype, device: torch.from_numpy(np.ascontiguousarray(mask)))
    old = steps()
    for a, b in zip(new, old):
        assert torch.equal(a, b)
    r.assert_no_leak()


def test_every_kernel_call_returns_a_tensor_no_later_call_writes():
    """The contract every caller relies on (Qwen2's q/k/v bias is added in place into a product;
    the model files keep one product while computing the next): for every plan this CPU can run,
    each matrix's kernel at row counts under and over its cut, biased or not, returns a tensor that
    a second call with other inputs leaves unchanged."""
    from tailgate.model.kernels.choice import BiasedLinear, runnable_plans

    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(96, 64, generator=g) / 8, torch.randn(96, generator=g)
    for plan in runnable_plans():
        for group in ("layers", "head"):
            for make in (lambda: Linear(w, plan, group), lambda: BiasedLinear(w, plan, group, b)):
                lin = make()
                for rows in sorted({1, 5, *(c for c in plan.quant_rows if 0 < c < 200), 80, 130}):
                    x1, x2 = torch.randn(rows, 64, generator=g), torch.randn(rows, 64, generator=g)
                    for call in (lin, lin.raw):
                        y1 = call(x1)
                        kept = y1.clone()
                        y2 = call(x2)
                        assert torch.equal(y1, kept) and y1.data_ptr() != y2.data_ptr(), (plan.line(), rows)


@needs_native
def test_the_gguf_plan_runs_a_dense_matrix_of_any_shape_in_the_widest_panels_it_takes():
    """An HF checkpoint's matrices under `auto`'s gguf plan: N % 16 takes the CPU's own panels,
    N % 8 the 8-output AVX2 ones (the 16-output VNNI / AMX panels refused it: a crash at load on
    AVX-512), and a shape no panel takes runs fp32 F.linear."""
    plan = choose("fp32", "gguf")
    g = torch.Generator().manual_seed(4)
    for n, k in ((48, 64), (40, 64), (36, 64), (48, 48)):
        w = torch.randn(n, k, generator=g) / 8
        lin = Linear(w, plan, "layers")
        x = torch.randn(5, k, generator=g)
        y = lin(x)
        assert y.shape == (5, n) and lin.out_features == n
        if k % 32 or n % 8:
            assert lin.quant is None and torch.equal(y, F.linear(x, w))
        else:
            assert lin.quant == "q8" and (y - F.linear(x, w)).abs().max() < 0.05 * F.linear(x, w).abs().max()


@pytest.mark.parametrize(
    "rope",
    [
        dict(head_dim=64, theta=5e5, dtype=torch.float32, llama3=(32.0, 1.0, 4.0, 8192.0)),  # Llama 3.2
        dict(head_dim=256, theta=1e6, dtype=torch.float32, scale=8.0),  # Gemma 3's global
        dict(head_dim=128, theta=1e4, dtype=torch.bfloat16, fraction=0.25),  # Gemma 4's proportional
        dict(head_dim=64, theta=5e5, dtype=torch.float32, divisors=torch.linspace(1.0, 8.0, 32)),  # a GGUF's rope_freqs
    ],
)
def test_rope_rows_reads_the_bits_rope_tables_computes_for_every_position_as_its_table_grows(rope):
    from tailgate.model.runtime.layers import ROPE_ROWS_CHUNK, ROPE_ROWS_MAX, rope_rows, rope_tables

    c = ROPE_ROWS_CHUNK
    for positions in (
        torch.tensor([257]),
        torch.arange(300, 364),
        torch.tensor([0, 1, c - 1, c, 3 * c + 5]),  # grows the table, chunk by chunk
        torch.randint(0, ROPE_ROWS_MAX, (97,), generator=torch.Generator().manual_seed(0)),
        torch.tensor([5, 2]),  # read back after the growth
        torch.tensor([3, ROPE_ROWS_MAX + 17]),  # past the tables: computed for the step
    ):
        want, got = rope_tables(positions, **rope), rope_rows(positions, **rope)
        assert got[0].shape == want[0].shape == (len(positions), 1, rope["head_dim"])
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@needs_native
@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("n", [1, 9, 1000, 65537, 262144])
def test_argmax_rows_answers_as_torchs_argmax_first_index_of_the_maximum(rows, n):
    """Greedy sampling's argmax (csrc/argmax.c): ties take the first index, wherever the lanes,
    the tail past them, or a single long row's two halves put them."""
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n + rows))
    if n > 3:
        x[:, n - 1] = x[:, n // 3] = x[:, n // 2 + 5 if n > 10 else 1] = 10.0  # the max three times
    assert native.argmax_rows(x) == x.argmax(-1).tolist()
    assert native.argmax_rows(x[:, : max(1, n - 2)]) == x[:, : max(1, n - 2)].argmax(-1).tolist()  # strided rows


@needs_native
def test_argmax_rows_edge_rows_match_torch_and_a_nan_row_falls_back():
    for x in (
        torch.full((3, 70000), float("-inf")),  # every element -inf: the first
        torch.zeros(2, 65536),  # all equal: the first
        torch.tensor([[-0.0, 0.0, -0.0]] * 4),  # -0.0 == 0.0: the first
        torch.tensor([[float("-inf")] * 9 + [-1e30]]),  # the max in the tail
    ):
        assert native.argmax_rows(x) == x.argmax(-1).tolist()
    x = torch.randn(4, 1000)
    x[2, 500] = float("nan")
    assert native.argmax_rows(x) is None  # torch's NaN rule is the caller's
    assert native.argmax_rows(x.to(torch.bfloat16)) is None  # another dtype: torch
