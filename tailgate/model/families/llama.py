"""Llama-shaped families, one forward (`model/families/llama_forward.py`): RMSNorm, SwiGLU, RoPE, GQA.

- Llama (SmolLM2; Llama 3.x with `rope_type: "llama3"` frequencies and, at 1B/3B, a tied head)
- Qwen2 / Qwen2.5: biases on q/k/v (any projection's bias is carried: `choice.BiasedLinear`)
- Qwen3: per-head q/k RMSNorm before RoPE (a plain weight, not Gemma's 1 + w), no biases
- Mistral: Llama's layers, every one sliding over `sliding_window` keys when the config sets one

A field config.json omits means what it means to HF: each family's defaults below are its
transformers 5.24 config class's (they differ: Qwen's KV heads default to 32, Mistral's to 8),
except the model's shape, which must be given.
"""

from __future__ import annotations

from ..spec import ModelSpec
from .registry import HF_LAYER, Family, register

LLAMA_LAYER = {**HF_LAYER, "post_attention_layernorm": "ffn_norm"}  # Llama's pre-MLP norm
# The shape (vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads) is
# required: a config.json without it is broken, and refusing (KeyError) beats serving HF's 7B default.
_BASE = {
    "num_key_value_heads": None,
    "head_dim": None,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
_QWEN = {**_BASE, "num_key_value_heads": 32, "max_position_embeddings": 32768}
DEFAULTS = {
    "llama": _BASE,
    "qwen2": _QWEN,
    "qwen3": {**_QWEN, "head_dim": 128},
    "mistral": {**_BASE, "num_key_value_heads": 8, "max_position_embeddings": 131072},
}


def _refuse(arch: str, what: str) -> ValueError:
    return ValueError(f"{arch} config: {what} is not supported by tailgate")


def _rope(arch: str, cfg: dict) -> dict:
    """`rope_parameters` (transformers 5), or the older `rope_scaling` + top-level `rope_theta`,
    as one dict with rope_type and rope_theta, as HF's standardize_rope_params reads them."""
    p = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    if "rope_type" not in p:
        p["rope_type"] = p.pop("type", "default")
    p.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    if float(p.get("partial_rotary_factor", 1.0)) != 1.0:
        raise _refuse(arch, f"partial_rotary_factor {p['partial_rotary_factor']}")
    return p


def _window(arch: str, rule: str, cfg: dict, n: int) -> tuple[int | None, tuple[bool, ...]]:
    """(sliding window, which layers slide) as HF's model of this family builds its masks."""
    if rule == "every":  # Mistral: every layer, when sliding_window is not null
        w = cfg.get("sliding_window", 4096)
        return (w, (True,) * n) if w else (None, ())
    if rule == "qwen":  # Qwen2/3: only with use_sliding_window, on the layer_types that say so
        w = cfg.get("sliding_window", 4096) if cfg.get("use_sliding_window", False) else None
        if w is None:
            return None, ()
        types = cfg.get("layer_types") or [
            "sliding_attention" if i >= cfg.get("max_window_layers", 28) else "full_attention" for i in range(n)
        ]
        sliding = tuple(t == "sliding_attention" for t in types)
        return (w, sliding) if any(sliding) else (None, ())
    return None, ()  # Llama has no window


def read_llama_like(arch: str, cfg: dict, window_rule: str = "none") -> ModelSpec:
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise _refuse(arch, f"hidden_act {act!r} (supported: silu)")
    cfg = {**DEFAULTS[arch], **cfg}
    hidden, n_heads, n = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    rope = _rope(arch, cfg)
    rtype, scaling, llama3 = rope["rope_type"], 1.0, ()
    if rtype == "linear":
        scaling = float(rope["factor"])
    elif rtype == "llama3":
        missing = [
            k
            for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
            if k not in rope
        ]
        if missing:
            raise ValueError(f"{arch} config: llama3 RoPE without {', '.join(missing)}")
        llama3 = (
            float(rope["factor"]),
            float(rope["low_freq_factor"]),
            float(rope["high_freq_factor"]),
            float(rope["original_max_position_embeddings"]),
        )
    elif rtype != "default":
        raise _refuse(arch, f"rope_type {rtype!r} (supported: default, linear, llama3)")
    window, sliding = _window(arch, window_rule, cfg, n)
    return ModelSpec(
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden=hidden,
        n_layers=n,
        n_heads=n_heads,
        n_kv_heads=cfg["num_key_value_heads"] or n_heads,
        head_dim=cfg["head_dim"] or hidden // n_heads,
        ffn=cfg["intermediate_size"],
        eps=float(cfg["rms_norm_eps"]),
        max_position=cfg["max_position_embeddings"],
        tie_embeddings=bool(cfg["tie_word_embeddings"]),
        rope_theta=float(rope["rope_theta"]),
        rope_scaling_factor=scaling,
        rope_llama3=llama3,
        sliding_window=window,
        layer_sliding=sliding,
    )


def read_llama_like_gguf(arch: str):
    def read(common: dict, g) -> ModelSpec:
        kind = g("rope.scaling.type")
        if kind not in (None, "none", "linear"):
            raise ValueError(f"GGUF {arch}: rope.scaling.type {kind!r} is not supported by tailgate")
        # Llama 3's frequency remap travels as the `rope_freqs` tensor (divisors per frequency),
        # which the forward applies; no metadata says it.
        factor = g("rope.scaling.factor") if kind == "linear" else None
        return ModelSpec(arch=arch, **common, rope_scaling_factor=float(factor or 1.0))

    return read


def _family(name: str, hf_types, gguf_archs=(), window_rule="none", **kw) -> Family:
    return register(
        Family(
            name=name,
            forward="llama_forward",
            hf_types=hf_types,
            hf_layer=LLAMA_LAYER,
            gguf_archs=gguf_archs,
            read_hf=lambda cfg: read_llama_like(name, cfg, window_rule),
            read_gguf=read_llama_like_gguf(name) if gguf_archs else None,
            **kw,
        )
    )


# llama.cpp's Llama (and Mistral, which it converts as arch "llama") permutes q/k for its interleaved
# RoPE; its Qwen models use rotate-half (NEOX) RoPE and are stored as HF has them.
LLAMA = _family(
    "llama",
    ("llama",),
    ("llama",),
    gguf_unpermute=True,
    gguf_top={"token_embd": "embed", "output_norm": "final_norm", "output": "lm_head", "rope_freqs": "rope_freqs"},
)
QWEN2 = _family("qwen2", ("qwen2",), ("qwen2",), window_rule="qwen")
QWEN3 = _family("qwen3", ("qwen3",), ("qwen3",), window_rule="qwen")
MISTRAL = _family("mistral", ("mistral",), window_rule="every")
