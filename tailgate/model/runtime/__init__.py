"""One forward pass a step, and what the engine's executor needs around it: `runner.py`
(`ModelRunner`: owns the weights and KV tensors, turns a list of segments into one pass),
`context.py` (segments -> flat index tensors), `layers.py` and `ops.py` (RMSNorm, RoPE, paged
attention and the elementwise ops the family forwards are written in, on torch or on `kernels/`'
fused C), `kv_cache.py` (the KV tensors), `executor.py` (`ModelExecutor`: runner + sampler +
grammar masks + prompt logprobs for the scheduler), `lane.py` (the CPU side lane), `sampler.py`,
`prompt_scores.py`, `pooling.py` (embeddings) and `serial.py` (the batch-of-one reference the
batched engine is checked against). It takes a model from `formats/`, its matmuls from `kernels/`
and its forward from `families/` (the registry names the module); the engine above sees only the
executor and the runner.
"""
