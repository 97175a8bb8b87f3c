"""Build a real-shape, random-weight Gemma 4 E2B text checkpoint (bf16 safetensors) with HF's classes.

Usage: nice -n 19 .venv/bin/python scripts/experiments/gemma4_e2b_random.py /tmp/gemma4-e2b-rand

No Gemma 4 weights can be downloaded here. Where each config number comes from:
- HF 5.24's own `Gemma4TextConfig` defaults (transformers/models/gemma4/configuration_gemma4.py,
  whose docstring checkpoint is google/gemma-4-e2b-it): vocab_size 262144, vocab_size_per_layer_input
  262144, hidden_size_per_layer_input 256, head_dim 256, global_head_dim 512 (popped in
  __post_init__), num_attention_heads 8, sliding_window 512, the RoPE parameters (sliding: default,
  theta 1e4; full: proportional, partial_rotary_factor 0.25, theta 1e6), rms_norm_eps 1e-6,
  gelu_pytorch_tanh, tied embeddings, max_position_embeddings 131072, bos/eos/pad 2/1/0.
- HF's other defaults (hidden_size 2304, 30 layers, 4 KV heads, intermediate 9216, a 5:1 layer
  pattern) are *not* E2B's. The E2B values below are those of the published config as summarised
  in docs/models.md's variant table (sources named there: Ollama's GGUF metadata, pegainfer's
  gemma4 config.rs / kv-cache.md, gemma.cpp PR 919): hidden_size 1536, 35 layers, intermediate_size
  6144, 1 KV head, every 5th layer global (4 sliding : 1 full), num_kv_shared_layers 20,
  use_double_wide_mlp, final_logit_softcapping 30. They reproduce that table: this script prints
  4.63 B parameters (2.35 B PLE), and our KV spec gives 6 KiB per token on global layers and
  6 MiB for the full 512-token sliding window.

Weights: built with `Gemma4ForCausalLM` in bf16 (HF's own init: normal, std 0.02, norms 1), then
saved with `save_pretrained` (safetensors). The tokenizer is Gemma 3 270M's (262,144 tokens, the
same vocabulary size), as tests/gemma4_tiny.py uses; the chat template is that file's tiny
Gemma-4-style one. Peak memory: the bf16 model once (~9.3 GB) plus what saving needs.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import torch

E2B = dict(
    hidden_size=1536,
    intermediate_size=6144,
    num_hidden_layers=35,
    num_attention_heads=8,
    num_key_value_heads=1,
    head_dim=256,
    global_head_dim=512,
    sliding_window=512,
    layer_types=["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(35)],
    hidden_size_per_layer_input=256,
    vocab_size_per_layer_input=262_144,
    num_kv_shared_layers=20,
    use_double_wide_mlp=True,
    final_logit_softcapping=30.0,
    vocab_size=262_144,
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    tie_word_embeddings=True,
)


def main(out: Path) -> None:
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    import gemma4_tiny

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cfg = Gemma4TextConfig(**E2B)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    model = Gemma4ForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    n = sum(p.numel() for p in model.parameters())
    ple = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens_per_layer" in name)
    dtypes = {str(p.dtype) for p in model.parameters()}
    print(f"built in {time.time() - t0:.0f} s: {n / 1e9:.2f} B params ({ple / 1e9:.2f} B PLE), {dtypes}", flush=True)
    model.save_pretrained(out)
    print(f"saved in {time.time() - t0:.0f} s", flush=True)
    del model

    from tailgate.model.formats.weights import load_model

    tok = load_model("gemma3-270m", log=lambda m: None).tokenizer._tok
    assert tok.get_vocab_size() == 262_144, tok.get_vocab_size()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {"bos_token": "<bos>", "eos_token": "<eos>", "add_bos_token": True, "chat_template": gemma4_tiny.TEMPLATE}
        )
    )
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"safetensors {size / 2**30:.2f} GiB ({size} bytes); peak RSS {peak:.1f} GiB; {time.time() - t0:.0f} s",
        flush=True,
    )


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/gemma4-e2b-rand"))
