"""Llama-shaped families (`families/llama.py`: Llama 1-3.x, Qwen2/2.5, Qwen3, Mistral): RMSNorm,
SwiGLU, RoPE (Llama 3's frequency remap where the spec or a GGUF's `rope_freqs` says), GQA, tied or
untied head; Qwen3's per-head q/k norms where the weights have them; projection biases ride in
their `choice.BiasedLinear`; sliding layers (Mistral) read their window through the step context."""

from __future__ import annotations

import torch

from ..runtime.context import StepContext
from ..runtime.kv_cache import KVCache
from ..runtime.layers import linear, paged_attention, raw, rope_rows, takes
from ..runtime.native_layers import step_layers
from ..runtime.ops import ops
from ..spec import ModelSpec


def forward(w: dict, spec: ModelSpec, ctx: StepContext, kv: KVCache) -> torch.Tensor:
    """Run every row of the step; return logits (runtime dtype) for `ctx.sample_rows` only."""
    h = w["embed"][ctx.tokens]
    cos, sin = rope_rows(
        ctx.positions,
        spec.head_dim,
        spec.rope_theta,
        h.dtype,
        spec.rope_scaling_factor,
        llama3=spec.rope_llama3,
        divisors=w.get("rope_freqs"),
    )
    T, hq, hkv, d = h.shape[0], spec.n_heads, spec.n_kv_heads, spec.head_dim
    op = ops(ctx)
    # The residual adds ride the next norm (`add_rms_norm_` with no norm of its own input) and the
    # SwiGLU is one pass (`swiglu`): a one-row step of Llama 3.2 3B spent ~50 us a layer in the
    # split, silu, product and adds they replace (AMD EPYC Zen 4).
    x = op.rms_norm(h, w["layers.0.attn_norm"], spec.eps, takes(w["layers.0.qkv"], T))
    # A step of decode rows alone runs its layers in one native call where its kernels allow
    # (runtime/native_layers.py: the same kernels in the same order, the same bits).
    for i in range(
        0
        if step_layers(w, spec, ctx, kv, h, x, {"global": (cos, sin), "local": (cos, sin)}, "swiglu")
        else spec.n_layers
    ):
        p = f"layers.{i}."
        fam, k_pool, v_pool = kv.layer(i)
        # The norms write what the next matmul reads (`takes`) and the fused norm_rope reads qkv as
        # the matmul left it: casts spared on bf16 dense weights, the same bits (gemma3_forward.py).
        qkv = raw(x, w[p + "qkv"])
        q = op.norm_rope(qkv, 0, hq, d, w.get(p + "q_norm"), spec.eps, cos, sin)  # Qwen3 has q/k norms
        k = op.norm_rope(qkv, hq * d, hkv, d, w.get(p + "k_norm"), spec.eps, cos, sin)
        a = paged_attention(
            q,
            k,
            qkv[:, (hq + hkv) * d :].view(T, hkv, d),
            k_pool,
            v_pool,
            ctx.families[fam],
            ctx.decode_rows,
            spec.scale,
            ctx.native,
        )
        o = raw(a.reshape(T, hq * d), w[p + "o"])
        x = op.add_rms_norm_(h, o, None, w[p + "ffn_norm"], spec.eps, takes(w[p + "gate_up"], T))
        gu = raw(x, w[p + "gate_up"]) if ctx.native else linear(x, w[p + "gate_up"], h.dtype)
        act = op.swiglu(gu)
        # down reads the SwiGLU in h's dtype, as before the fusion, unless its kernel takes the
        # SwiGLU's own (bf16 dense weights): a q8 kernel given bf16 rows would round its fp32 product
        # to bf16 before the residual add (issue 35's error); the add widens either exactly.
        down = raw(act if takes(w[p + "down"], T) == act.dtype else act.to(h.dtype), w[p + "down"])
        last = i + 1 == spec.n_layers
        nxt = None if last else w[f"layers.{i + 1}.attn_norm"]
        x = op.add_rms_norm_(h, down, None, nxt, spec.eps, None if last else takes(w[f"layers.{i + 1}.qkv"], T))
    h = op.rms_norm(h[ctx.sample_rows], w["final_norm"], spec.eps)
    return linear(h, w["head"])
