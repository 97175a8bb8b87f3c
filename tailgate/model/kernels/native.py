"""Our own CPU kernels (`csrc/*.c`), AVX2 + FMA + F16C: the q8 matmul, the matmul over GGUF blocks as
stored (`csrc/blocks.c`, wrapped in model/kernels/blocks.py), paged decode attention, and the step's fused
elementwise work (norms, residual adds, q/k norm + RoPE, GeGLU).

torch 2.13 has no int8 x int8 matmul that is both fast and exact enough on an AVX2 CPU
(docs/kernels.md: `_int_mm` is scalar there, FBGEMM's per-tensor activations saturate), and its
paged decode attention costs a gather plus a padded SDPA; so these two are ours. They are plain C,
compiled at first use with the system C compiler (`$CC`, else `cc`; about 2 s) into
`~/.cache/tailgate/kernels/` (`$XDG_CACHE_HOME` honoured), keyed by a hash of the sources, the
flags and the compiler's version, and loaded with ctypes (which releases the GIL during a call).
Where they cannot be built (no compiler, not x86-64) `load()` says why and the kernel choice
falls back to torch's kernels.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

SOURCES = sorted((Path(__file__).with_name("csrc")).glob("*.c"))
HEADERS = sorted((Path(__file__).with_name("csrc")).glob("*.h"))  # hashed too: a header change rebuilds
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
GROUP = 32  # inputs per int8 block of the q8 matmul (K must be a multiple)
PANEL = 8  # outputs per packed weight panel of the q8 matmul (N must be a multiple)

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_WHY: str | None = None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tailgate" / "kernels"


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    h = hashlib.sha256(" ".join(FLAGS).encode() + version.encode())
    for src in SOURCES + HEADERS:
        h.update(src.name.encode() + src.read_bytes())
    out = cache_dir() / f"tailgate-{h.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: two processes building at once both end with a whole file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run(
            [cc, *FLAGS, "-o", tmp, *map(str, SOURCES), "-lm"], capture_output=True, text=True, timeout=300
        )
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed: {r.stderr.strip()[-500:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    P, I64, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.q8_quantize.argtypes, lib.q8_quantize.restype = [P, I64, I64, P, P], None
    lib.q8_linear.argtypes, lib.q8_linear.restype = [P, I64, I64, P, P, I64, P, ctypes.c_int, I64, I64], ctypes.c_int
    lib.q8_offset.argtypes, lib.q8_offset.restype = [P, I64], None
    lib.q8_amx_init.argtypes, lib.q8_amx_init.restype = [], ctypes.c_int
    lib.q8_prefetch_far.argtypes, lib.q8_prefetch_far.restype = [ctypes.c_int], None
    lib.argmax_rows.argtypes, lib.argmax_rows.restype = [P, I64, I64, I64, P], None
    lib.step_layer_words.argtypes, lib.step_layer_words.restype = [], ctypes.c_int
    # csrc/layers.c: table, layers, h, x, t, d0, dm, hq, hkv, hd, ffn, eps, glu, fams, scale, lanes, tile8, tile4
    lib.step_layers.argtypes = [P, I64, P, P, *[I64] * 7, F, ctypes.c_int, P, F, ctypes.c_int, I64, I64]
    lib.step_layers.restype = ctypes.c_int
    for lanes in (8, 16):
        for name in (f"decode_attention_{lanes}", f"decode_attention_f16_{lanes}"):
            getattr(lib, name).argtypes = [P, P, P, P, P, I64, I64, I64, I64, I64, F, P]
            getattr(lib, name).restype = ctypes.c_int
        fn = getattr(lib, f"prompt_attention_{lanes}")
        fn.argtypes, fn.restype = [P, P, P, ctypes.c_int, P, P, P, I64, I64, I64, I64, F, P], ctypes.c_int
    B = ctypes.c_int
    lib.rms_norm.argtypes, lib.rms_norm.restype = [P, B, I64, I64, P, F, P, B], None
    lib.add_rms_norm.argtypes, lib.add_rms_norm.restype = [P, P, B, I64, I64, P, P, F, P, B], None
    lib.norm_rope.argtypes, lib.norm_rope.restype = [P, B, I64, I64, I64, I64, P, F, P, P, P], None
    lib.geglu.argtypes, lib.geglu.restype = [P, B, I64, I64, P], None
    lib.swiglu.argtypes, lib.swiglu.restype = [P, B, I64, I64, P], None
    lib.gather_f16_bf16.argtypes, lib.gather_f16_bf16.restype = [P, I64, P, I64, P], None
    lib.kv_write_f16.argtypes, lib.kv_write_f16.restype = [P, I64, P, I64, P, I64, B], None
    # csrc/blocks.c: GGUF matrices as stored (model/kernels/blocks.py)
    lib.gq_row_bytes.argtypes, lib.gq_row_bytes.restype = [B, I64], I64
    lib.gq_dequantize.argtypes, lib.gq_dequantize.restype = [P, B, I64, P, I64, P], None
    lib.gq_q8_0_panels.argtypes, lib.gq_q8_0_panels.restype = [P, I64, I64, P, P, B], ctypes.c_int
    lib.gq_panel_rows.argtypes, lib.gq_panel_rows.restype = [P, P, I64, P, I64, P, B], None
    lib.gq_q5_0_panels.argtypes, lib.gq_q5_0_panels.restype = [P, I64, I64, P, P], None
    lib.gq_q5_panel_rows.argtypes, lib.gq_q5_panel_rows.restype = [P, P, I64, P, I64, P], None
    lib.gq_q4_k_panels.argtypes, lib.gq_q4_k_panels.restype = [P, I64, I64, P, P], None
    lib.gq_q4_k_panel_rows.argtypes, lib.gq_q4_k_panel_rows.restype = [P, P, I64, P, I64, P], None
    lib.gq_q6_k_wide.argtypes, lib.gq_q6_k_wide.restype = [P, I64, I64, P, P], None
    lib.gq_q6_k_wide_rows.argtypes, lib.gq_q6_k_wide_rows.restype = [P, P, I64, P, I64, P], None
    lib.q8_linear_seg.argtypes = [P, I64, I64, B, P, P, P, P, P, I64, I64, I64]
    lib.q8_linear_seg.restype = ctypes.c_int
    lib.gq_linear.argtypes, lib.gq_linear.restype = [P, I64, I64, B, P, P, P, P, P, I64], ctypes.c_int


def load() -> tuple[ctypes.CDLL | None, str | None]:
    """(the library, None) or (None, why it cannot be had here). Built once per process."""
    global _LIB, _WHY
    with _LOCK:
        if _LIB is None and _WHY is None:
            if platform.machine().lower() not in ("x86_64", "amd64"):
                _WHY = f"tailgate's native kernels are x86-64 AVX2; this machine is {platform.machine()}"
            else:
                try:
                    lib = ctypes.CDLL(str(_build(os.environ.get("CC", "cc"))))
                    _declare(lib)
                    from .cpu import this_cpu

                    lib.q8_prefetch_far(1 if this_cpu().prefetch_far else 0)
                    _LIB = lib
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    _WHY = f"native kernels could not be built: {e}"
        return _LIB, _WHY


def build_name() -> str:
    """The loaded library's file name (its sources' and compiler's hash), or "" without one: what a
    cache of measured kernel timings must key on, so a changed kernel is timed again."""
    lib, _ = load()
    return Path(lib._name).name if lib is not None else ""


def _lib() -> ctypes.CDLL:
    lib, why = load()
    if lib is None:
        raise RuntimeError(why)
    return lib


# q8 panel variants: the int8 dot products through AVX2 (vpmaddubsw), one VNNI instruction, or AMX tiles.
Q8_VARIANTS = {"avx2": 0, "avx_vnni": 1, "avx512_vnni": 2, "amx": 3}
# Forms of the AVX2 panels beyond code 0 (int8, fp32 scales), made from GGUF blocks as stored
# (model/kernels/blocks.py q8_panels): int8 with fp16 scales (a Q8_0 matrix moved, its scales as the file's),
# 5 bits a value with fp16 scales (a Q5_0 matrix's own values, csrc/q8.c q5_rows), and 4 bits a
# value with Q4_K's scales and mins (a Q4_K matrix's own values, q4k_rows).
Q8_F16_SCALES, Q5_PANELS, Q4K_PANELS = 4, 5, 6
# The 4-bit panels in 16 outputs (two of the 8-output ones interleaved, blocks.wide_q4k), read on
# AVX-512 VNNI (code 7) or, the same bytes, on AMX tiles from a few rows up (code 8).
Q4K_WIDE = {"avx512_vnni": 7, "amx": 8}
# A Q6_K matrix's own 6-bit values, scales and d in 16-output panels (csrc/blocks.c gq_q6_k_wide),
# read on AVX-512 VNNI at every row count (an AMX CPU's too).
Q6K_WIDE = 9
# The same bytes read on AVX2 as two 8-output halves (csrc/q8.c q6h_rows): Q6_K in its 6 bits there too.
Q6K_HALVES = 10
Q6K_CODES = frozenset({Q6K_WIDE, Q6K_HALVES})  # the 6-bit panels' codes, either way of reading them
# The codes one q8_linear_seg call may mix: the 8-output forms, or the 16-output ones.
SEGMENT_FORMS = (
    frozenset({0, Q8_F16_SCALES, Q5_PANELS, Q4K_PANELS, Q6K_HALVES}),
    frozenset({2, 3, *Q4K_WIDE.values(), Q6K_WIDE}),
)


def q8_quantize(w: torch.Tensor, variant: str = "avx2") -> tuple[torch.Tensor, torch.Tensor, int]:
    """W [N, K] -> (int8 q, fp32 scales, variant code): GGUF's Q8_0 blocks, packed in panels of 8
    outputs (csrc/q8.c; of 16 for AVX-512 VNNI and AMX), offset to unsigned bytes for the VNNI
    variants; the tensors have the sizes of [N, K] and [N, K/32] but only q8_linear reads them."""
    lib = _lib()
    w = w.float().contiguous()
    n, k = w.shape
    if k % GROUP or n % PANEL:
        raise ValueError(f"q8 needs K % {GROUP} == 0 and N % {PANEL} == 0, got N={n}, K={k}")
    q = torch.empty(n, k, dtype=torch.int8)
    d = torch.empty(n, k // GROUP, dtype=torch.float32)
    lib.q8_quantize(w.data_ptr(), n, k, q.data_ptr(), d.data_ptr())
    code = Q8_VARIANTS[variant]
    if code in (1, 2):
        lib.q8_offset(q.data_ptr(), q.numel())
    if variant in ("avx512_vnni", "amx"):  # panels of 16 outputs: two 8-output panels interleaved per 4 inputs
        if n % (2 * PANEL):
            raise ValueError(f"q8 ({variant}) needs N % {2 * PANEL} == 0, got N={n}")
        nb = k // GROUP
        q = q.view(n // 16, 2, nb, 8, 32).permute(0, 2, 3, 1, 4).contiguous().view(n, k)
        d = d.view(n // 16, 2, nb, 8).permute(0, 2, 1, 3).contiguous().view(n, nb)
    return q, d, code


def amx_ready() -> bool:
    """Whether this process may use AMX tiles (Linux grants them on request, once per process)."""
    lib, _ = load()
    return lib is not None and lib.q8_amx_init() == 0


# A prompt segment of at least this many rows runs them on AMX BF16 tiles (csrc/tiles_bf16.c) in the
# int8 panels' / the wide 4-bit panels' matrices, which dequantize every panel once a call: random
# 8192 x 2048 and 2048 x 8192 matrices, 2 threads, Intel Xeon AMX, ms (int8 path / BF16 tiles). The
# 4-bit panels (Q4_K): 32 rows 1.42-1.55 / 1.12-1.29, 48 rows 2.13-2.16 / 1.53-1.55, 64 rows
# 2.77-2.88 / 1.60-1.90, 256 rows 11.7-12.1 / 4.6-5.2; the int8 panels (Q8_0, Q6_K, HF q8), whose
# tiles need no unpacking: 32 rows 1.04-1.11 / 1.09-1.21, 48 rows 1.45-1.60 / 1.43-1.57, 64 rows
# 1.89-1.95 / 1.69-1.75, 256 rows 7.7-7.9 / 4.7-5.4. The segment's own length decides, never the
# step's: a row's bits must not depend on its neighbours (a request's prompt logprobs were once
# the AMX plan's victim of that, docs/kernels.md).
TILE_ROWS_INT8, TILE_ROWS_4BIT = 48, 32

_STEP = threading.local()  # the step this thread runs: its leading rows on BF16 tiles


@contextlib.contextmanager
def step_tile_rows(rows: tuple[int, int]):
    """Within it, the layers' matrices on this thread are told how many leading rows of their calls
    take the BF16 tiles in the int8 / the 4-bit AMX panels (runtime/context.py puts a step's long
    prompt segments first and counts them; runtime/runner.py sets this around each forward pass)."""
    before = getattr(_STEP, "rows", (0, 0))
    _STEP.rows = rows
    try:
        yield
    finally:
        _STEP.rows = before


def tile_rows() -> tuple[int, int]:
    """The running step's leading rows for the BF16 tiles on this thread ((0, 0) outside a step)."""
    return getattr(_STEP, "rows", (0, 0))


def argmax_rows(x: torch.Tensor) -> list[int] | None:
    """Each row's first index of its maximum (`x.argmax(-1).tolist()`'s answer) through
    csrc/argmax.c, for fp32 rows on the CPU with unit stride; None where it does not apply (no
    library, another dtype or layout, a NaN in a row): the caller asks torch. AVX2 code: the
    caller asks only where the plan runs our kernels (`sampler.sample`'s `native`)."""
    lib = _LIB or load()[0]  # (loaded already wherever the plan runs our kernels: no lock a step)
    if lib is None or x.dim() != 2 or x.dtype != torch.float32 or x.device.type != "cpu":
        return None
    if x.layout != torch.strided or x.stride(1) != 1 or not x.shape[0] or not 0 < x.shape[1] < 2**31:
        return None  # (the kernel's lane indices are int32)
    out = torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    lib.argmax_rows(x.data_ptr(), x.shape[0], x.shape[1], x.stride(0), out.data_ptr())
    rows = out.tolist()
    return None if -1 in rows else rows


def q8_linear(
    x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, variant: int = 0, tiles: tuple[int, int] = (0, 0)
) -> torch.Tensor:
    """x [M, K] fp32 @ W^T -> [M, N] fp32 (x quantized per row, in blocks of 32); `variant` is the
    code q8_quantize returned with these weights; `tiles`: how many leading rows of x the int8 /
    the 4-bit AMX panels run on BF16 tiles (`tile_rows`, csrc/q8.c q8_linear_seg)."""
    x = x.contiguous()
    m, k = x.shape
    n = d.shape[0]  # the outputs (q's shape is not [N, K] in the 5- and 4-bit panels)
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    if _LIB.q8_linear(x.data_ptr(), m, k, q.data_ptr(), d.data_ptr(), n, y.data_ptr(), variant, *tiles):
        raise MemoryError("q8: no scratch memory for the quantized activations")
    return y


def q8_linear_segments(x: torch.Tensor, segments, tiles: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """x [M, K] fp32 @ W^T -> [M, N] fp32 for W's outputs in segments [(q, d, code)] of panel forms
    of one width (`SEGMENT_FORMS`: the AVX2 codes 0, 4, 5, 6, 10, or the 16-output 2, 3, 7, 8, 9), side by
    side in one call (the activations quantized once); `tiles` as q8_linear's."""
    x = x.contiguous()
    m, k = x.shape
    n_seg = len(segments)
    codes = {c for _, _, c in segments}
    if not 1 <= n_seg <= 7 or not any(codes <= forms for forms in SEGMENT_FORMS):
        raise ValueError(
            f"1-7 segments of panels of one width (codes 0, 4, 5, 6, 10 or 2, 3, 7, 8, 9), got {sorted(codes)}"
        )
    ns = [d.shape[0] for _, d, _ in segments]
    n = sum(ns)
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    P = ctypes.c_void_p * n_seg
    if _LIB.q8_linear_seg(
        x.data_ptr(),
        m,
        k,
        n_seg,
        P(*[q.data_ptr() for q, _, _ in segments]),
        P(*[d.data_ptr() for _, d, _ in segments]),
        (ctypes.c_int64 * n_seg)(*ns),
        (ctypes.c_int * n_seg)(*[c for _, _, c in segments]),
        y.data_ptr(),
        n,
        *tiles,
    ):
        raise MemoryError("q8: no scratch memory for the quantized activations")
    return y


_LANES: int | None = None  # this CPU's width, read once (decode_attention asks 18 times a step)


def attention_lanes(cpu=None) -> int:
    """The decode attention's vector width for a CPU (default this one): 16 floats with AVX-512
    (F/BW/DQ/VL), else 8."""
    global _LANES
    if cpu is not None:
        return 16 if cpu.avx512 else 8
    if _LANES is None:
        from .cpu import this_cpu

        _LANES = attention_lanes(this_cpu())
    return _LANES


def attention_width(d: int) -> int:
    """The attention kernel's width for head_dim d: this CPU's widest that divides d, else 8 (the
    caller refuses a d that 8 does not divide either)."""
    lanes = attention_lanes()
    return lanes if d % lanes == 0 else 8


def decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    lanes: int | None = None,
) -> torch.Tensor:
    """q [B, Hq, D] fp32; pools [slots, Hkv, D] fp32 or fp16; row i attends over slots[i, :lens[i]].
    `lanes` (8 | 16) picks the kernel's vector width; by default this CPU's widest that divides D."""
    q, out, lanes = _attention_args(q, k_pool, v_pool, lanes)
    b, hq, d = q.shape
    hkv = k_pool.shape[1]
    fn = getattr(_LIB, f"decode_attention{'_f16' if k_pool.dtype == torch.float16 else ''}_{lanes}")
    if fn(
        q.data_ptr(),
        k_pool.data_ptr(),
        v_pool.data_ptr(),
        slots.data_ptr(),
        lens.data_ptr(),
        b,
        slots.shape[1],
        hq,
        hkv,
        d,
        scale,
        out.data_ptr(),
    ):
        raise MemoryError("decode attention: no scratch memory for the scores")
    return out


def _attention_args(q, k_pool, v_pool, lanes):
    if k_pool.dtype not in (torch.float32, torch.float16) or v_pool.dtype != k_pool.dtype:
        raise ValueError(f"the attention kernel reads fp32 or fp16 pools, not {k_pool.dtype}/{v_pool.dtype}")
    d = q.shape[-1]
    lanes = attention_width(d) if lanes is None else lanes
    if d % lanes:
        raise ValueError(f"the attention kernel at {lanes} lanes needs head_dim % {lanes} == 0, got {d}")
    q = q.float().contiguous()
    return q, torch.empty_like(q), lanes


def prompt_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    slots: torch.Tensor,
    starts: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
    lanes: int | None = None,
) -> torch.Tensor:
    """Prompt rows through the decode kernel: q [T, Hq, D]; slots [K] int64, the keys' pool slots in
    position order; row i attends over slots[starts[i] : starts[i] + lens[i]] (its causal and window
    range), in fp32 whatever q's dtype (returned fp32). Each row is computed alone, as a decode row
    at its position would be: a prompt's rows get the same bits whether it arrives whole, walks in
    chunks or decodes token by token over the same pool."""
    q, out, lanes = _attention_args(q, k_pool, v_pool, lanes)
    b, hq, d = q.shape
    if getattr(_LIB, f"prompt_attention_{lanes}")(
        q.data_ptr(),
        k_pool.data_ptr(),
        v_pool.data_ptr(),
        int(k_pool.dtype == torch.float16),
        slots.data_ptr(),
        starts.data_ptr(),
        lens.data_ptr(),
        b,
        hq,
        k_pool.shape[1],
        d,
        scale,
        out.data_ptr(),
    ):
        raise MemoryError("prompt attention: no scratch memory for the scores")
    return out


# The fused elementwise kernels (csrc/fused.c): contiguous rows, fp32 arithmetic; each returns a
# new tensor except add_rms_norm_, which updates the fp32 residual stream h in place. The norms
# also read and write bf16 (`out_dtype`): the inputs and outputs of bf16 dense matmuls, with the
# bits of fp32 + a cast.
_BF16 = {torch.float32: 0, torch.bfloat16: 1}  # the C functions' `bf16` flags


def _is_bf16(t: torch.Tensor, what: str) -> int:
    if t.dtype not in _BF16:
        raise ValueError(f"the fused ops take fp32 or bf16 {what}, not {t.dtype}")
    return _BF16[t.dtype]


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMSNorm(x) * w over the last dim, in `out_dtype` (default x's)."""
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    _LIB.rms_norm(
        x.data_ptr(),
        _is_bf16(x, "input"),
        x.numel() // x.shape[-1],
        x.shape[-1],
        w.data_ptr(),
        eps,
        out.data_ptr(),
        _is_bf16(out, "output"),
    )
    return out


def add_rms_norm_(
    h: torch.Tensor,
    a: torch.Tensor,
    w1: torch.Tensor | None,
    w2: torch.Tensor | None,
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor | None:
    """h += RMSNorm(a) * w1 in place (h += a where w1 is None); then RMSNorm(h) * w2 in
    `out_dtype` (default h's), or None when w2 is None. h: [T, n] fp32; a: [T, n] fp32 or bf16."""
    a = a.contiguous()
    t, n = h.shape
    out = torch.empty(t, n, dtype=out_dtype or h.dtype, device=h.device) if w2 is not None else None
    _LIB.add_rms_norm(
        h.data_ptr(),
        a.data_ptr(),
        _is_bf16(a, "input"),
        t,
        n,
        None if w1 is None else w1.data_ptr(),
        None if w2 is None else w2.data_ptr(),
        eps,
        None if out is None else out.data_ptr(),
        0 if out is None else _is_bf16(out, "output"),
    )
    return out


def norm_rope(
    src: torch.Tensor,
    col: int,
    heads: int,
    d: int,
    w: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """Columns [col, col + heads * d) of src [T, C] (fp32 or bf16), as [T, heads, d]: per-head
    RMSNorm * w (none when w is None), then rotate-half RoPE with cos/sin [T, (1,) d]. Returns
    [T, heads, d] fp32."""
    if src.stride(-1) != 1 or d % 2 or d > 1024:
        raise ValueError("norm_rope needs unit-stride rows and an even head_dim <= 1024")
    t = src.shape[0]
    out = torch.empty(t, heads, d, dtype=torch.float32, device=src.device)
    cos, sin = cos.contiguous(), sin.contiguous()
    _LIB.norm_rope(
        src.data_ptr() + src.element_size() * col,
        _is_bf16(src, "input"),
        src.stride(0),
        t,
        heads,
        d,
        None if w is None else w.data_ptr(),
        eps,
        cos.data_ptr(),
        sin.data_ptr(),
        out.data_ptr(),
    )
    return out


def gather_f16_bf16(pool: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """pool[idx] as bf16 (pool [slots, ...] fp16, contiguous; idx [n] int64): F.embedding and a cast
    in one pass."""
    if pool.dtype != torch.float16 or not pool.is_contiguous() or idx.dtype != torch.int64:
        raise ValueError("gather_f16_bf16 reads a contiguous fp16 pool with int64 indices")
    idx = idx.contiguous()
    width = pool[0].numel()
    out = torch.empty((idx.shape[0], *pool.shape[1:]), dtype=torch.bfloat16, device=pool.device)
    _LIB.gather_f16_bf16(pool.data_ptr(), width, idx.data_ptr(), idx.shape[0], out.data_ptr())
    return out


def kv_write_f16(pool: torch.Tensor, slots: torch.Tensor, src: torch.Tensor) -> None:
    """pool[slots] = src as fp16, in place (pool [slots, ...] fp16, contiguous; src [n, ...] fp32 or
    bf16 whose rows are unit-stride but may be a column slice): index_copy_ and a cast in one pass."""
    n = slots.shape[0]
    width = pool[0].numel()
    rows = src.reshape(n, -1) if src.dim() > 2 else src
    if (
        pool.dtype != torch.float16
        or not pool.is_contiguous()
        or slots.dtype != torch.int64
        or rows.shape != (n, width)
        or rows.stride(-1) != 1
    ):
        raise ValueError("kv_write_f16 writes [n, width] unit-stride rows into a contiguous fp16 pool by int64 slots")
    slots = slots.contiguous()
    _LIB.kv_write_f16(
        pool.data_ptr(), width, slots.data_ptr(), n, rows.data_ptr(), rows.stride(0), _is_bf16(rows, "rows")
    )


def _glu(gu: torch.Tensor, fn) -> torch.Tensor:
    """fn (csrc/fused.c geglu or swiglu) over the fused gate/up output gu [T, 2f], into [T, f] in
    gu's dtype: fp32, or bf16 (computed in fp32, rounded as a cast would)."""
    gu = gu.contiguous()
    t, f2 = gu.shape
    out = torch.empty(t, f2 // 2, dtype=gu.dtype, device=gu.device)
    fn(gu.data_ptr(), _is_bf16(gu, "input"), t, f2 // 2, out.data_ptr())
    return out


def geglu(gu: torch.Tensor) -> torch.Tensor:
    """gelu_tanh(gu[:, :f]) * gu[:, f:] (`_glu`)."""
    return _glu(gu, _LIB.geglu)


def swiglu(gu: torch.Tensor) -> torch.Tensor:
    """silu(gu[:, :f]) * gu[:, f:] (`_glu`)."""
    return _glu(gu, _LIB.swiglu)
