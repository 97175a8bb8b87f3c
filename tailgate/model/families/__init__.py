"""The model-family registry: one entry per family says how to read its HF config and GGUF
metadata into a ModelSpec, what its tensors are called in both formats, and which forward runs it.

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
