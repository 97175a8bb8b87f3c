"""Gemma 4 text model: Gemma 3's sandwich-normed layers plus per-layer head shapes and RoPE,
value norms, k = v on global layers, KV shared by the last layers, per-layer inputs (PLE), a
mixture-of-experts block beside the MLP, and a per-layer output scalar.

Mirrors `transformers.models.gemma4.modeling_gemma4` (pinned 5.24); tests compare logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..runtime.context import StepContext
from ..runtime.kv_cache import KVCache
from ..runtime.layers import glu_mlp, linear, paged_attention, rope_rows
from ..runtime.ops import ops
from ..spec import ModelSpec


def _ple_inputs(w: dict, spec: ModelSpec, ctx: StepContext, h: torch.Tensor, op) -> torch.Tensor:
    """Per-layer inputs [T, layers, P]: a token's own per-layer embedding mixed with a projection
    of its main embedding (HF's get_per_layer_inputs + project_per_layer_inputs)."""
    t, n, p = h.shape[0], spec.n_layers, spec.ple_dim
    own = w["ple_embed"][ctx.tokens].to(h.dtype) * torch.tensor(p**0.5, dtype=h.dtype, device=h.device)
    proj = (linear(h, w["ple_proj"]) * spec.hidden**-0.5).view(t, n, p)
    proj = op.rms_norm(proj, w["ple_norm"], spec.eps)
    return (proj + own.view(t, n, p)) * 2**-0.5


def _experts(w: dict, p: str, spec: ModelSpec, h: torch.Tensor, op) -> torch.Tensor:
    """The MoE half of the feed-forward: route the post-attention residual h to its top-k experts."""
    dt = h.dtype  # HF routes in the model's dtype; the scale vectors are stored fp32
    r = op.rms_norm(h, w["unit.hidden"], spec.eps) * w[p + "router_scale"].to(dt) * spec.hidden**-0.5
    probs = torch.softmax(linear(r, w[p + "router"]).float(), dim=-1)
    top_w, top_i = probs.topk(spec.moe_top_k, dim=-1)
    top_w = (top_w / top_w.sum(-1, keepdim=True)) * w[p + "expert_scale"][top_i]
    x = op.rms_norm(h, w[p + "ffn_norm_2"], spec.eps)
    out = torch.zeros_like(x)
    gate_up, down = w[p + "experts_gate_up"], w[p + "experts_down"]  # in the plan's dense dtype
    for e in top_i.unique().tolist():
        rows, slot = (top_i == e).nonzero(as_tuple=True)
        gu = F.linear(x[rows].to(gate_up.dtype), gate_up[e]).to(dt)
        y = F.linear(op.geglu(gu).to(down.dtype), down[e]).to(dt)
        out.index_add_(0, rows, (y * top_w[rows, slot, None]).to(dt))
    return out


def forward(w: dict, spec: ModelSpec, ctx: StepContext, kv: KVCache) -> torch.Tensor:
    """Run every row of the step; return logits (runtime dtype) for `ctx.sample_rows` only."""
    emb = w["embed"]
    dtype = emb.dtype
    h = emb[ctx.tokens] * torch.tensor(spec.hidden**0.5, dtype=dtype, device=emb.device)
    op = ops(ctx)
    dg, dl = spec.family_shape(False)[1], spec.family_shape(True)[1]
    ropes = {
        "global": rope_rows(ctx.positions, dg, spec.rope_theta, dtype, spec.rope_scaling_factor, spec.rope_fraction),
        "local": rope_rows(
            ctx.positions, dl, spec.rope_local_theta, dtype, spec.rope_local_scaling, spec.rope_local_fraction
        ),
    }
    pli = _ple_inputs(w, spec, ctx, h, op) if spec.ple_dim else None
    T, hq = h.shape[0], spec.n_heads
    shared: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # owner layer -> this step's K, V
    x = op.rms_norm(h, w["layers.0.attn_norm"], spec.eps)
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        fam, k_pool, v_pool = kv.layer(i)
        hkv, d = spec.layer_kv_heads[i], spec.layer_head_dim[i]
        qkv = linear(x, w[p + "qkv"])
        cos, sin = ropes[fam]
        q = op.norm_rope(qkv, 0, hq, d, w[p + "q_norm"], spec.eps, cos, sin)
        src = spec.kv_source[i]
        if src == i:
            k = op.norm_rope(qkv, hq * d, hkv, d, w[p + "k_norm"], spec.eps, cos, sin)
            # k = v (global layers): V is the K projection before its norm and RoPE.
            v0 = hq * d if spec.k_eq_v and fam == "global" else (hq + hkv) * d
            v = op.rms_norm(qkv[:, v0 : v0 + hkv * d].reshape(T, hkv, d), w[f"unit.{d}"], spec.eps)
            shared[i] = (k, v)
        else:
            k, v = shared[src]
        a = paged_attention(
            q, k, v, k_pool, v_pool, ctx.families[fam], ctx.decode_rows, spec.scale, ctx.native, write=src == i
        )
        a = linear(a.reshape(T, hq * d), w[p + "o"])
        x = op.add_rms_norm_(h, a, w[p + "post_attn_norm"], w[p + "ffn_norm"], spec.eps)
        m = glu_mlp(x, w[p + "gate_up"], w[p + "down"], op.geglu, ctx.native)
        if spec.moe_experts:
            m = op.rms_norm(m, w[p + "post_ffn_norm_1"], spec.eps) + op.rms_norm(
                _experts(w, p, spec, h, op), w[p + "post_ffn_norm_2"], spec.eps
            )
        op.add_rms_norm_(h, m, w[p + "post_ffn_norm"], None, spec.eps)
        if pli is not None:
            g = F.gelu(linear(h, w[p + "ple_gate"]), approximate="tanh") * pli[:, i]
            op.add_rms_norm_(h, linear(g, w[p + "ple_out"]), w[p + "post_ple_norm"], None, spec.eps)
        if p + "layer_scalar" in w:
            h.mul_(w[p + "layer_scalar"].to(dtype))
        if i + 1 < spec.n_layers:
            x = op.rms_norm(h, w[f"layers.{i + 1}.attn_norm"], spec.eps)
    h = op.rms_norm(h[ctx.sample_rows], w["final_norm"], spec.eps)
    logits = linear(h, w["head"])
    if spec.final_softcap:
        logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
    return logits
