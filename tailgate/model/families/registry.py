"""The family registry itself (see the package's docstring); the family modules import this,
not the package, so the package can import them without a cycle."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Mapping

from ..spec import ModelSpec

# HF module paths inside `model.layers.N.` -> our names, shared by every family (a family adds its own).
HF_LAYER = {
    "self_attn.q_proj": "q",
    "self_attn.k_proj": "k",
    "self_attn.v_proj": "v",
    "self_attn.o_proj": "o",
    "self_attn.q_norm": "q_norm",
    "self_attn.k_norm": "k_norm",
    "input_layernorm": "attn_norm",
    "mlp.gate_proj": "gate",
    "mlp.up_proj": "up",
    "mlp.down_proj": "down",
}
# GGUF names inside `blk.N.` -> ours (llama.cpp uses one vocabulary for every architecture).
GGUF_LAYER = {
    "attn_norm": "attn_norm",
    "attn_q": "q",
    "attn_k": "k",
    "attn_v": "v",
    "attn_output": "o",
    "attn_q_norm": "q_norm",
    "attn_k_norm": "k_norm",
    "post_attention_norm": "post_attn_norm",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "gate",
    "ffn_up": "up",
    "ffn_down": "down",
    "post_ffw_norm": "post_ffn_norm",
}
GGUF_TOP = {"token_embd": "embed", "output_norm": "final_norm", "output": "lm_head"}
# Matrices whose bias, when a checkpoint has one (Qwen2's q/k/v), rides with them (`.bias` suffix).
BIASED = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class Family:
    name: str  # ModelSpec.arch
    forward: str  # the module under tailgate.model.families whose forward(w, spec, ctx, kv) runs it
    hf_types: tuple[str, ...] = ()  # config.json model_type values of a text model
    hf_composite: tuple[str, ...] = ()  # multimodal model_type values whose text_config is this family
    read_hf: Callable[[dict], ModelSpec] | None = None  # config.json (the text part) -> spec
    hf_layer: Mapping[str, str] = field(default_factory=dict)  # per-layer HF names -> ours
    hf_top: Mapping[str, str] = field(default_factory=dict)  # top-level HF names beyond embed/norm/head
    hf_norm_plus_one: bool = False  # HF stores norm weights as w in x * (1 + w); we keep the multiplier
    gguf_archs: tuple[str, ...] = ()  # general.architecture values
    read_gguf: Callable[[dict, Callable], ModelSpec] | None = None  # (common fields, arch-field getter) -> spec
    gguf_top: Mapping[str, str] = field(default_factory=lambda: dict(GGUF_TOP))
    gguf_unpermute: bool = False  # llama.cpp permuted q/k for its interleaved RoPE; we undo it
    add_bos: bool = False  # when the tokenizer config does not say
    turn_ends: tuple[str, ...] = ()  # chat turn-end tokens that also end generation
    # The chat template a checkpoint without its own gets (tokenizer.FALLBACK_TEMPLATES): "gemma"
    # (Gemma 3's turns), "chatml", or None (no chat: a format neither fits).
    chat_fallback: str | None = "chatml"
    extra_weights: Callable | None = None  # (spec, device) -> runtime tensors the forward reads

    @property
    def forward_fn(self) -> Callable:
        return importlib.import_module(f"tailgate.model.families.{self.forward}").forward


FAMILIES: dict[str, Family] = {}


def register(f: Family) -> Family:
    FAMILIES[f.name] = f
    return f


def get(arch: str) -> Family:
    if arch not in FAMILIES:
        raise ValueError(f"unsupported architecture {arch!r}; tailgate serves {', '.join(FAMILIES)}")
    return FAMILIES[arch]


def _served(attr: str) -> str:
    return ", ".join(t for f in FAMILIES.values() for t in getattr(f, attr))


def for_hf_config(cfg: dict, where: str) -> tuple[Family, dict]:
    """The family of a config.json and the config its reader takes (a multimodal checkpoint's
    text_config, which ties the head from the top level as HF does)."""
    mtype = cfg.get("model_type", "")
    for f in FAMILIES.values():
        if mtype in f.hf_composite and "text_config" in cfg:
            tie = cfg.get("tie_word_embeddings", cfg["text_config"].get("tie_word_embeddings", True))
            return f, {**cfg["text_config"], "tie_word_embeddings": tie}
        if mtype in f.hf_types:
            return f, cfg
    raise ValueError(f"unsupported model_type {mtype!r} in {where}: tailgate serves {_served('hf_types')}")


def for_gguf_arch(arch: str) -> Family:
    for f in FAMILIES.values():
        if arch in f.gguf_archs:
            return f
    raise ValueError(f"unsupported GGUF architecture {arch!r}: tailgate serves {_served('gguf_archs')}")
