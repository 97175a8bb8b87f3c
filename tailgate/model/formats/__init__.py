"""Model files in: a GGUF file (`gguf_loader.py`: header -> spec, tensors memory-mapped, block
matrices kept as stored), an HF checkpoint directory (`hf_loader.py`), a Hugging Face Hub id
(`hub.py`: the local hub cache first, then a download), and `weights.py`, which resolves `--model`
(short names, files, directories, hub ids) into a loaded model and keeps the on-disk conversion
cache (a GGUF file's tokenizer.json and metadata). This room knows file layouts and names; it asks
`families/` what each family's tensors are called and how its config reads, hands matrices in a
block format to `kernels/blocks.py` untouched, and never runs a step: `runtime/` takes what it
loads.
"""
