"""Tiny random checkpoints of the Llama-shaped families (Llama 3.x, Qwen2, Qwen3, Mistral), saved as HF
directories through HF's own classes (fixed seed, fp32) and, for the families llama.cpp converts, as
GGUF files written the way its `convert_hf_to_gguf.py` writes them.

The tokenizer is SmolLM2's byte-level BPE cut to its first 2,048 entries (its 17 special tokens, the
256 byte symbols and the first 1,775 merges: a complete BPE of its own, so the GGUF form converts
its tokenizer in a second rather than SmolLM2's 49k in a minute); each directory carries a small
chat template of its family's shape. Width 64, three layers.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch


VOCAB = 2048  # SmolLM2's tokenizer, cut (`tiny_tokenizer`)
_SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    bos_token_id=0,
    eos_token_id=2,
)
# name -> (HF config class, model class, config, GGUF architecture or None)
FAMILIES = {
    # Llama 3.2's RoPE (theta 500k, llama3 remap with factor 32 over 8192 positions: at head dim 16 the
    # frequencies land in all three bands) and its tied head.
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            _SHAPE,
            tie_word_embeddings=True,
            max_position_embeddings=131_072,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500_000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        "llama",
    ),
    # Qwen2.5: biases on q/k/v, tied head (as 0.5B), theta 1M.
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(_SHAPE, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
        "qwen2",
    ),
    # Qwen3: per-head q/k RMSNorm, head_dim 32 (heads x head_dim = 128, twice the width), untied head.
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            _SHAPE,
            head_dim=32,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        ),
        "qwen3",
    ),
    # Mistral 7B v0.1's shape of attention: every layer slides (a 12-token window here, so the tests'
    # long sequence crosses it); untied head. llama.cpp converts Mistral as arch "llama" and drops the
    # window, so no GGUF form is built for it.
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(
            _SHAPE,
            sliding_window=12,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        ),
        None,
    ),
}
# A small chat template of each family's shape (text markers only: the tokenizer is SmolLM2's).
TEMPLATES = {
    "llama3": "{{ bos_token }}Tiny Llama 3.{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    "qwen2": "<|im_start|>system\nTiny Qwen2.<|im_end|>\n{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "qwen3": "<|im_start|>system\nTiny Qwen3.<|im_end|>\n{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "<think>\n\n</think>\n\n{% endif %}",
    "mistral": "{{ bos_token }}Tiny Mistral.{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} "
    "[/INST]{% else %}{{ m['content'] }}{% endif %}{% endfor %}",
}


def tiny_tokenizer(smollm2_json: Path, out: Path, size: int = VOCAB) -> Path:
    """SmolLM2's tokenizer.json keeping ids below `size`: its merges are in rank order and merge k
    makes id 273 + k from lower ids, so the first merges alone are a whole BPE."""
    t = json.loads(Path(smollm2_json).read_text())
    m = t["model"]
    m["vocab"] = {k: v for k, v in m["vocab"].items() if v < size}
    first = min(v for k, v in m["vocab"].items() if k not in {a["content"] for a in t["added_tokens"]})
    m["merges"] = m["merges"][: size - first - 256]
    assert all("".join(mg) in m["vocab"] for mg in m["merges"]) and len(m["vocab"]) == size
    out.write_text(json.dumps(t))
    return out


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every weight off HF's init (norms and biases to U(0.6, 1.4), matrices to N(0, 2 / sqrt(in))):
    a missed or misplaced one shows in the logits, and at this scale a random model's greedy tokens
    vary (at gemma4_tiny's 0.5 Llama 3 and Qwen2 repeat one token 16 times)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, t in model.named_parameters():
            if t.dim() <= 1:
                t.copy_(0.6 + 0.8 * torch.rand(t.shape, generator=g))
            else:
                t.copy_(torch.randn(t.shape, generator=g) * (2.0 / t.shape[-1] ** 0.5))


def build(directory: Path, name: str, tokenizer_json: Path, seed: int = 0) -> Path:
    """Save family `name` with random weights (every weight moved off HF's init, biases and norms
    included), SmolLM2's tokenizer and the family's template; return the directory."""
    import transformers

    cfg_cls, model_cls, config, _ = FAMILIES[name]
    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**config))
    _randomise(model, seed)
    model.to(torch.float32).save_pretrained(directory)
    (directory / "tokenizer.json").write_bytes(Path(tokenizer_json).read_bytes())
    bos = name in ("llama3", "mistral")  # Llama and Mistral tokenizers add BOS; Qwen's do not
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|endoftext|>" if bos else None,
                "eos_token": "<|im_end|>",
                "add_bos_token": bos,
                "chat_template": TEMPLATES[name],
            }
        )
    )
    return directory


# convert_hf_to_gguf.py's names (written out here, not taken from tailgate's tables).
_GGUF_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GGUF_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: rotate-half q/k rows -> its interleaved RoPE pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_rope_factors(cfg: dict) -> np.ndarray:
    """convert_hf_to_gguf.py's `rope_freqs` for rope_type llama3: the divisor of each frequency."""
    p = cfg["rope_parameters"]
    dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    freqs = 1.0 / (p["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high, old = (
        p["factor"],
        p["low_freq_factor"],
        p["high_freq_factor"],
        p["original_max_position_embeddings"],
    )
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def to_gguf(hf_dir: Path, out: Path, arch: str) -> Path:
    """Write the directory's fp32 weights as an F32 GGUF of `arch`, with its tokenizer as GGUF
    metadata (a "gpt2" BPE: tokens, types, merges) and its BOS/EOS."""
    import gguf
    from safetensors.torch import load_file

    cfg = json.loads((hf_dir / "config.json").read_text())
    n_head, n_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // n_head
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tc = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {a["id"] for a in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list([k for k, _ in vocab])
    w.add_token_types([3 if i in special else 1 for _, i in vocab])  # control / normal
    w.add_token_merges([" ".join(mg) for mg in tok["model"]["merges"]])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(bool(tc["add_bos_token"]))
    w.add_chat_template(tc["chat_template"])
    tensors = {}
    for name, t in load_file(str(hf_dir / "model.safetensors")).items():
        base, _, kind = name.rpartition(".")
        a = t.float().numpy()
        if base.startswith("model.layers."):
            _, _, idx, rest = base.split(".", 3)
            gname = f"blk.{idx}.{_GGUF_LAYER[rest]}.{kind}"
            if arch == "llama" and rest in ("self_attn.q_proj", "self_attn.k_proj"):
                a = _permute(a, n_head if rest == "self_attn.q_proj" else n_kv)
        else:
            gname = f"{_GGUF_TOP[base]}.{kind}"
        tensors[gname] = a
    if cfg["rope_parameters"].get("rope_type") == "llama3":
        tensors["rope_freqs.weight"] = _llama3_rope_factors(cfg)
    for gname, a in tensors.items():
        w.add_tensor(gname, np.ascontiguousarray(a, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
