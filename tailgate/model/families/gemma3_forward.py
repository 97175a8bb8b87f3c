"""Gemma 3 text model: interleaved sliding/global attention, q/k norm, GeGLU, sandwich norms."""

from __future__ import annotations

import torch

from ..runtime.context import StepContext
from ..runtime.kv_cache import KVCache
from ..runtime.layers import glu_mlp, linear, paged_attention, raw, rope_rows, takes
from ..runtime.native_layers import step_layers
from ..runtime.ops import ops
from ..spec import ModelSpec


def forward(w: dict, spec: ModelSpec, ctx: StepContext, kv: KVCache) -> torch.Tensor:
    """Run every row of the step; return logits (runtime dtype) for `ctx.sample_rows` only."""
    emb = w["embed"]
    dtype = emb.dtype
    h = emb[ctx.tokens] * torch.tensor(spec.hidden**0.5, dtype=dtype, device=emb.device)
    ropes = {
        "global": rope_rows(ctx.positions, spec.head_dim, spec.rope_theta, dtype, spec.rope_scaling_factor),
        "local": rope_rows(ctx.positions, spec.head_dim, spec.rope_local_theta, dtype),
    }
    T, hq, hkv, d = h.shape[0], spec.n_heads, spec.n_kv_heads, spec.head_dim
    op = ops(ctx)
    # Each norm writes what the next matmul reads and each matmul's output stays as it comes
    # (`takes`, `raw`): on bf16 dense weights under fp32 activations that spares five casts a
    # layer, with the same bits (the fused ops widen exactly and round as the casts did).
    x = op.rms_norm(h, w["layers.0.attn_norm"], spec.eps, takes(w["layers.0.qkv"], T))
    # A step of decode rows alone runs its layers in one native call where its kernels allow
    # (runtime/native_layers.py: the same kernels in the same order, the same bits).
    for i in range(0 if step_layers(w, spec, ctx, kv, h, x, ropes, "geglu", post_norms=True) else spec.n_layers):
        p = f"layers.{i}."
        fam, k_pool, v_pool = kv.layer(i)
        qkv = raw(x, w[p + "qkv"])
        cos, sin = ropes[fam]
        q = op.norm_rope(qkv, 0, hq, d, w[p + "q_norm"], spec.eps, cos, sin)
        k = op.norm_rope(qkv, hq * d, hkv, d, w[p + "k_norm"], spec.eps, cos, sin)
        v = qkv[:, (hq + hkv) * d :].view(T, hkv, d)
        a = paged_attention(
            q,
            k,
            v,
            k_pool,
            v_pool,
            ctx.families[fam],
            ctx.decode_rows,
            spec.scale,
            ctx.native,
            out_dtype=takes(w[p + "o"], T),
        )
        a = raw(a.reshape(T, hq * d), w[p + "o"])
        x = op.add_rms_norm_(h, a, w[p + "post_attn_norm"], w[p + "ffn_norm"], spec.eps, takes(w[p + "gate_up"], T))
        x = glu_mlp(x, w[p + "gate_up"], w[p + "down"], op.geglu, ctx.native)
        last = i + 1 == spec.n_layers
        nxt = None if last else w[f"layers.{i + 1}.attn_norm"]
        x = op.add_rms_norm_(
            h, x, w[p + "post_ffn_norm"], nxt, spec.eps, None if last else takes(w[f"layers.{i + 1}.qkv"], T)
        )
    h = op.rms_norm(h[ctx.sample_rows], w["final_norm"], spec.eps)
    logits = linear(h, w["head"])
    if spec.final_softcap:
        logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
    return logits
