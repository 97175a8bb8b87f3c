"""Weights, tokenizer, model code, KV tensors and the step runner (everything that touches torch), in
four rooms: `formats/` (GGUF, HF and hub files in, `--model` resolution, the on-disk cache),
`kernels/` (the C sources, the per-machine kernel plan, the start-up probe), `families/` (the family
registry and each family's config reader and forward) and `runtime/` (the runner, executor, KV
tensors, side lane, sampler). What stays here is read by more than one room, or by the server
beside them: `spec.py` (the architecture facts every room shares), `tokenizer.py` (the loaders
build it, the server and the grammar engine read it), `constraint.py` (grammar masks: compiled by
the server, applied by the executor), `progress.py` (the start-up bars both loaders and the runner
draw) and `check.py` (`tailgate check --against-hf`, which drives a loader, the runner and HF
transformers together). Dependencies point one way per module: `formats` and `runtime` read
`kernels` and `families`, the family forwards read `runtime`'s layers, and `kernels` reads no other
room except where the probe times a step (the runner is handed to it) and keys its cache under
the formats' cache root.
"""
