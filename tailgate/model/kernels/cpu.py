"""What the CPU can do, read from /proc/cpuinfo text (injectable, so tests fake any CPU).

Every kernel decision in `choice.py` comes from a `CpuInfo`, never from torch's own probes of
the real CPU: a test can then ask "what would an AVX2-only EPYC get?" on an AMX Xeon.
"""

from __future__ import annotations

from dataclasses import dataclass


class KernelError(ValueError):
    """A --dtype/--kernels choice this machine cannot honour; raised before any weights load.
    (Here, not in choice.py, so the CLI can catch it without importing torch.)"""


@dataclass(frozen=True)
class CpuInfo:
    model: str
    flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        """bf16 arithmetic in hardware (AVX-512 BF16 dot products or AMX tiles): bf16 matmuls
        ~3x fp32 on the Xeon we measured. Without it torch emulates bf16 and is slower than fp32."""
        return "avx512_bf16" in self.flags or "amx_bf16" in self.flags

    @property
    def onednn_bf16(self) -> bool:
        """oneDNN's bf16 weight reorder (`mkldnn._reorder_linear_weight`) runs only with
        AVX-512 BW/VL/DQ or AVX-NE-CONVERT; anywhere else it raises (seen on AMD EPYC Zen 3)."""
        return {"avx512bw", "avx512vl", "avx512dq"} <= self.flags or "avx_ne_convert" in self.flags

    @property
    def avx512(self) -> bool:
        """AVX-512 F/BW/DQ/VL: what our 16-lane attention and wide q8 panels are built for."""
        return {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= self.flags

    @property
    def q8_variant(self) -> str:
        """The q8 matmul's int8 dot products (csrc/q8.c; the same int32 sums in every variant):
        AMX int8 tiles, else AVX-512 VNNI's 64-byte vpdpbusd, else AVX-VNNI's 32-byte one, else
        AVX2's four-instruction sequence. (`choice.choose` steps down from AMX where the kernel
        does not grant this process the tiles.)"""
        if self.avx512 and {"amx_tile", "amx_int8"} <= self.flags:
            return "amx"
        if self.avx512 and "avx512_vnni" in self.flags:
            return "avx512_vnni"
        if "avx_vnni" in self.flags:
            return "avx_vnni"
        return "avx2"

    @property
    def prefetch_far(self) -> bool:
        """Whether the 16-output q8 panels ask for their weights 32 KB ahead into L2 (AMD EPYC:
        Zen 4 measured 0.93x / 0.81x a 1- / 4-row decode step's matmuls) rather than four blocks
        ahead into L1 (what the AMX Xeon measured best; csrc/q8.c Q8_PREFETCH_FAR)."""
        return self.model.startswith("AMD")

    @property
    def isa(self) -> str:
        """The widest class that matters for our kernels, for logs and `/version`."""
        if "amx_bf16" in self.flags:
            return "amx"
        if "avx512_bf16" in self.flags:
            return "avx512_bf16"
        if "avx512f" in self.flags:
            return "avx512"
        if "avx2" in self.flags and "fma" in self.flags:
            return "avx2"
        return "baseline"


def parse_cpuinfo(text: str) -> CpuInfo:
    model, flags = "unknown CPU", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model, flags)


_CACHED: CpuInfo | None = None


def this_cpu() -> CpuInfo:
    global _CACHED
    if _CACHED is None:
        try:
            with open("/proc/cpuinfo") as f:
                _CACHED = parse_cpuinfo(f.read())
        except OSError:  # not Linux: claim nothing, so every choice falls back to plain fp32
            import platform

            _CACHED = CpuInfo(platform.processor() or "unknown CPU", frozenset())
    return _CACHED
