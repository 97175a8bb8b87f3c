"""Read an HF checkpoint directory (config.json + *.safetensors + tokenizer files)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from .. import families
from ..progress import bar
from ..spec import ModelSpec

_PREFIXES = ("model.language_model.", "language_model.model.", "language_model.", "model.")
_TOWERS = ("vision_tower", "audio_tower", "embed_vision", "embed_audio", "multi_modal_projector")


def read_spec(directory: Path) -> ModelSpec:
    """config.json -> spec, through the family registry (`model/families/`); a config the family
    cannot run raises ValueError naming the switch, before any weights load."""
    where = directory / "config.json"
    family, cfg = families.for_hf_config(json.loads(where.read_text()), str(where))
    return family.read_hf(cfg)


def internal_name(name: str, spec: ModelSpec) -> str | None:
    family = families.get(spec.arch)
    bias = name.endswith(".bias")
    base = name.removesuffix(".bias") if bias else name.removesuffix(".weight")
    for p in _PREFIXES:
        if base.startswith(p):
            base = base[len(p) :]
            break
    top = {"embed_tokens": "embed", "norm": "final_norm", "lm_head": "lm_head", **family.hf_top}
    if base in top and not bias:
        return top[base]
    if base.startswith("layers."):
        _, idx, rest = base.split(".", 2)
        if spec.kv_source[int(idx)] != int(idx) and rest.startswith(("self_attn.k_", "self_attn.v_")):
            return None  # a KV-sharing layer's own K/V weights are unused (HF ignores them too)
        ours = family.hf_layer.get(rest)
        if ours is not None and not bias:
            return f"layers.{idx}.{ours}"
        if ours in families.BIASED:  # a projection's bias (Qwen2's q/k/v): fused with it at prepare time
            return f"layers.{idx}.{ours}.bias"
    if base.startswith(_TOWERS) or base.startswith("model.vision_tower") or "rotary_emb" in base:
        return None  # multimodal parts and buffers we do not serve
    raise ValueError(f"unknown tensor {name!r} in HF checkpoint")


def read_tensors(directory: Path, spec: ModelSpec) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors in {directory}")
    out = {}
    plus_one = families.get(spec.arch).hf_norm_plus_one
    shards = bar(files, desc="load shards", unit="shard", disable=len(files) < 2)
    for f in shards:
        for name, t in load_file(str(f)).items():
            key = internal_name(name, spec)
            if key is None:
                continue
            if t.dim() <= 1 or not t.is_floating_point():
                t = t.float()  # vectors (norms, scales) in fp32; matrices stay as stored (bf16 halves the load)
            # HF stores Gemma 3 norm weights as w in x * (1 + w); we keep the multiplier, as GGUF
            # does. Gemma 4's (and Qwen3's q/k) norms already store the multiplier.
            if plus_one and key.endswith("norm"):
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
    family = families.get(spec.arch)
    for end in family.turn_ends:  # e.g. Gemma's <end_of_turn>: HF's generation_config lists it as EOS
        if tid(end) is not None and tid(end) not in eos_ids:
            eos_ids.append(tid(end))
    jinja = directory / "chat_template.jinja"  # HF reads it first: it wins over tokenizer_config.json's
    template = jinja.read_text(encoding="utf-8") if jinja.exists() else tc.get("chat_template")
    return {
        "bos_id": tid(tc.get("bos_token")),
        "eos_ids": [int(e) for e in eos_ids],
        "add_bos": bool(tc.get("add_bos_token", family.add_bos)),
        "chat_template": template,
        "family": spec.arch,
    }


# generation_config.json's sampling keys, read as request defaults (vLLM's `--generation-config
# auto`, its default): a model creator's recommended temperature and cut-offs.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(source) -> dict:
    """The sampling defaults an HF directory's generation_config.json recommends ({} for a GGUF
    file, a directory without one, or `do_sample: false`, which asks for nothing but greedy)."""
    gen = Path(source) / "generation_config.json"
    if not gen.is_file():
        return {}
    try:
        cfg = json.loads(gen.read_text())
    except (OSError, ValueError):
        return {}
    if cfg.get("do_sample") is False:
        return {}
    return {k: cfg[k] for k in SAMPLING_KEYS if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg[k], bool)}
