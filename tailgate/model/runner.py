"""ModelRunner: owns weights and KV tensors; turns a list of Segments into one forward pass."""
from __future__ import annotations

import torch

from ..engine.plan import Segment
from . import gemma3, llama
from .context import build_context
from .kv_cache import KVCache
from .layers import Packed, can_pack
from .spec import ModelSpec

_FORWARD = {"gemma3": gemma3.forward, "llama": llama.forward}


def cpu_has_bf16() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pick_device(device: str | None) -> torch.device:
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """bf16 where it is fast (CUDA, or a CPU with AVX-512 BF16 / AMX: ~3x fp32 matmuls), else fp32."""
    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.type == "cuda" or cpu_has_bf16() else torch.float32
    table = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32,
             "fp16": torch.float16, "float16": torch.float16}
    if dtype not in table:
        raise ValueError(f"--dtype {dtype!r} not recognized (auto | bf16 | fp32 | fp16)")
    return table[dtype]


def prepare_weights(raw: dict[str, torch.Tensor], spec: ModelSpec, dtype, device, pack: bool = True) -> dict:
    """Fuse q/k/v and gate/up into one matmul each, keep matrices [out, in] for F.linear, cast.

    Norm weights stay fp32: the norms run in fp32 (as HF's do) and cast back afterwards.
    bf16 matrices on a CPU are prepacked for oneDNN (`layers.Packed`); fp32 keeps F.linear, the
    path the exactness gates compare against HF.
    """
    w = {}
    cast = lambda t: t.to(device=device, dtype=dtype).contiguous()  # noqa: E731
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        w[p + "qkv"] = cast(torch.cat([raw[p + "q"], raw[p + "k"], raw[p + "v"]], 0))
        w[p + "o"] = cast(raw[p + "o"])
        w[p + "gate_up"] = cast(torch.cat([raw[p + "gate"], raw[p + "up"]], 0))
        w[p + "down"] = cast(raw[p + "down"])
        for n in ("attn_norm", "ffn_norm", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm"):
            if p + n in raw:
                w[p + n] = raw[p + n].to(device=device, dtype=torch.float32)
    w["embed"] = cast(raw["embed"])
    w["head"] = cast(raw["lm_head"]) if "lm_head" in raw else w["embed"]
    w["final_norm"] = raw["final_norm"].to(device=device, dtype=torch.float32)
    if pack and can_pack(dtype, torch.device(device)):
        for k in [k for k in w if k.endswith(("qkv", ".o", "gate_up", "down")) or k == "head"]:
            w[k] = Packed(w[k])
    return w


class ModelRunner:
    def __init__(self, spec: ModelSpec, raw_weights: dict, pages: dict[str, int], dtype=None, device=None):
        if spec.attn_softcap:
            raise ValueError("attention logit soft-capping (Gemma 2) is not supported")
        self.spec = spec
        self.device = pick_device(device) if not isinstance(device, torch.device) else device
        self.dtype = dtype if isinstance(dtype, torch.dtype) else pick_dtype(dtype, self.device)
        self.w = prepare_weights(raw_weights, spec, self.dtype, self.device)
        self.kv = KVCache(spec, pages, self.dtype, self.device)
        self.windows = {"global": None}
        if spec.has_sliding:
            self.windows["local"] = spec.sliding_window
        self._forward = _FORWARD[spec.arch]

    @torch.inference_mode()
    def step(self, segments: list[Segment]) -> torch.Tensor:
        """One forward pass over all segments; logits [sampled rows, vocab] in plan order.

        Logits stay in the runtime dtype: widening 64 x 262k rows to fp32 costs ~19 ms a step;
        greedy argmax is the same either way and the sampler widens only the rows it needs."""
        for s in segments:
            if not s.tokens:
                raise ValueError("empty segment")
            bad = [t for t in s.tokens if not 0 <= t < self.spec.vocab_size]
            if bad:
                raise ValueError(f"token id {bad[0]} outside the vocabulary (0..{self.spec.vocab_size - 1})")
            if s.pages.reserved < s.end:
                raise RuntimeError(f"segment ends at {s.end} but only {s.pages.reserved} tokens have pages")
        ctx = build_context(segments, self.windows, self.device)
        return self._forward(self.w, self.spec, ctx, self.kv)
