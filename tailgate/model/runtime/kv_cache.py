"""KV tensors: one K and one V tensor per family, [layers_in_family, pages*16, kv_heads, head_dim]."""

from __future__ import annotations

import torch

from ...engine.pages import PAGE_SIZE
from ..spec import ModelSpec


def token_bytes(spec: ModelSpec, dtype) -> dict[str, int]:
    """K+V bytes one token takes in each pool, across that family's layers (sizes a KV budget)."""
    size = torch.tensor([], dtype=dtype).element_size()
    out = {}
    for fam, sliding in (("global", False), ("local", True)):
        hkv, d = spec.family_shape(sliding)
        out[fam] = 2 * hkv * d * size * len(spec.family_layers(sliding))
    return out


class KVCache:
    def __init__(self, spec: ModelSpec, pages: dict[str, int], dtype, device):
        self.where: dict[int, tuple[str, int]] = {}
        self.native_tables: dict = {}  # runtime/native_layers.py's layer tables (pointers into these pools)
        self.k: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}
        for fam, sliding in (("global", False), ("local", True)):
            layers = spec.family_layers(sliding)
            if not layers:
                continue
            shape = (len(layers), pages[fam] * PAGE_SIZE, *spec.family_shape(sliding))
            self.k[fam] = torch.zeros(shape, dtype=dtype, device=device)
            self.v[fam] = torch.zeros(shape, dtype=dtype, device=device)
            for j, layer in enumerate(layers):
                self.where[layer] = (fam, j)
        for i, src in enumerate(spec.kv_source):  # a KV-sharing layer reads its source's pool
            self.where[i] = self.where[src]

    def layer(self, i: int) -> tuple[str, torch.Tensor, torch.Tensor]:
        fam, j = self.where[i]
        return fam, self.k[fam][j], self.v[fam][j]
