"""Gemma 3 text model: interleaved sliding/global attention, q/k norm, GeGLU, sandwich norms."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .context import StepContext
from .kv_cache import KVCache
from .layers import apply_rope, linear, paged_attention, rms_norm, rope_tables
from .spec import ModelSpec


def forward(w: dict, spec: ModelSpec, ctx: StepContext, kv: KVCache) -> torch.Tensor:
    """Run every row of the step; return logits (runtime dtype) for `ctx.sample_rows` only."""
    emb = w["embed"]
    dtype = emb.dtype
    h = emb[ctx.tokens] * torch.tensor(spec.hidden ** 0.5, dtype=dtype)
    ropes = {
        "global": rope_tables(ctx.positions, spec.head_dim, spec.rope_theta, dtype, spec.rope_scaling_factor),
        "local": rope_tables(ctx.positions, spec.head_dim, spec.rope_local_theta, dtype),
    }
    T, hq, hkv, d = h.shape[0], spec.n_heads, spec.n_kv_heads, spec.head_dim
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        fam, k_pool, v_pool = kv.layer(i)
        x = rms_norm(h, w[p + "attn_norm"], spec.eps)
        q, k, v = linear(x, w[p + "qkv"]).split([hq * d, hkv * d, hkv * d], dim=-1)
        q = rms_norm(q.view(T, hq, d), w[p + "q_norm"], spec.eps)
        k = rms_norm(k.view(T, hkv, d), w[p + "k_norm"], spec.eps)
        cos, sin = ropes[fam]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = paged_attention(q, k, v.view(T, hkv, d), k_pool, v_pool, ctx.families[fam], ctx.decode_rows, spec.scale,
                            ctx.native_attention)
        a = linear(a.reshape(T, hq * d), w[p + "o"])
        h = h + rms_norm(a, w[p + "post_attn_norm"], spec.eps)
        x = rms_norm(h, w[p + "ffn_norm"], spec.eps)
        gate, up = linear(x, w[p + "gate_up"]).chunk(2, dim=-1)
        x = linear(F.gelu(gate, approximate="tanh") * up, w[p + "down"])
        h = h + rms_norm(x, w[p + "post_ffn_norm"], spec.eps)
    h = rms_norm(h[ctx.sample_rows], w["final_norm"], spec.eps)
    logits = linear(h, w["head"])
    if spec.final_softcap:
        logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
    return logits
