"""Gemma 3 (GGUF or HF text/multimodal directories) and Gemma 4 (HF directories)."""

from __future__ import annotations

from .gemma4_spec import read_gemma4_spec
from ..spec import ModelSpec, gemma3_layer_sliding
from .registry import HF_LAYER, Family, register

# Gemma has four norms per layer (Llama's post_attention_layernorm is its pre-MLP norm).
GEMMA_LAYER = {
    **HF_LAYER,
    "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffn_norm",
}
# Gemma 4 adds a mixture-of-experts block beside the MLP, per-layer inputs and a layer scalar.
GEMMA4_LAYER = {
    **GEMMA_LAYER,
    "post_feedforward_layernorm_1": "post_ffn_norm_1",
    "post_feedforward_layernorm_2": "post_ffn_norm_2",
    "pre_feedforward_layernorm_2": "ffn_norm_2",
    "router.proj": "router",
    "router.scale": "router_scale",
    "router.per_expert_scale": "expert_scale",
    "experts.gate_up_proj": "experts_gate_up",
    "experts.down_proj": "experts_down",
    "per_layer_input_gate": "ple_gate",
    "per_layer_projection": "ple_out",
    "post_per_layer_input_norm": "post_ple_norm",
    "layer_scalar": "layer_scalar",
}
GEMMA4_TOP = {
    "embed_tokens_per_layer": "ple_embed",
    "per_layer_model_projection": "ple_proj",
    "per_layer_projection_norm": "ple_norm",
}
TURN_ENDS = ("<end_of_turn>", "<turn|>")  # Gemma 3's and Gemma 4's; HF's generation_config lists them as EOS


def rope_theta(cfg: dict, kind: str, default: float) -> float:
    params = cfg.get("rope_parameters") or {}
    if kind in params and isinstance(params[kind], dict):
        return float(params[kind].get("rope_theta", default))
    if "rope_theta" in params:
        return float(params["rope_theta"])
    key = "rope_local_base_freq" if kind == "sliding_attention" else "rope_theta"
    return float(cfg.get(key, default))


def read_gemma3_hf(cfg: dict) -> ModelSpec:
    hidden, n_heads = cfg["hidden_size"], cfg["num_attention_heads"]
    n = cfg["num_hidden_layers"]
    head_dim = cfg.get("head_dim") or hidden // n_heads
    types = cfg.get("layer_types")
    sliding = (
        tuple(t == "sliding_attention" for t in types)
        if types
        else gemma3_layer_sliding(n, cfg.get("sliding_window_pattern", 6))
    )
    scaling = (cfg.get("rope_scaling") or {}).get("factor") or (
        (cfg.get("rope_parameters") or {}).get("full_attention") or {}
    ).get("factor")
    return ModelSpec(
        arch="gemma3",
        vocab_size=cfg["vocab_size"],
        hidden=hidden,
        n_layers=n,
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads", n_heads),
        head_dim=head_dim,
        ffn=cfg["intermediate_size"],
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position=cfg.get("max_position_embeddings", 8192),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        rope_theta=rope_theta(cfg, "full_attention", 1e6),
        rope_local_theta=rope_theta(cfg, "sliding_attention", 1e4),
        sliding_window=cfg.get("sliding_window", 512),
        layer_sliding=sliding,
        rope_scaling_factor=float(scaling or 1.0),
        query_scale=float(cfg.get("query_pre_attn_scalar", head_dim)) ** -0.5,
        final_softcap=cfg.get("final_logit_softcapping"),
        attn_softcap=cfg.get("attn_logit_softcapping"),
    )


def read_gemma3_gguf(common: dict, g) -> ModelSpec:
    scaling = g("rope.scaling.factor")
    return ModelSpec(
        arch="gemma3",
        **common,
        # llama.cpp hard-codes the local base for Gemma 3; HF's config calls it rope_local_base_freq.
        rope_local_theta=10000.0,
        sliding_window=int(g("attention.sliding_window", 512)),
        layer_sliding=gemma3_layer_sliding(common["n_layers"]),
        rope_scaling_factor=float(scaling) if scaling else 1.0,
        # Gemma 3 scales queries by query_pre_attn_scalar ** -0.5, which equals head_dim for
        # every released size but 27B; GGUF does not record it separately.
        query_scale=common["head_dim"] ** -0.5,
        final_softcap=g("final_logit_softcapping"),
        attn_softcap=g("attn_logit_softcapping"),
    )


def gemma4_units(spec: ModelSpec, device) -> dict:
    """Unit weights for Gemma 4's scale-free norms (values, router input)."""
    import torch

    out = {f"unit.{d}": torch.ones(d, device=device) for d in set(spec.layer_head_dim)}
    out["unit.hidden"] = torch.ones(spec.hidden, device=device)
    return out


GEMMA3 = register(
    Family(
        name="gemma3",
        forward="gemma3_forward",
        hf_types=("gemma3_text",),
        hf_composite=("gemma3",),
        read_hf=read_gemma3_hf,
        hf_layer=GEMMA_LAYER,
        hf_norm_plus_one=True,
        gguf_archs=("gemma3",),
        read_gguf=read_gemma3_gguf,
        add_bos=True,
        turn_ends=TURN_ENDS,
        chat_fallback="gemma",
    )
)
GEMMA4 = register(
    Family(
        name="gemma4",
        forward="gemma4_forward",
        hf_types=("gemma4_text",),
        hf_composite=("gemma4",),
        read_hf=read_gemma4_spec,
        hf_layer=GEMMA4_LAYER,
        hf_top=GEMMA4_TOP,
        add_bos=True,
        turn_ends=TURN_ENDS,
        extra_weights=gemma4_units,
        chat_fallback=None,  # its turn format differs from Gemma 3's and ChatML: no chat without its own template
    )
)
