"""The model families: the registry (`registry.py`) and, per family, what makes it that family. One
entry per family (`gemma.py`, `llama.py`) says how to read its HF config and GGUF metadata into a
ModelSpec, what its tensors are called in both formats, and which forward runs it; the forwards
(`gemma3_forward.py`, `gemma4_forward.py`, `llama_forward.py`: plain functions over weights and a
step context) and Gemma 4's config reader (`gemma4_spec.py`) live beside their entries, so a family
is one room. The forwards are written in `runtime/`'s layers and ops and imported only when a
model of theirs is run (`Family.forward_fn`), so `formats/` and the tokenizer can read the registry
without torch's step code.

The loaders, the runner and `check --against-hf` ask here; nothing else compares family names.
`ModelSpec.arch` is a family's `name`. Adding a family: docs/models.md, "Adding a family".
"""

from __future__ import annotations

from .registry import (
    BIASED,
    FAMILIES,
    GGUF_LAYER,
    GGUF_TOP,
    HF_LAYER,
    Family,
    for_gguf_arch,  # noqa: F401
    for_hf_config,
    get,
    register,
)

from . import gemma, llama  # noqa: E402,F401  (each module registers its families)
