"""One kernel choice per machine, made before any weights load and printed in one line.

`choose()` turns (--dtype, --kernels, --device, the CPU) into a `KernelPlan`: the runtime dtype,
the dense matmul kernel, and an optional quantized kernel for calls up to a row cut.
`Linear` is one weight matrix holding the kernels its plan asked for; it picks by the number of
rows of each call, so a decode step of 4 rows and a 256-row prefill use different kernels.

Why these kernels (torch 2.13, 2 threads, Gemma 3 270M shapes; see docs/kernels.md for tables):
- AMX / AVX-512 BF16 Xeon: prepacked oneDNN bf16 is the fastest dense path (25-40 % over
  F.linear, which reorders the weight on every call) but flat below ~16 rows (18.5 ms for the 18
  layers at 1 row as at 16: weight streaming and per-call setup), where q8 is 2x faster (8.8 ms at
  1 row). And a bf16 *step* pays ~2x its matmuls in torch's bf16 elementwise ops and SDPA (decode
  16: 81 ms against 43). So `auto` there runs fp32 activations through our fused ops and native
  attention (fp16 KV), q8 for the small calls and prepacked bf16 weights (activations cast per
  call) for the rest: `dense_dtype` bf16 under a runtime dtype of fp32.
- AVX2-only CPU (AMD EPYC Zen 3): bf16 is emulated (a 16-row layer pass 4x slower than fp32) and
  MKL's fp32 sgemm is 1.4-2.6x slower than oneDNN's prepacked fp32, so the dense path is oneDNN fp32.
  Our q8 kernel (`csrc/q8.c`: int8 weights x int8 activations in 32-wide blocks, weights packed in
  panels of 8 outputs) reads a quarter of fp32's bytes (small steps are memory-bound: the fp32
  head streams 671 MB at ~12.7 GB/s) and is compute-bound above that at ~1.4 ms per row of the
  18 layers against oneDNN fp32's ~1.7, so every layer call and head calls up to 64 rows take it;
  oneDNN fp32 keeps the larger head calls. Where q8 cannot be built, weight-only int8 (torch's
  `_weight_int8pack_mm`, bf16 activations, small steps only) takes its place.
  `auto` there is the gguf plan: a GGUF file's matrices stay in their stored blocks (model/kernels/blocks.py),
  the embedding looks its rows up in them (or, a tied Q8_0 table, in the head's panels, which then
  hold it as stored), and those q8 panels are made from the blocks at load for every call, so no
  fp32 copy of any matrix is held (an HF checkpoint's matrices run q8 throughout).
  int4 is lossy on this file (its q/k/v, gate/up are 5-bit and its head 8-bit), so it is opt-in.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import native
from .cpu import CpuInfo, KernelError, this_cpu

DTYPE_GRAMMAR = "auto | bf16 | fp32 | fp16"
KERNEL_GRAMMAR = "auto | torch | onednn | q8 | gguf | int8 | int4"
_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
}
INT4_GROUP = 32  # the file's own Q4_K/Q5_0 group size

# Steps of at most this many rows use the quantized kernel, per weight group (layers, head), by
# (CPU class, kernel) or, where the q8 panels' variant moves the crossover, (class, kernel, variant);
# EVERY means every call (the dense copy of those weights is then not kept at all).
# Measured on AMD EPYC (Zen 3, AVX2), torch 2.13, 2 threads, `tailgate bench kernels` on the real
# weights (it prints the crossover on any machine), ms at M = 1/4/16/64/256:
# 18 layers' four matmuls: q8 11.4/14.5/33.7/106/349 against oneDNN fp32 44.2/45.7/74.2/151/443;
# the 262k head: q8 12.6/16.5/42.3/181 against oneDNN fp32 56.0/63.0/103/222 (M <= 64).
# The panel q8 kernel (csrc/q8.c) is compute-bound from ~16 rows at ~1.4 ms per layer row, under
# oneDNN fp32's ~1.7, and blocks its rows by 64, so its cost stays linear past 256: the layers
# always take it. The head's crossover sits near 64 rows (its activations outgrow L1 sooner).
# Weight-only int8/int4 (bf16 activations, torch's kernels), M = 1/4/16/64: layers int8
# 18.2/25.8/92.0/289, int4 12.4/22.1/73.5/287; head int8 28.9/39.1/164/679, int4 15.6/30.9/115/470.
EVERY = 1 << 31
# The gguf plan: a GGUF file's matrices as stored, read by the block kernel (csrc/blocks.c) for
# calls of at most (layers, head) rows, by q8 panels made once at load from the blocks above that;
# no fp32 copy of any matrix, the embedding's rows dequantized on lookup. On AMD EPYC Zen 3 the
# block kernel lost to the panels at every row count (18 layers' matmuls, one thread, min of 9 on a
# busy host, ms at M = 1/4/16/64: blocks 41/40/248/945, panels 27/30/138/481; head 53/61/338/1456
# against 48/47/197/943; docs/kernels.md, "GGUF blocks as stored"), so its cut there is 0: the
# panels run every call and the blocks serve the embedding (a tied Q8_0 one: the head's panels,
# `blocks.PanelRows`). Until measured elsewhere, the same.
GGUF_ROWS = (0, 0)
QUANT_ROWS = {
    ("avx2", "q8"): (EVERY, 64),
    ("avx2", "int8"): (16, 6),
    ("avx2", "int4"): (16, 8),
    # Intel Xeon (AMX), torch 2.13, 2 threads, `tailgate bench kernels`, ms at M = 1/4/16/64:
    # layers q8 (AVX2 panels) 8.8/11.8/31.3/91.9 against oneDNN bf16 18.5/18.5/18.9/25.2; head q8
    # 11.3/14.9/46.4/161 against bf16 22.9/22.2/24.8/26.6: crossovers near 8 and 6 rows.
    ("amx", "q8"): (8, 6),
    ("avx512_bf16", "q8"): (8, 6),
    # The same Xeon with the AVX-512 VNNI panels (q8_variant "avx512_vnni"), best of 3 alternating
    # rounds, ms at M = 8/16/32/48: layers 11.8/13.5/18.0/23.6 against bf16 25.6/16.9/20.4/18.5;
    # head 15.2/17.7/32.5/44.5 against 27.8/17.5/35.1/36.9: crossovers near 32 and 16 rows (the
    # head's at 16 a tie, taken for q8's batch invariance).
    ("amx", "q8", "avx512_vnni"): (32, 16),
    # The AMX tile panels, same script, ms at M = 8/16/32/64/96: layers 7.4/11.6/16.0/31.2/29.5
    # against bf16 14.7/24.7/36.0/34.2/32.0; head 9.2/14.9/21.3/59.7/73.1 against bf16
    # 14.8/27.1/51.8/61.9/100.8 (and 46.4 vs 44.7 at 48): crossovers near 64-96 and 48, cut where
    # q8 still clearly wins.
    ("amx", "q8", "amx"): (64, 32),
    # AMD EPYC Zen 5 (avx512_bf16 + avx512_vnni, no AMX), 2 threads, `tailgate bench kernels` (two q8
    # runs in one command; ../shared/design/measured/zen5-bench-kernels.txt, main at 6011487), ms at
    # M = 16/64/256: layers q8 7.1-7.8/22.0-22.3/84-93 against oneDNN bf16 10.0/25.8/71.3; head q8
    # 10.8-12.3/34.8-35.8 against bf16 13.9/33.3: crossovers near 64-128 and 32-64. Until then this
    # class fell back to the ("avx512_bf16", "q8") row (8 / 6, the AVX2 panels' cut on the Xeon):
    # a 16-row decode step took bf16's 10.0 ms of layers instead of q8's 7.1.
    ("avx512_bf16", "q8", "avx512_vnni"): (64, 32),
}
# A CPU class without a measured cut uses these (the same shapes of memory-bound crossover).
DEFAULT_QUANT_ROWS = {"q8": (EVERY, 64), "int8": (16, 6), "int4": (16, 8), "gguf": GGUF_ROWS}
# `auto` on each CPU class: the quantized kernel it adds for small steps (None: dense only), and
# what takes its place when q8 cannot be built here.
# AVX2 takes the gguf plan: the same q8 panels as the q8 plan (made from the file's blocks, the
# same bits; at most 64 head rows, as q8's cut) without the fp32 copies of the head and the
# embedding (resident weights 2.2 GB -> 0.29 GB on Gemma 3 270M; quality in docs/kernels.md).
# The other classes keep q8 until the gguf plan is measured there.
AUTO_QUANT = {"avx2": "gguf", "avx512": "gguf", "avx512_bf16": "gguf", "amx": "gguf"}
Q8_FALLBACK = "int8"


@dataclass(frozen=True)
class KernelPlan:
    device: str
    dtype: torch.dtype
    dense: str  # "onednn" (prepacked) | "torch" (F.linear)
    # "q8": int8 x int8; "gguf": a GGUF file's own blocks x int8 activations (q8 panels above the
    # cut, made at load); "int8" | "int4": weight-only, bf16 activations
    quant: str | None = None
    quant_rows: tuple[int, int] = (0, 0)  # (layers, head): calls with at most this many rows
    cpu: str = ""
    isa: str = ""
    note: str = ""  # why auto settled for less (q8 could not be built)
    # "native": decode attention from the fp32 pools (csrc/attn.c) and the fused elementwise ops
    # (csrc/fused.c); "torch": SDPA and torch's ops.
    attention: str = "torch"
    # The KV pools' dtype when it is not the runtime dtype: fp16 on the q8 plan (decode attention
    # is bound by reading the pools; half the bytes, arithmetic still fp32; llama.cpp's default).
    kv_dtype: torch.dtype | None = None
    # The dense weights' dtype when it is not the runtime dtype: bf16 under fp32 activations on
    # AMX / AVX-512 BF16 (each dense call casts its input to bf16 and its output back).
    dense_dtype: torch.dtype | None = None
    # The q8 kernel's int8 dot products: "avx2" (vpmaddubsw), "avx_vnni", "avx512_vnni" or "amx"
    # (tiles); `CpuInfo.q8_variant`.
    q8_variant: str = "avx2"

    @property
    def kv(self) -> torch.dtype:
        return self.kv_dtype or self.dtype

    @property
    def native(self) -> bool:
        """The plan runs our kernels (csrc/): decode attention and the fused ops, and with them
        anything else AVX2 code does (the sampler's argmax): the CPU has AVX2, FMA and F16C and
        the kernels are not `torch`."""
        return self.attention == "native"

    @property
    def native_prompts(self) -> bool:
        """Prompt rows attend through the native kernel (csrc/attn.c, each row as a decode row over
        its causal range of the pool, fp32) wherever attention is native, except on AMX, whose bf16
        SDPA was measured there (below) and the kernel was not. Measured on AMD EPYC Zen 5 (family
        26, 2 threads, fp16 pool, 4 query heads over 1 KV head of 256; docs/kernels.md): a walked
        64-row chunk over 192 keys 201 us against bf16 SDPA's 309, a 512-row prefill 1.95 ms
        against 6.19; at AVX2's 8 lanes on the same host 0.6-0.9x fp32 SDPA's time."""
        return self.native and self.isa != "amx"

    @property
    def prompt_attention(self) -> torch.dtype | None:
        """The dtype prompt rows attend in through SDPA when not the activations': bf16 wherever
        the dense weights are bf16 under fp32 activations and the native kernel does not take
        them (the AMX Xeon). Measured there: a 256-row causal SDPA (4 query heads over 1 KV head of
        256) 1.53 ms in fp32, 0.74 in bf16 with its casts."""
        return self.dense_dtype if self.native and not self.native_prompts else None

    def line(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        if self.dense_dtype is not None and self.quant != "gguf":
            dt += f" activations, {str(self.dense_dtype).removeprefix('torch.')} weights"
        s = f"kernels: {dt} {'oneDNN prepacked' if self.dense == 'onednn' else 'F.linear'}"
        if self.quant == "gguf":
            cuts = [
                "every call" if n >= EVERY else f"calls of <= {n} rows" if n else "no calls" for n in self.quant_rows
            ]
            s += (
                f" + GGUF blocks as stored (embedding lookups; int8 x blocks for {cuts[0]} (layers) / {cuts[1]}"
                f" (head)), q8 int8 x int8 ({self.q8_variant}) panels made from them at load for the rest"
                + (
                    " (Q5_0 / Q4_K / Q6_K kept in 5 / 4 / 6 bits, the head's fp16 scales kept)"
                    if self.q8_variant == "avx2"
                    else ""
                )
            )
        elif self.quant:
            what = f"int8 x int8 ({self.q8_variant})" if self.quant == "q8" else "weight-only"
            cuts = ["every call" if n >= EVERY else f"calls of <= {n} rows" for n in self.quant_rows]
            s += f" + {self.quant} {what} for {cuts[0]} (layers) / {cuts[1]} (head)"
        if self.native:
            s += f" + native {'decode and prompt' if self.native_prompts else 'decode'} attention and fused norms/RoPE/GeGLU"
        if self.prompt_attention is not None:
            s += f" + {str(self.prompt_attention).removeprefix('torch.')} prompt attention"
        if self.kv_dtype is not None:
            s += f" + {str(self.kv_dtype).removeprefix('torch.')} KV"
        s += f" [{self.cpu}; {self.isa}; {self.device}]"
        return s + (f" ({self.note})" if self.note else "")

    def as_dict(self) -> dict:
        return {
            "device": self.device,
            "dtype": str(self.dtype).removeprefix("torch."),
            "dense": self.dense,
            "quant": self.quant,
            "quant_rows": {"layers": self.quant_rows[0], "head": self.quant_rows[1]},
            "cpu": self.cpu,
            "isa": self.isa,
            "note": self.note,
            "attention": self.attention,
            "kv_dtype": str(self.kv).removeprefix("torch."),
            "dense_dtype": str(self.dtype if self.quant == "gguf" else self.dense_dtype or self.dtype).removeprefix(
                "torch."
            ),
            "q8_variant": self.q8_variant if self.quant in ("q8", "gguf") else None,
            "prompt_attention": "native"
            if self.native_prompts
            else str(self.prompt_attention or self.dtype).removeprefix("torch."),
        }


def choose(
    dtype: str | torch.dtype | None = "auto",
    kernels: str | None = "auto",
    device="auto",
    cpu: CpuInfo | None = None,
    mkldnn: bool | None = None,
    cuda: bool | None = None,
    native_build=None,
    amx_grant=None,
) -> KernelPlan:
    """The plan for this machine. `cpu`, `mkldnn`, `cuda`, `native_build` (-> (lib, why)) and
    `amx_grant` (-> whether the OS lets this process use AMX tiles) default to the real machine;
    tests pass fakes (a faked library grants AMX unless told otherwise). Refuses (KernelError) a
    value outside the grammar or a kernel the CPU cannot run."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    mkldnn = torch.backends.mkldnn.is_available() if mkldnn is None else mkldnn
    dev = torch.device("cuda" if cuda else "cpu") if device in (None, "", "auto") else torch.device(device)
    want = "auto" if dtype in (None, "") else dtype
    if isinstance(want, str) and want != "auto" and want not in _DTYPES:
        raise KernelError(f"--dtype {want!r} not recognized (accepted: {DTYPE_GRAMMAR})")
    kind = (kernels or "auto").strip().lower()
    if kind not in KERNEL_GRAMMAR.split(" | "):
        raise KernelError(f"--kernels (TAILGATE_KERNELS) {kernels!r} not recognized (accepted: {KERNEL_GRAMMAR})")
    if dev.type != "cpu":
        if kind not in ("auto", "torch"):
            raise KernelError(f"--kernels {kind} is a CPU kernel; on {dev} use auto or torch")
        dt = torch.bfloat16 if want == "auto" else (want if isinstance(want, torch.dtype) else _DTYPES[want])
        return KernelPlan(
            str(dev), dt, "torch", cpu=torch.cuda.get_device_name(dev) if cuda else str(dev), isa=dev.type
        )
    cpu = cpu or this_cpu()
    # auto on a native-bf16 CPU: fp32 activations over bf16 weights when our kernels build (below).
    # (`--kernels q8` / `gguf` with `--dtype auto` too: the same plan with its quantized kernel named)
    mixed = want == "auto" and kind in ("auto", "q8", "gguf") and cpu.native_bf16 and cpu.onednn_bf16 and mkldnn
    if want == "auto":
        dt = torch.bfloat16 if cpu.native_bf16 else torch.float32
    else:
        dt = want if isinstance(want, torch.dtype) else _DTYPES[want]
    packable = mkldnn and (dt == torch.float32 or (dt == torch.bfloat16 and cpu.onednn_bf16))
    if kind == "onednn" and not packable:
        why = (
            "torch was built without oneDNN"
            if not mkldnn
            else (
                f"oneDNN's {dt} weight reorder needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT, which this CPU "
                f"({cpu.model}) lacks"
                if dt == torch.bfloat16
                else f"oneDNN has no prepacked {dt} path"
            )
        )
        raise KernelError(f"--kernels onednn refused: {why} (try --dtype fp32 or --kernels auto)")
    dense = "onednn" if packable and kind != "torch" else "torch"
    quant = (
        kind
        if kind in ("q8", "gguf", "int8", "int4")
        else (AUTO_QUANT.get(cpu.isa) if kind == "auto" and want == "auto" else None)
    )
    if quant and dt == torch.float16:
        raise KernelError(f"--kernels {quant} runs with fp32 or bf16 activations, not --dtype fp16")
    note = ""
    why = (
        f"tailgate's native kernels need AVX2, FMA and F16C, which this CPU ({cpu.model}) lacks"
        if not {"avx2", "fma", "f16c"} <= cpu.flags
        else None
    )
    if why is None and (quant in ("q8", "gguf") or (dt == torch.float32 and kind != "torch")):
        why = (native_build or native.load)()[1]
    # Our decode attention reads fp32 pools in place and our fused ops are fp32; `--kernels torch`
    # keeps everything torch's.
    attention = "native" if dt == torch.float32 and kind != "torch" and why is None else "torch"
    if quant in ("q8", "gguf"):
        if why and kind == quant:
            raise KernelError(f"--kernels {quant} refused: {why} (try --kernels auto)")
        if why:
            quant, note = Q8_FALLBACK, f"{why}; using {Q8_FALLBACK}"
    if mixed and quant in ("q8", "gguf") and why is None:
        # (under gguf no matrix has a dense copy: bf16 is then only the prompt rows' attention)
        dt, attention, dense_dt = torch.float32, "native", torch.bfloat16
    else:  # without our kernels a bf16 CPU keeps the all-bf16 plan: torch's bf16 ops beat fp32 ones
        dense_dt = None
        if mixed:
            quant, note = None, why or note
    variant = cpu.q8_variant if quant in ("q8", "gguf") else "avx2"
    if variant == "amx" and not (amx_grant or (native.amx_ready if native_build is None else lambda: True))():
        variant = CpuInfo(cpu.model, cpu.flags - {"amx_tile", "amx_int8"}).q8_variant
        note = "; ".join(x for x in (note, f"the OS did not grant AMX tiles: q8 on {variant}") if x)
    rows = (
        QUANT_ROWS.get((cpu.isa, quant, variant))
        or QUANT_ROWS.get((cpu.isa, quant))
        or DEFAULT_QUANT_ROWS.get(quant, (0, 0))
        if quant
        else (0, 0)
    )
    kv = torch.float16 if quant in ("q8", "gguf") and attention == "native" else None
    return KernelPlan("cpu", dt, dense, quant, rows, cpu.model, cpu.isa, note, attention, kv, dense_dt, variant)


def runnable_plans(device="cpu") -> list[KernelPlan]:
    """Every plan this machine can run, for the benchmarks: dense fp32 through oneDNN and F.linear,
    dense bf16 where oneDNN takes it, and int8 / int4 small steps over the fp32 dense path."""
    out = []
    for dtype, kernels in (
        ("auto", "auto"),
        ("auto", "q8"),
        ("fp32", "onednn"),
        ("fp32", "torch"),
        ("bf16", "onednn"),
        ("fp32", "q8"),
        ("fp32", "gguf"),
        ("fp32", "int8"),
        ("fp32", "int4"),
    ):
        try:
            p = choose(dtype, kernels, device)
        except KernelError:
            continue
        if p not in out:
            out.append(p)
    return out


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: w ~= q * s. Returns (q int8 [N, K], s bf16 [N])."""
    w = w.float()
    s = (w.abs().amax(1) / 127).clamp(min=1e-12)
    q = torch.round(w / s[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), s.to(torch.bfloat16)


def quantize_int4(w: torch.Tensor, group: int = INT4_GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of `group` inputs (the GGUF's own Q4_K layout: w = q*scale + min),
    packed for `_weight_int4pack_mm_for_cpu`, whose convention is w = (q - 8) * scale + zero."""
    w = w.float()
    n, k = w.shape
    g = w.view(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15).clamp(min=1e-12)
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32).view(n, k)
    zero = lo + 8 * scale
    scales_zeros = torch.stack([scale.t(), zero.t()], -1).contiguous().to(torch.bfloat16)  # [K/g, N, 2]
    return torch._convert_weight_to_int4pack_for_cpu(q, 1), scales_zeros


def six_bits(variant: str, group: str) -> bool:
    """Whether a matrix's Q6_K parts stay in their 6 bits (csrc/q8.c wide6_rows, q6h_rows on AVX2)
    rather than int8 panels quantized from them: the head's always (one row per sampled sequence),
    a layer's everywhere but AMX. The 6-bit kernel reads 0.82 bytes a weight where the int8 panels read
    1.125, but costs more once compute-bound. Measured on AMD EPYC Zen 4 (2 threads): Llama 3.2 3B
    Q4_K_M's 28 Q6_K layer matrices (310 MiB stored), one call each, int8 / 6-bit ms: 1 row 16.0 /
    11.3, 4 rows 16.2 / 13.2, 16 rows 28.5 / 29.0, 64 rows 86 / 111; and whole 1B steps
    (`tailgate bench step`, three alternated pairs, means): decode 1 row 28.5 -> 25.6 ms, 4 rows
    39.6 -> 36.4, 16 rows 101.5 -> 100.6, 64 rows 337 -> 353, prefill 256 rows 1023 -> 1090. A
    stream's decode step is ~10 % faster and a prompt ~6 % slower. AVX2 (AMD EPYC Zen 3, 2 threads,
    the same 1B; `scripts/experiments/step_ab.py six_layers`, 12 alternated pairs, B / A medians):
    decode 1 row 0.875, 4 rows 0.92, 16 rows 1.00, a 64-row round beside 4 streams 1.03, prefill
    256 rows 1.075 (6 pairs): the same trade. On AMX a layer's Q6_K stays int8:
    its prompt rows go to the tiles, which the 6-bit panels have no form for (an AMX Xeon whose OS
    refuses the tiles runs the avx512_vnni variant, so 6 bits: not measured there)."""
    return group == "head" or variant != "amx"


class Linear:
    """One weight matrix [out, in] with the kernels its plan chose; `x @ w.T` by row count. Under the
    gguf plan `w` may be a GGUF matrix as stored (`blocks.Blocks`) or a list of them (a fused
    q/k/v or gate/up, stacked along the outputs)."""

    __slots__ = ("w", "packed", "quant", "q", "qs", "max_q_rows", "out_features", "dense_dtype", "wide", "prompt_tiles")

    def __init__(self, w, plan: KernelPlan, group: str):
        # A layer's matrix (not the head, whose rows are sampled rows) tells its panels which rows
        # are the step's prompt rows: the AMX panels run those on BF16 tiles (csrc/tiles_bf16.c).
        # (Only the AMX panel forms read the rows; the flag says the CPU has the BF16 tiles.)
        self.prompt_tiles = group != "head" and "amx_bf16" in this_cpu().flags
        self.quant, self.q, self.qs, self.max_q_rows, self.wide = None, None, None, 0, None
        cut = plan.quant_rows[0 if group == "layers" else 1]
        if plan.quant == "gguf":
            self._stored(w, plan, cut, group)
            return
        self.out_features = w.shape[0]
        if plan.quant and cut > 0 and w.shape[1] % INT4_GROUP == 0 and w.shape[0] % 16 == 0:
            self.quant, self.max_q_rows = plan.quant, cut
            if plan.quant == "q8":
                self.q, self.qs = native.q8_quantize(w, plan.q8_variant), None
            else:
                self.q, self.qs = (quantize_int8 if plan.quant == "int8" else quantize_int4)(w)
        self.packed = plan.dense == "onednn"
        self.dense_dtype = plan.dense_dtype
        if self.max_q_rows >= EVERY:
            self.w = None  # never called densely: do not hold (or prepack) a second copy
        else:
            if self.dense_dtype is not None:
                w = w.to(self.dense_dtype)
            self.w = torch.ops.mkldnn._reorder_linear_weight(w, 16) if self.packed else w

    def _stored(self, w, plan: KernelPlan, cut: int, group: str) -> None:
        """The gguf plan: the block kernel for calls of at most `cut` rows, q8 panels made here
        from the blocks for the rest (none when the blocks take every call; the blocks' pages are
        released when they take none). A matrix not in a block format runs q8 at every call."""
        from . import blocks

        self.packed, self.dense_dtype, self.w = False, None, None
        parts = w if isinstance(w, list) else [w] if isinstance(w, blocks.Blocks) else None
        if parts is None:  # a dense matrix (an HF checkpoint's): q8 panels of the widest form its shape takes
            n, k = w.shape
            self.out_features = n
            variant = (
                plan.q8_variant if n % (2 * native.PANEL) == 0 or plan.q8_variant in ("avx2", "avx_vnni") else "avx2"
            )  # the 16-output panels need N % 16; the 8-output ones take N % 8
            if k % native.GROUP or n % native.PANEL:  # no q8 panels for this shape: fp32 F.linear
                self.w = w.float().contiguous()
                return
            self.quant, self.max_q_rows, self.q = "q8", EVERY, native.q8_quantize(w, variant)
            return
        self.out_features = sum(p.shape[0] for p in parts)
        panel = 2 * native.PANEL if plan.q8_variant in ("avx512_vnni", "amx") else native.PANEL
        if self.out_features % panel or parts[0].shape[1] % native.GROUP:
            cut = EVERY  # no q8 panels for this shape: the blocks take every call
        self.quant, self.max_q_rows = "gguf", cut
        self.q = blocks.BlockMatmul(parts) if cut > 0 else None
        if cut < EVERY:
            self.wide = blocks.q8_panels(parts, plan.q8_variant, panel, six=six_bits(plan.q8_variant, group))
            if cut == 0:
                for p in parts:
                    p.release()

    def nbytes(self) -> int:
        """Bytes of the weight forms this matrix holds for its kernels (blocks, panels, dense)."""
        held = [
            self.w,
            self.qs,
            *(self.wide.tensors() if self.wide is not None else ()),
            *(self.q if isinstance(self.q, tuple) else ()),
        ]
        n = sum(t.numel() * t.element_size() for t in held if isinstance(t, torch.Tensor))
        if self.quant == "gguf" and self.q is not None:
            n += sum(p.nbytes for p in self.q.parts)
        return n

    def __call__(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x @ W^T in `out_dtype` (default x's dtype)."""
        y = self.raw(x)
        want = out_dtype or x.dtype
        return y if y.dtype == want else y.to(want)

    def takes(self, rows: int) -> torch.dtype | None:
        """The dtype the kernel at `rows` rows reads when it is not the activations' (dense bf16)."""
        return None if self.quant is not None and rows <= self.max_q_rows else self.dense_dtype

    def panels(self, rows: int):
        """The q8 panels a call of `rows` rows multiplies by (`Panels`, `SegmentPanels`, or the q8
        plan's (q, d, code)), None where another kernel takes it (the blocks' own, dense, int8 /
        int4). `raw` and the one-call decode layers (runtime/native_layers.py) both ask here."""
        if self.quant == "gguf":
            # `q` is None when the panels take every call (cut 0); a step that samples no row asks
            # the head for 0 rows, which must not pick the blocks that are not there
            return None if self.q is not None and rows <= self.max_q_rows else self.wide
        return self.q if self.quant == "q8" and rows <= self.max_q_rows else None

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W^T in x's dtype, except from dense bf16 weights under fp32 activations, which
        leave it in bf16 (only on CPUs with AVX-512 BF16: `choose` gives dense bf16 nowhere else),
        for a consumer that takes either (our GeGLU)."""
        if self.quant == "gguf":
            panels = self.panels(x.shape[0])
            y = self.q(x) if panels is None else panels.linear(x.float(), self._tiles())
            return y.to(x.dtype)
        if self.quant is not None and x.shape[0] <= self.max_q_rows:
            if self.quant == "q8":
                return native.q8_linear(x.float(), *self.q, tiles=self._tiles()).to(x.dtype)
            xb = x.to(torch.bfloat16)  # with fp32 activations both ops take a scalar path (10-30x slower)
            if self.quant == "int8":
                y = torch._weight_int8pack_mm(xb, self.q, self.qs)
            else:
                y = torch._weight_int4pack_mm_for_cpu(xb, self.q, INT4_GROUP, self.qs)
            return y.to(x.dtype)
        if self.dense_dtype is not None:
            return self._dense(x.to(self.dense_dtype))
        return self._dense(x)

    def _tiles(self) -> tuple[int, int]:
        """The running step's leading rows the AMX panels take on BF16 tiles (none for the head)."""
        return native.tile_rows() if self.prompt_tiles else (0, 0)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.w, None, "none", [], "")
        return F.linear(x, self.w)


class BiasedLinear(Linear):
    """A `Linear` plus a bias vector (Qwen2's fused q/k/v; Llama's optional attention/MLP biases),
    added to whatever the chosen kernel returns (q8, weight-only int8/int4, oneDNN prepacked or
    F.linear alike), in fp32 (a bf16 product is widened first): one elementwise pass over the product. Only
    matrices that have a bias are built as this class, so bias-free models' calls stay as they were."""

    __slots__ = ("bias",)

    def __init__(self, w: torch.Tensor, plan: KernelPlan, group: str, bias: torch.Tensor):
        super().__init__(w, plan, group)
        if bias.shape != (self.out_features,):
            raise ValueError(f"bias of shape {tuple(bias.shape)} for a matrix of {self.out_features} outputs")
        self.bias = bias.float().contiguous()  # fp32, as the checkpoint's (HF adds it in fp32)

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        # In fp32, always: the dense bf16 kernel (AMX / AVX-512 BF16 plans, calls over the q8 cut)
        # returns bf16, and adding the bias into that in place rounded every biased output to
        # bf16's 8 bits (0.003-0.008 off at |y| ~ 1, the AMX failure of issue 35), which plain(x)
        # + b does not do. Every kernel returns a fresh tensor (test_kernels_contract), so the fp32
        # product is safe to add into in place.
        y = super().raw(x)
        return y.add_(self.bias) if y.dtype == torch.float32 else y.float().add_(self.bias)
