"""Our own CPU kernels (`csrc/*.c`): the q8 matmul and paged decode attention, AVX2 + FMA.

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
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-std=c11"]
GROUP = 32  # inputs per int8 block of the q8 matmul (K must be a multiple)

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_WHY: str | None = None


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tailgate" / "kernels"


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    h = hashlib.sha256(" ".join(FLAGS).encode() + version.encode())
    for src in SOURCES:
        h.update(src.name.encode() + src.read_bytes())
    out = cache_dir() / f"tailgate-{h.hexdigest()[:16]}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: two processes building at once both end with a whole file.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *FLAGS, "-o", tmp, *map(str, SOURCES), "-lm"], capture_output=True, text=True,
                           timeout=300)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed: {r.stderr.strip()[-500:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _declare(lib: ctypes.CDLL) -> None:
    P, I, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.q8_quantize.argtypes, lib.q8_quantize.restype = [P, I, I, P, P], None
    lib.q8_linear.argtypes, lib.q8_linear.restype = [P, I, I, P, P, I, P], ctypes.c_int
    lib.decode_attention.argtypes = [P, P, P, P, P, I, I, I, I, I, F, P]
    lib.decode_attention.restype = ctypes.c_int


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
                    _LIB = lib
                except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                    _WHY = f"native kernels could not be built: {e}"
        return _LIB, _WHY


def _lib() -> ctypes.CDLL:
    lib, why = load()
    if lib is None:
        raise RuntimeError(why)
    return lib


def q8_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (int8 q [N, K], fp32 scales [N, K/32]): GGUF's Q8_0 layout."""
    lib = _lib()
    w = w.float().contiguous()
    n, k = w.shape
    if k % GROUP:
        raise ValueError(f"q8 needs K % {GROUP} == 0, got K={k}")
    q = torch.empty(n, k, dtype=torch.int8)
    d = torch.empty(n, k // GROUP, dtype=torch.float32)
    lib.q8_quantize(w.data_ptr(), n, k, q.data_ptr(), d.data_ptr())
    return q, d


def q8_linear(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """x [M, K] fp32 @ W^T -> [M, N] fp32 (x quantized per row, in blocks of 32)."""
    x = x.contiguous()
    m, k = x.shape
    y = torch.empty(m, q.shape[0], dtype=torch.float32)
    if _LIB.q8_linear(x.data_ptr(), m, k, q.data_ptr(), d.data_ptr(), q.shape[0], y.data_ptr()):
        raise MemoryError("q8: no scratch memory for the quantized activations")
    return y


def decode_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slots: torch.Tensor,
                     lens: torch.Tensor, scale: float) -> torch.Tensor:
    """q [B, Hq, D] fp32; pools [slots, Hkv, D] fp32; row i attends over slots[i, :lens[i]]."""
    q = q.contiguous()
    b, hq, d = q.shape
    hkv = k_pool.shape[1]
    out = torch.empty_like(q)
    if _LIB.decode_attention(q.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), slots.data_ptr(), lens.data_ptr(),
                             b, slots.shape[1], hq, hkv, d, scale, out.data_ptr()):
        raise MemoryError("decode attention: no scratch memory for the scores")
    return out
