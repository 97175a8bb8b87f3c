"""ModelSpec: the architecture facts the runtime needs, independent of the file format."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelSpec:
    arch: str  # a registered family's name (`model/families/`)
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
    # Llama 3.x `rope_type: "llama3"`: (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings), HF's frequency remap; () = none.
    rope_llama3: tuple[float, ...] = ()
    query_scale: float | None = None  # None -> head_dim ** -0.5
    final_softcap: float | None = None
    attn_softcap: float | None = None
    tie_embeddings: bool = True
    # Gemma 4: per-layer attention shapes (global layers are wider), the layer whose K/V each
    # layer reads (KV sharing: the last layers reuse an earlier layer's pool and own none),
    # partial rotary ("proportional" RoPE rotates this fraction of each head), k = v on global
    # layers, per-layer inputs and a mixture-of-experts block. Empty tuples mean "as the
    # model-wide value" so Gemma 3 and Llama specs stay as they were.
    layer_head_dim: tuple[int, ...] = ()
    layer_kv_heads: tuple[int, ...] = ()
    kv_source: tuple[int, ...] = ()
    rope_fraction: float = 1.0  # global layers
    rope_local_fraction: float = 1.0
    rope_local_scaling: float = 1.0  # a RoPE factor on sliding layers (Gemma 4's proportional RoPE)
    k_eq_v: bool = False  # global layers take V from the K projection
    ple_dim: int = 0  # hidden_size_per_layer_input; 0 = no per-layer inputs
    moe_experts: int = 0
    moe_top_k: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        # (`arch` is not checked here: every spec is built by its family's own reader, and
        # `families.get` refuses an unregistered one where a spec is used; spec.py imports no
        # family, so the families import it without a cycle, issue 36)
        if not self.layer_sliding:
            object.__setattr__(self, "layer_sliding", (False,) * self.n_layers)
        for name, default in (("layer_head_dim", self.head_dim), ("layer_kv_heads", self.n_kv_heads)):
            if not getattr(self, name):
                object.__setattr__(self, name, (default,) * self.n_layers)
        if not self.kv_source:
            object.__setattr__(self, "kv_source", tuple(range(self.n_layers)))

    @property
    def scale(self) -> float:
        return self.query_scale if self.query_scale is not None else self.head_dim**-0.5

    @property
    def has_sliding(self) -> bool:
        return any(self.layer_sliding)

    def family_layers(self, sliding: bool) -> list[int]:
        """Layer indices that own KV in the sliding ("local") or global pool (a layer that reuses
        another layer's K/V owns none)."""
        return [i for i, s in enumerate(self.layer_sliding) if s == sliding and self.kv_source[i] == i]

    def family_shape(self, sliding: bool) -> tuple[int, int]:
        """(kv heads, head dim) of the family's layers; one pool holds them, so they must agree."""
        shapes = {(self.layer_kv_heads[i], self.layer_head_dim[i]) for i in self.family_layers(sliding)}
        if len(shapes) > 1:
            raise ValueError(f"{'sliding' if sliding else 'global'} layers differ in KV shape {sorted(shapes)}")
        return shapes.pop() if shapes else (self.n_kv_heads, self.head_dim)


def gemma3_layer_sliding(n_layers: int, pattern: int = 6) -> tuple[bool, ...]:
    """Gemma 3 interleaves `pattern - 1` sliding layers with one global layer."""
    return tuple((i + 1) % pattern != 0 for i in range(n_layers))
