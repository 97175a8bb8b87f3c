"""The step's elementwise ops, two interchangeable sets: torch's, and our fused C ones
(`csrc/fused.c`, fp32 CPU steps whose kernel plan says `native`). Model files call `ops(ctx)`
and stay the same text for both.

Each set provides:
- `rms_norm(x, w, eps, out_dtype=None)`
- `add_rms_norm_(h, a, w1, w2, eps, out_dtype=None)`: h += RMSNorm(a) * w1 in place (h += a where
  w1 is None), then RMSNorm(h) * w2 (or None); `a` may be narrower than h (a bf16 matmul's output)
- `norm_rope(src, col, heads, d, w, eps, cos, sin)`: columns [col, col + heads*d) of src as
  [T, heads, d], per-head RMSNorm * w (skipped when w is None), then rotate-half RoPE, in cos's dtype
- `geglu(gu)`: gelu_tanh(gate) * up over the fused gate/up output; `swiglu(gu)`: silu(gate) * up
`out_dtype` (default: the input's, h's for add_rms_norm_) is what the next matmul reads (`takes`).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch.nn.functional as F

from ..kernels import native
from .context import StepContext
from .layers import apply_rope, rms_norm


def _rms_norm(x, w, eps, out_dtype=None):
    y = rms_norm(x, w, eps)
    return y if out_dtype is None else y.to(out_dtype)


def _add_rms_norm_(h, a, w1, w2, eps, out_dtype=None):
    h.add_(a.to(h.dtype) if w1 is None else rms_norm(a.to(h.dtype), w1, eps))
    return None if w2 is None else _rms_norm(h, w2, eps, out_dtype)


def _norm_rope(src, col, heads, d, w, eps, cos, sin):
    x = src[:, col : col + heads * d].view(src.shape[0], heads, d).to(cos.dtype)
    return apply_rope(x if w is None else rms_norm(x, w, eps), cos, sin)


def _glu(act):
    """act(gate) * up over the fused gate/up output."""

    def run(gu):
        gate, up = gu.chunk(2, dim=-1)
        return act(gate) * up

    return run


_geglu, _swiglu = _glu(lambda g: F.gelu(g, approximate="tanh")), _glu(F.silu)


TORCH = SimpleNamespace(
    rms_norm=_rms_norm, add_rms_norm_=_add_rms_norm_, norm_rope=_norm_rope, geglu=_geglu, swiglu=_swiglu
)
NATIVE = SimpleNamespace(
    rms_norm=native.rms_norm,
    add_rms_norm_=native.add_rms_norm_,
    norm_rope=native.norm_rope,
    geglu=native.geglu,
    swiglu=native.swiglu,
)


def ops(ctx: StepContext) -> SimpleNamespace:
    return NATIVE if ctx.native else TORCH
