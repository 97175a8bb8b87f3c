"""ModelRunner: owns weights and KV tensors; turns a list of Segments into one forward pass."""

from __future__ import annotations


import torch

from ...engine.plan import Segment
from .. import families
from ..progress import bar
from ..kernels import native
from ..kernels.blocks import Blocks, PanelRows, Panels
from .context import build_context
from .kv_cache import KVCache
from ..kernels.choice import BiasedLinear, KernelPlan, Linear, choose
from ..spec import ModelSpec


def _fused_bias(raw: dict[str, torch.Tensor], parts: list[str]) -> torch.Tensor | None:
    """The biases of matrices fused into one (zeros for a part without one); None when none has one."""
    if not any(n + ".bias" in raw for n in parts):
        return None
    return torch.cat([raw[n + ".bias"].float() if n + ".bias" in raw else torch.zeros(raw[n].shape[0]) for n in parts])


def prepare_weights(raw: dict[str, torch.Tensor], spec: ModelSpec, plan: KernelPlan) -> dict:
    """Fuse q/k/v and gate/up into one matmul each, keep matrices [out, in] for F.linear, cast.

    Vectors (norm weights, scales) stay fp32: the norms run in fp32 (as HF's do) and cast back
    afterwards. Every layer matrix and the head becomes a `choice.Linear` holding the kernels
    the plan chose (prepacked oneDNN, F.linear, and for small steps a weight-only int8 copy);
    other matrices (Gemma 4's per-layer inputs, router, experts) are plain tensors.
    A KV-sharing Gemma 4 layer has no K/V weights and a k = v layer no V: the fused qkv holds
    what the layer has, and the model file knows where each part starts.
    A matrix with a bias (`<name>.bias`: Qwen2's q/k/v) becomes a `choice.BiasedLinear`, the
    fused ones with their parts' biases concatenated; the others stay plain `Linear`s.
    """
    dtype, device = plan.dtype, torch.device(plan.device)
    w = {}
    stored = plan.quant == "gguf"  # GGUF blocks stay as stored; any other plan widens them here

    def cast(t):  # a widened block matrix takes the plan's dtype like any other (bf16 plans included)
        if isinstance(t, Blocks):
            if stored:
                return t
            t = t.dequantize()
        return t.to(device=device, dtype=dtype).contiguous()

    def fuse(names):
        if stored and all(isinstance(raw[n], Blocks) for n in names):
            return [raw[n] for n in names]  # one block matmul over parts that may differ in format
        return cast(torch.cat([raw[n].dequantize() if isinstance(raw[n], Blocks) else raw[n] for n in names], 0))

    fused = set()
    biases = {}
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        parts = [p + n for n in ("q", "k", "v") if p + n in raw]
        w[p + "qkv"] = fuse(parts)
        w[p + "gate_up"] = fuse([p + "gate", p + "up"])
        for name, group in ((p + "qkv", parts), (p + "gate_up", [p + "gate", p + "up"])):
            biases[name] = _fused_bias(raw, group)
            fused.update(group + [n + ".bias" for n in group])
    for k, t in raw.items():
        if k in fused or k == "lm_head":
            continue
        if k.endswith(".bias"):  # an unfused matrix's bias (o, down): with its Linear below
            biases[k.removesuffix(".bias")] = t.float()
            continue
        if k == "ple_embed" and t.element_size() < torch.empty(0, dtype=dtype).element_size():
            # Gemma 4's per-layer embedding table is only gathered from (2.35 B values on E2B):
            # kept as stored, its rows widen at the gather (the same values as widening it all).
            w[k] = t.to(device=device).contiguous()
            continue
        if k.endswith(("experts_gate_up", "experts_down")):  # MoE experts: most of a 26B-A4B's weights
            w[k] = t.to(device=device, dtype=plan.dense_dtype or dtype).contiguous()
            continue
        w[k] = t.to(device=device, dtype=torch.float32) if t.dim() <= 1 else cast(t)
    w["head"] = cast(raw["lm_head"]) if "lm_head" in raw else w["embed"]
    family = families.get(spec.arch)
    if family.extra_weights is not None:  # e.g. Gemma 4's unit weights for its scale-free norms
        w.update(family.extra_weights(spec, device))
    mats = [k for k in w if k.rpartition(".")[2] in ("qkv", "o", "gate_up", "down") or k == "head"]
    for k in bar(mats, desc="prepare kernels", unit="matrix", disable=len(mats) < 64, mininterval=2):
        group = "head" if k == "head" else "layers"
        b = biases.get(k)
        w[k] = Linear(w[k], plan, group) if b is None else BiasedLinear(w[k], plan, group, b.to(device))
    head = w["head"]
    if (
        stored
        and "lm_head" not in raw
        and isinstance(w.get("embed"), Blocks)
        and head.wide is not None
        and isinstance(head.wide, Panels)
        and head.wide.as_stored
        and head.wide[2] in PanelRows.CODES
    ):
        # A tied table whose head panels hold it as stored: lookups read them, not the file again.
        w["embed"] = PanelRows(head.wide)
    return w


def resident_bytes(w: dict) -> dict[str, int]:
    """Bytes of the runtime's weights by form: what the kernels hold (`Linear.nbytes`: blocks,
    panels, dense copies) and the other tensors; an embedding kept as GGUF blocks (only looked-up
    rows are read) is counted apart as `mapped`; one read from the head's panels (`PanelRows`) adds
    nothing."""
    out = {"kernels": 0, "tensors": 0, "mapped": 0}
    for k, t in w.items():
        if isinstance(t, Linear):
            out["kernels"] += t.nbytes()
        elif isinstance(t, Blocks):
            out["mapped"] += t.nbytes
        elif isinstance(t, torch.Tensor) and not (
            k == "embed" and w.get("head") is not None and getattr(w["head"], "w", None) is t
        ):
            out["tensors"] += t.numel() * t.element_size()
    return out


class _Tap:
    """Stands in for the head (`layers.linear` calls it): keeps the normed hidden rows it is given
    and returns one zero logit a row, so what a family does after the head (a soft-cap) still runs."""

    h: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor, out_dtype=None) -> torch.Tensor:
        self.h = x
        return x.new_zeros(x.shape[0], 1)


class ModelRunner:
    def __init__(
        self,
        spec: ModelSpec,
        raw_weights: dict,
        pages: dict[str, int] | None,
        dtype=None,
        device=None,
        kernels: str | None = None,
        plan: KernelPlan | None = None,
    ):
        if spec.attn_softcap:
            raise ValueError("attention logit soft-capping (Gemma 2) is not supported")
        self.spec = spec
        self.plan = plan or choose(dtype, kernels, device)
        self.device, self.dtype = torch.device(self.plan.device), self.plan.dtype
        self.w = prepare_weights(raw_weights, spec, self.plan)
        self.kv: KVCache | None = None
        if pages is not None:  # None: `hold_kv` later, once the KV is sized beside these weights (assemble)
            self.hold_kv(pages)
        self.windows = {"global": None}
        if spec.has_sliding:
            self.windows["local"] = spec.sliding_window
        self._forward = families.get(spec.arch).forward_fn
        # the kernel walks head_dim in 8-float vectors; a plan without it keeps SDPA (masks built)
        self.native_prompts = self.plan.native_prompts and all(d % 8 == 0 for d in spec.layer_head_dim)

    @torch.inference_mode()
    def step(self, segments: list[Segment]) -> torch.Tensor:
        """One forward pass over all segments; logits [sampled rows, vocab] in plan order.

        Logits stay in the runtime dtype: widening 64 x 262k rows to fp32 costs ~19 ms a step;
        greedy argmax is the same either way and the sampler widens only the rows it needs."""
        return self._run(self.w, segments)

    @torch.inference_mode()
    def hidden(self, segments: list[Segment]) -> torch.Tensor:
        """The final hidden state (after the final norm) of each sampled segment's last row,
        [sampled rows, hidden] in the runtime dtype: `step`'s forward pass with the head swapped
        for a tap, so no logits are computed (embeddings' last-token pooling, server/embeddings.py).
        The weights dict is copied, not edited: a side-lane prefill may be reading it."""
        tap = _Tap()
        self._run({**self.w, "head": tap}, segments)
        return tap.h

    def _run(self, w: dict, segments: list[Segment]):
        """The family's forward pass over `segments` with weights `w`, the step's long prompt rows
        told to the AMX kernels (native.step_tile_rows)."""
        ctx = self._context(segments)
        with native.step_tile_rows(ctx.tile_rows):
            return self._forward(w, self.spec, ctx, self.kv)

    def hold_kv(self, pages: dict[str, int]) -> None:
        """Allocate the KV cache: `pages` per pool (engine/pages.py pool_pages or budget_pool_pages)."""
        self.kv = KVCache(self.spec, pages, self.plan.kv, self.device)

    def _context(self, segments: list[Segment]):
        for s in segments:
            if not s.tokens:
                raise ValueError("empty segment")
            bad = [t for t in s.tokens if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} outside the vocabulary (0..{self.spec.vocab_size - 1})")
            if s.pages.reserved < s.end:
                raise RuntimeError(f"segment ends at {s.end} but only {s.pages.reserved} tokens have pages")
        return build_context(
            segments,
            self.windows,
            self.device,
            self.plan.native,
            self.plan.prompt_attention,
            self.plan.dtype,
            self.native_prompts,
        )

    def warm_up(self, book, rows: int = 64) -> float:
        """Run one prefill and one decode step through scratch pages, so the first requests do not
        pay the libraries' one-time setup (oneDNN primitives on CPU; cuBLAS handles and lazily
        loaded kernels on CUDA: the first 16 requests on an H200 took 8.8 s without it, 4.95 s
        after). Returns the seconds spent; the pages go back before it returns."""
        import time

        from ...engine.pages import SeqPages

        t0 = time.perf_counter()
        seq = SeqPages()
        try:
            if not book.reserve(seq, rows + 1):
                return 0.0
            self.step([Segment([1] * rows, 0, seq)])
            self.step([Segment([1], rows, seq)])
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        finally:
            book.free(seq)
        return time.perf_counter() - t0
