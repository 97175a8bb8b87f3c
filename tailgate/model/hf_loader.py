"""Read an HF checkpoint directory (config.json + *.safetensors + tokenizer files)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

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
    if mtype == "gemma3" and "text_config" in cfg:
        cfg = {**cfg["text_config"], "tie_word_embeddings": cfg.get("tie_word_embeddings", True)}
        mtype = "gemma3_text"
    if mtype not in ("gemma3_text", "llama"):
        raise ValueError(f"unsupported model_type {mtype!r} in {directory / 'config.json'}: tailgate serves gemma3 and llama")
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


def internal_name(name: str, arch: str) -> str | None:
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
    if base.startswith("layers."):
        _, idx, rest = base.split(".", 2)
        table = {**_COMMON, **(_GEMMA if arch == "gemma3" else _LLAMA)}
        if rest in table:
            return f"layers.{idx}.{table[rest]}"
    if base.startswith(("vision_tower", "multi_modal_projector", "model.vision_tower")) or "rotary_emb" in base:
        return None  # multimodal parts and buffers we do not serve
    raise ValueError(f"unknown tensor {name!r} in HF checkpoint")


def read_tensors(directory: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {directory}")
    out = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            key = internal_name(name, spec.arch)
            if key is None:
                continue
            t = t.float()
            # HF stores Gemma norm weights as w in x * (1 + w); we keep the multiplier, as GGUF does.
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
    if spec.arch == "gemma3" and tid("<end_of_turn>") is not None and tid("<end_of_turn>") not in eos_ids:
        eos_ids.append(tid("<end_of_turn>"))
    template = tc.get("chat_template")
    jinja = directory / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()
    return {
        "bos_id": tid(tc.get("bos_token")),
        "eos_ids": [int(e) for e in eos_ids],
        "add_bos": bool(tc.get("add_bos_token", spec.arch == "gemma3")),
        "chat_template": template,
        "family": spec.arch,
    }
