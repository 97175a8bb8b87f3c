"""Weights, tokenizer, model modules, KV tensors and the step runner (everything that touches torch)."""
