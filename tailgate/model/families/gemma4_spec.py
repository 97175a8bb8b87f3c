"""Gemma 4 text configs (`gemma4_text`, or a `gemma4` config's `text_config`) read into a ModelSpec.

The defaults mirror `transformers.models.gemma4.Gemma4TextConfig` (pinned 5.24): a config.json
that omits a field means what it means to HF. Every switch we cannot run refuses here, by name,
before any weights load. Not handled: multimodal placeholder ids (HF embeds them as padding; a
text prompt does not produce them).
"""

from __future__ import annotations

from ..spec import ModelSpec

# Sliding layers: default RoPE at 10k; global layers: "proportional" RoPE rotating a quarter of
# each (wider) head at 1M. HF's defaults when `rope_parameters` is absent.
_DEFAULT_ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
_LAYER_OVERRIDES = ("head_dim", "num_key_value_heads")  # what per_layer_config may change per layer
_KNOWN_TYPES = ("sliding_attention", "full_attention")


def _refuse(what: str) -> ValueError:
    return ValueError(f"Gemma 4 config: {what} is not supported by tailgate")


def _rope(params: dict | None, kind: str) -> tuple[float, float, float]:
    """(theta, rotary fraction, position scale) for one layer type. No `rope_parameters` at all
    means HF's defaults; a given one must name both fields per layer type (HF fails without them:
    refusing beats serving another theta)."""
    p = (params or _DEFAULT_ROPE).get(kind)
    if not isinstance(p, dict) or "rope_type" not in p or "rope_theta" not in p:
        raise _refuse(f"rope_parameters without rope_type and rope_theta for {kind}")
    rtype = p["rope_type"]
    theta = float(p["rope_theta"])
    if rtype == "default":  # HF's default RoPE for Gemma 4 ignores partial_rotary_factor
        return theta, 1.0, 1.0
    if rtype == "proportional":  # the first fraction of the angles rotate; the rest stay put
        return theta, float(p.get("partial_rotary_factor", 1.0)), float(p.get("factor", 1.0))
    raise _refuse(f"rope_parameters.{kind}.rope_type {rtype!r} (supported: default, proportional)")


def _layer_types(cfg: dict, n: int) -> list[str]:
    types = list(cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)])
    if len(types) != n:
        raise ValueError(f"Gemma 4 config: layer_types has {len(types)} entries for {n} layers")
    bad = sorted(set(types) - set(_KNOWN_TYPES))
    if bad:
        raise _refuse(f"layer type {bad[0]!r}")
    types[-1] = "full_attention"  # HF forces the last layer global (with a warning)
    return types


def _per_layer(cfg: dict, types: list[str]) -> tuple[list[int], list[int]]:
    n = len(types)
    head_dim = cfg.get("head_dim", 256)
    kv = cfg.get("num_key_value_heads", 4)
    overrides = cfg.get("per_layer_config") or {}
    if "per_layer_config" not in cfg:  # the older form: global layers get global_head_dim (HF default 512)
        o = {"head_dim": cfg.get("global_head_dim", 512)}
        if cfg.get("attention_k_eq_v", False) and cfg.get("num_global_key_value_heads") is not None:
            o["num_key_value_heads"] = cfg["num_global_key_value_heads"]
        overrides = {i: o for i, t in enumerate(types) if t == "full_attention"}
    dims, heads = [head_dim] * n, [kv] * n
    for key, o in overrides.items():
        if not str(key).isdigit() or not 0 <= int(key) < n:
            raise ValueError(f"Gemma 4 config: per_layer_config key {key!r} is not a layer index below {n}")
        extra = sorted(set(o) - set(_LAYER_OVERRIDES))
        if extra:
            raise _refuse(
                f"per_layer_config override {extra[0]!r} (layer {key}; supported: {', '.join(_LAYER_OVERRIDES)})"
            )
        dims[int(key)] = o.get("head_dim", head_dim)
        heads[int(key)] = o.get("num_key_value_heads", kv)
    return dims, heads


def _kv_sources(types: list[str], shared: int) -> list[int]:
    """Layer i reads the K/V of layer src[i]: itself, or (the last `shared` layers) the last
    earlier layer of its type that owns KV — HF's kv_sharing_modes "reuse" / "store"."""
    n = len(types)
    first = n - shared
    if shared and first <= 0:
        raise _refuse(f"num_kv_shared_layers {shared} with {n} layers (no layer would own KV)")
    src = list(range(n))
    for i in range(first, n):
        owners = [j for j in range(first) if types[j] == types[i]]
        if not owners:
            raise ValueError(
                f"Gemma 4 config: layer {i} ({types[i]}) shares KV but no earlier layer of its type owns any"
            )
        src[i] = owners[-1]
    return src


def read_gemma4_spec(cfg: dict) -> ModelSpec:
    if cfg.get("use_bidirectional_attention") == "all":
        raise _refuse("use_bidirectional_attention 'all' (text generation needs causal attention)")
    if cfg.get("attention_bias"):
        raise _refuse("attention_bias")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise _refuse(f"hidden_activation {act!r} (supported: gelu_pytorch_tanh)")
    n = cfg.get("num_hidden_layers", 30)
    types = _layer_types(cfg, n)
    dims, heads = _per_layer(cfg, types)
    src = _kv_sources(types, cfg.get("num_kv_shared_layers", 0) or 0)
    for i, j in enumerate(src):
        if (dims[i], heads[i]) != (dims[j], heads[j]):
            raise _refuse(f"layer {i} reading layer {j}'s KV with a different head shape")
    vocab = cfg.get("vocab_size", 262_144)
    ple = cfg.get("hidden_size_per_layer_input", 256) or 0
    if ple and cfg.get("vocab_size_per_layer_input", 262_144) < vocab:
        raise _refuse("vocab_size_per_layer_input below vocab_size (tokens past it have no per-layer row)")
    experts = top_k = 0
    if cfg.get("enable_moe_block"):
        experts, top_k = cfg.get("num_experts") or 0, cfg.get("top_k_experts") or 0
        if not (experts and top_k and cfg.get("moe_intermediate_size")) or top_k > experts:
            raise ValueError(
                "Gemma 4 config: enable_moe_block needs num_experts, top_k_experts <= num_experts "
                "and moe_intermediate_size"
            )
    g_theta, g_frac, g_scale = _rope(cfg.get("rope_parameters"), "full_attention")
    l_theta, l_frac, l_scale = _rope(cfg.get("rope_parameters"), "sliding_attention")
    sliding = tuple(t == "sliding_attention" for t in types)
    spec = ModelSpec(
        arch="gemma4",
        vocab_size=vocab,
        hidden=cfg.get("hidden_size", 2304),
        n_layers=n,
        n_heads=cfg.get("num_attention_heads", 8),
        n_kv_heads=heads[0],
        head_dim=dims[0],
        ffn=cfg.get("intermediate_size", 9216),
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=g_theta,
        rope_local_theta=l_theta,
        rope_scaling_factor=g_scale,
        rope_local_scaling=l_scale,
        rope_fraction=g_frac,
        rope_local_fraction=l_frac,
        max_position=cfg.get("max_position_embeddings", 131_072),
        sliding_window=cfg.get("sliding_window", 512),
        layer_sliding=sliding,
        query_scale=1.0,  # q is RMS-normed per head; HF's Gemma 4 attention scales by 1
        final_softcap=cfg.get("final_logit_softcapping"),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        layer_head_dim=tuple(dims),
        layer_kv_heads=tuple(heads),
        kv_source=tuple(src),
        k_eq_v=bool(cfg.get("attention_k_eq_v", False)),
        ple_dim=ple,
        moe_experts=experts,
        moe_top_k=top_k,
    )
    spec.family_shape(True), spec.family_shape(False)  # one pool per family: refuse mixed shapes now
    return spec
