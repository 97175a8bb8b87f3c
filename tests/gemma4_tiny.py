"""Tiny Gemma 4 text checkpoints with random weights, saved as HF directories.

No Gemma 4 weights can be downloaded here, so the gates build small configurations that together
switch on everything the loader supports, initialise them with a fixed seed through HF's own
classes, and save them with the Gemma tokenizer and a Gemma-4-style chat template. The vocabulary
is the tokenizer's (262,144 rows), the rest is a few layers of width 64.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# Both layer types with their own head dims and RoPE, per-layer inputs, KV sharing (the last two
# layers read layers 2 and 3), k = v on global layers, the double-wide MLP on sharing layers, MoE
# beside every MLP, final soft-capping, and a 12-token sliding window so test prompts cross it.
EVERYTHING = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=32,
    global_head_dim=64,
    num_global_key_value_heads=1,
    attention_k_eq_v=True,
    layer_types=[
        "sliding_attention",
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ],
    sliding_window=12,
    hidden_size_per_layer_input=8,
    num_kv_shared_layers=2,
    use_double_wide_mlp=True,
    enable_moe_block=True,
    num_experts=4,
    top_k_experts=2,
    moe_intermediate_size=32,
    final_logit_softcapping=30.0,
)
# A dense model without the small-model switches (the 31B's shape in miniature): separate V,
# no per-layer inputs, no sharing, no MoE, a RoPE factor and a half-rotary global RoPE.
DENSE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    sliding_window=12,
    hidden_size_per_layer_input=0,
    attention_k_eq_v=False,
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.5,
            "rope_theta": 1_000_000.0,
            "factor": 2.0,
        },
    },
)
TEMPLATE = (
    "{{ bos_token }}A tiny Gemma 4.\n{% for m in messages %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """HF initialises norms to 1 and scalars to 1; move every weight off its default so a missed
    or misplaced one shows in the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if not t.is_floating_point() or "inv_freq" in name or "embed_scale" in name:
                continue
            if t.dim() <= 1:
                t.copy_(0.6 + 0.8 * torch.rand(t.shape, generator=g))
            else:
                t.copy_(torch.randn(t.shape, generator=g) * (0.5 / t.shape[-1] ** 0.5))


def build(
    directory: Path, tokenizer_json: Path, seed: int = 0, multimodal: bool = False, dtype=torch.float32, **config
) -> Path:
    """Save a random-weight Gemma 4 text model (or, with `multimodal`, a full Gemma 4 model with
    tiny vision and audio towers) with a tokenizer and template, its weights stored in `dtype`
    (bf16: as Google publishes them); return the directory."""
    from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    text = Gemma4TextConfig(
        vocab_size=262_144, vocab_size_per_layer_input=262_144, bos_token_id=2, eos_token_id=1, pad_token_id=0, **config
    )
    if multimodal:
        cfg = Gemma4Config(
            text_config=text.to_dict(),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=16,
            ),
            audio_config=dict(
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                output_proj_dims=32,
                subsampling_conv_channels=[8, 8],
            ),
        )
        model = Gemma4ForConditionalGeneration(cfg)
    else:
        model = Gemma4ForCausalLM(text)
    _randomise(model, seed)
    model.to(dtype).save_pretrained(directory)
    (directory / "tokenizer.json").write_bytes(Path(tokenizer_json).read_bytes())
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": True, "chat_template": TEMPLATE})
    )
    return directory
