"""ModelSpec: the architecture facts the runtime needs, independent of the file format."""
from __future__ import annotations

from dataclasses import dataclass, field

SUPPORTED_ARCHS = ("gemma3", "llama")


@dataclass(frozen=True)
class ModelSpec:
    arch: str  # "gemma3" | "llama"
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    rope_theta: float
    max_position: int
    # Gemma 3 only: sliding layers use their own RoPE base and see `sliding_window` keys.
    rope_local_theta: float | None = None
    sliding_window: int | None = None
    layer_sliding: tuple[bool, ...] = ()
    rope_scaling_factor: float = 1.0  # linear scaling of global-layer positions (Gemma 3 4B+)
    query_scale: float | None = None  # None -> head_dim ** -0.5
    final_softcap: float | None = None
    attn_softcap: float | None = None
    tie_embeddings: bool = True
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported architecture {self.arch!r}; tailgate serves {', '.join(SUPPORTED_ARCHS)}")
        if not self.layer_sliding:
            object.__setattr__(self, "layer_sliding", (False,) * self.n_layers)

    @property
    def scale(self) -> float:
        return self.query_scale if self.query_scale is not None else self.head_dim ** -0.5

    @property
    def has_sliding(self) -> bool:
        return any(self.layer_sliding)

    def family_layers(self, sliding: bool) -> list[int]:
        """Layer indices that keep their KV in the sliding ("local") or global pool."""
        return [i for i, s in enumerate(self.layer_sliding) if s == sliding]


def gemma3_layer_sliding(n_layers: int, pattern: int = 6) -> tuple[bool, ...]:
    """Gemma 3 interleaves `pattern - 1` sliding layers with one global layer."""
    return tuple((i + 1) % pattern != 0 for i in range(n_layers))
