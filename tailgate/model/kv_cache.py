"""KV tensors: one K and one V tensor per family, [layers_in_family, pages*16, kv_heads, head_dim]."""
from __future__ import annotations

import torch

from ..engine.pages import PAGE_SIZE
from .spec import ModelSpec


def token_bytes(spec: ModelSpec, dtype) -> dict[str, int]:
    """K+V bytes one token takes in each pool, across that family's layers (sizes a KV budget)."""
    per_layer = 2 * spec.n_kv_heads * spec.head_dim * torch.tensor([], dtype=dtype).element_size()
    return {"global": per_layer * len(spec.family_layers(False)), "local": per_layer * len(spec.family_layers(True))}


class KVCache:
    def __init__(self, spec: ModelSpec, pages: dict[str, int], dtype, device):
        self.where: dict[int, tuple[str, int]] = {}
        self.k: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}
        for fam, sliding in (("global", False), ("local", True)):
            layers = spec.family_layers(sliding)
            if not layers:
                continue
            shape = (len(layers), pages[fam] * PAGE_SIZE, spec.n_kv_heads, spec.head_dim)
            self.k[fam] = torch.zeros(shape, dtype=dtype, device=device)
            self.v[fam] = torch.zeros(shape, dtype=dtype, device=device)
            for j, layer in enumerate(layers):
                self.where[layer] = (fam, j)

    def layer(self, i: int) -> tuple[str, torch.Tensor, torch.Tensor]:
        fam, j = self.where[i]
        return fam, self.k[fam][j], self.v[fam][j]
