"""Read an HF checkpoint directory (config.json + *.safetensors + tokenizer files)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from .gemma4_spec import read_gemma4_spec
from .spec import ModelSpec, gemma3_layer_sliding

_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
_COMMON = {
    "self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "o",
    "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm", "input_layernorm": "attn_norm",
    "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down",
}
# Llama's post_attention_layernorm is the pre-MLP norm; Gemma has four norms per layer.
_GEMMA = {"post_attention_layernorm": "post_attn_norm", "pre_feedforward_layernorm": "ffn_norm",
          "post_feedforward_layernorm": "post_ffn_norm"}
_LLAMA = {"post_attention_layernorm": "ffn_norm"}
# Gemma 4 adds a mixture-of-experts block beside the MLP, per-layer inputs and a layer scalar.
_GEMMA4 = {
    **_GEMMA, "post_feedforward_layernorm_1": "post_ffn_norm_1", "post_feedforward_layernorm_2": "post_ffn_norm_2",
    "pre_feedforward_layernorm_2": "ffn_norm_2", "router.proj": "router", "router.scale": "router_scale",
    "router.per_expert_scale": "expert_scale", "experts.gate_up_proj": "experts_gate_up",
    "experts.down_proj": "experts_down", "per_layer_input_gate": "ple_gate", "per_layer_projection": "ple_out",
    "post_per_layer_input_norm": "post_ple_norm", "layer_scalar": "layer_scalar",
}
_GEMMA4_TOP = {"embed_tokens_per_layer": "ple_embed", "per_layer_model_projection": "ple_proj",
               "per_layer_projection_norm": "ple_norm"}
_TOWERS = ("vision_tower", "audio_tower", "embed_vision", "embed_audio", "multi_modal_projector")
_ARCH_TABLE = {"gemma3": {**_COMMON, **_GEMMA}, "gemma4": {**_COMMON, **_GEMMA4}, "llama": {**_COMMON, **_LLAMA}}


def _rope_theta(cfg: dict, kind: str, default: float) -> float:
    params = cfg.get("rope_parameters") or {}
    if kind in params and isinstance(params[kind], dict):
        return float(params[kind].get("rope_theta", default))
    if "rope_theta" in params:
        return float(params["rope_theta"])
    key = "rope_local_base_freq" if kind == "sliding_attention" else "rope_theta"
    return float(cfg.get(key, default))


def read_spec(directory: Path) -> ModelSpec:
    cfg = json.loads((directory / "config.json").read_text())
    mtype = cfg.get("model_type", "")
    if mtype in ("gemma3", "gemma4") and "text_config" in cfg:
        # A multimodal checkpoint: its text model alone is served; the towers' tensors are skipped.
        # HF ties the head from the top-level config of a composite model (the text config's flag
        # only where the top level has none).
        tie = cfg.get("tie_word_embeddings", cfg["text_config"].get("tie_word_embeddings", True))
        cfg = {**cfg["text_config"], "tie_word_embeddings": tie}
        mtype += "_text"
    if mtype == "gemma4_text":
        return read_gemma4_spec(cfg)
    if mtype not in ("gemma3_text", "llama"):
        raise ValueError(f"unsupported model_type {mtype!r} in {directory / 'config.json'}: "
                         "tailgate serves gemma3, gemma4 and llama")
    hidden, n_heads = cfg["hidden_size"], cfg["num_attention_heads"]
    common = dict(
        vocab_size=cfg["vocab_size"], hidden=hidden, n_layers=cfg["num_hidden_layers"], n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads", n_heads), head_dim=cfg.get("head_dim") or hidden // n_heads,
        ffn=cfg["intermediate_size"], eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position=cfg.get("max_position_embeddings", 8192),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", True)),
    )
    if mtype == "gemma3_text":
        n = common["n_layers"]
        types = cfg.get("layer_types")
        sliding = tuple(t == "sliding_attention" for t in types) if types else gemma3_layer_sliding(
            n, cfg.get("sliding_window_pattern", 6))
        scaling = (cfg.get("rope_scaling") or {}).get("factor") or \
            ((cfg.get("rope_parameters") or {}).get("full_attention") or {}).get("factor")
        return ModelSpec(
            arch="gemma3", **common, rope_theta=_rope_theta(cfg, "full_attention", 1e6),
            rope_local_theta=_rope_theta(cfg, "sliding_attention", 1e4),
            sliding_window=cfg.get("sliding_window", 512), layer_sliding=sliding,
            rope_scaling_factor=float(scaling or 1.0),
            query_scale=float(cfg.get("query_pre_attn_scalar", common["head_dim"])) ** -0.5,
            final_softcap=cfg.get("final_logit_softcapping"), attn_softcap=cfg.get("attn_logit_softcapping"),
        )
    if mtype == "llama":
        if cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {}).get("rope_type", "default") != "default":
            raise ValueError("llama checkpoints with RoPE scaling are not supported yet")
        return ModelSpec(arch="llama", **common, rope_theta=_rope_theta(cfg, "default", 10000.0))
    raise ValueError(f"unsupported model_type {mtype!r} in {directory / 'config.json'}: tailgate serves gemma3 and llama")


def internal_name(name: str, spec: ModelSpec) -> str | None:
    base = name.removesuffix(".weight")
    for p in _PREFIXES:
        if base.startswith(p):
            base = base[len(p):]
            break
    if base == "embed_tokens":
        return "embed"
    if base == "norm":
        return "final_norm"
    if base == "lm_head":
        return "lm_head"
    if spec.arch == "gemma4" and base in _GEMMA4_TOP:
        return _GEMMA4_TOP[base]
    if base.startswith("layers."):
        _, idx, rest = base.split(".", 2)
        if spec.kv_source[int(idx)] != int(idx) and rest.startswith(("self_attn.k_", "self_attn.v_")):
            return None  # a KV-sharing layer's own K/V weights are unused (HF ignores them too)
        table = _ARCH_TABLE[spec.arch]
        if rest in table:
            return f"layers.{idx}.{table[rest]}"
    if base.startswith(_TOWERS) or base.startswith("model.vision_tower") or "rotary_emb" in base:
        return None  # multimodal parts and buffers we do not serve
    raise ValueError(f"unknown tensor {name!r} in HF checkpoint")


def read_tensors(directory: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {directory}")
    out = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            key = internal_name(name, spec)
            if key is None:
                continue
            if t.dim() <= 1 or not t.is_floating_point():
                t = t.float()  # vectors (norms, scales) in fp32; matrices stay as stored (bf16 halves the load)
            # HF stores Gemma 3 norm weights as w in x * (1 + w); we keep the multiplier, as GGUF
            # does. Gemma 4's norms already store the multiplier.
            if spec.arch == "gemma3" and key.endswith("norm"):
                t = t + 1.0
            out[key] = t
    if spec.tie_embeddings:
        out.pop("lm_head", None)
    return out


def read_tokenizer_meta(directory: Path, spec: ModelSpec) -> dict:
    tc_path = directory / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text()) if tc_path.exists() else {}
    tok = json.loads((directory / "tokenizer.json").read_text())
    vocab = {a["content"]: a["id"] for a in tok.get("added_tokens", [])}
    model_vocab = tok.get("model", {}).get("vocab", {})

    def tid(tokname):
        if isinstance(tokname, dict):
            tokname = tokname.get("content")
        if tokname is None:
            return None
        if tokname in vocab:
            return vocab[tokname]
        if isinstance(model_vocab, dict):
            return model_vocab.get(tokname)
        return None

    eos_ids = []
    gen = directory / "generation_config.json"
    if gen.exists():
        e = json.loads(gen.read_text()).get("eos_token_id")
        eos_ids = e if isinstance(e, list) else ([e] if e is not None else [])
    if not eos_ids and tid(tc.get("eos_token")) is not None:
        eos_ids = [tid(tc.get("eos_token"))]
    gemma = spec.arch in ("gemma3", "gemma4")
    for end in ("<end_of_turn>", "<turn|>") if gemma else ():  # Gemma 3's and Gemma 4's turn ends
        if tid(end) is not None and tid(end) not in eos_ids:
            eos_ids.append(tid(end))
    template = tc.get("chat_template")
    jinja = directory / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()
    return {
        "bos_id": tid(tc.get("bos_token")),
        "eos_ids": [int(e) for e in eos_ids],
        "add_bos": bool(tc.get("add_bos_token", gemma)),
        "chat_template": template,
        "family": spec.arch,
    }
