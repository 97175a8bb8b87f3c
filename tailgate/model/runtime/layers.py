"""Building blocks shared by the model files: RMSNorm, RoPE, paged attention."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .context import FamilyView
from ..kernels.native import decode_attention, gather_f16_bf16, kv_write_f16, prompt_attention


def linear(x: torch.Tensor, w, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x @ w.T in `out_dtype` (default x's): a plain tensor goes to F.linear; a `choice.Linear`
    picks its own kernel."""
    if isinstance(w, torch.Tensor):
        y = F.linear(x, w)
        return y if out_dtype is None else y.to(out_dtype)
    return w(x, out_dtype)


def takes(w, rows: int) -> torch.dtype | None:
    """The dtype `w`'s kernel reads at this many rows when that is not the activations' (bf16
    dense weights under fp32 activations), so the op before it can write that dtype directly;
    None for a plain tensor or a kernel that reads the activations as they are."""
    return None if isinstance(w, torch.Tensor) else w.takes(rows)


def raw(x: torch.Tensor, w) -> torch.Tensor:
    """x @ w.T in the kernel's own output dtype (bf16 from bf16 dense weights), for a consumer that
    reads either (the fused norms, norm_rope, the KV write)."""
    return F.linear(x, w) if isinstance(w, torch.Tensor) else w.raw(x)


def glu_mlp(x: torch.Tensor, gate_up, down, act, fused_act: bool = False) -> torch.Tensor:
    """down(act(gate_up(x))), in x's dtype. With `fused_act` (act is our fused GeGLU, which reads
    and writes bf16 as well as fp32) the gate/up product stays in its kernel's own dtype (`raw`),
    so on bf16 dense weights under fp32 activations the step's widest tensors skip a cast each way
    (the same bits: the GeGLU rounds as the cast did)."""
    gu = raw(x, gate_up) if fused_act else linear(x, gate_up)
    return linear(act(gu), down, out_dtype=x.dtype)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in fp32 (as HF does), times the stored multiplier, back to x's dtype."""
    if x.dtype == torch.float32:  # torch's fused kernel: the same bits, one op instead of seven
        return F.rms_norm(x, (x.shape[-1],), w, eps)  # (58 vs 27 us on [16, 4, 256], AMD EPYC)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * w).to(x.dtype)


def rope_tables(
    positions: torch.Tensor,
    head_dim: int,
    theta: float,
    dtype,
    scale: float = 1.0,
    fraction: float = 1.0,
    llama3: tuple = (),
    divisors: torch.Tensor | None = None,
):
    """cos/sin [T, 1, head_dim] for rotate-half RoPE, computed in fp32 then cast, like HF.

    `fraction` < 1 is Gemma 4's "proportional" RoPE: only the first fraction * head_dim / 2
    angles turn (frequencies still spaced over the whole head); the rest get frequency 0
    (cos 1, sin 0), so the same rotate-half kernels apply. `llama3` (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings) remaps the frequencies as HF's
    `_compute_llama3_parameters`; `divisors` (a GGUF's `rope_freqs`, one per frequency) divides
    them as llama.cpp does (the same remap, as the converter wrote it)."""
    angles = int(fraction * head_dim // 2)
    exps = torch.arange(0, 2 * angles, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv = 1.0 / (theta**exps)
    if llama3:
        inv = _llama3_frequencies(inv, *llama3)
    if divisors is not None:
        inv = inv / divisors.float()
    inv = torch.cat([inv, torch.zeros(head_dim // 2 - angles, device=positions.device)])
    freqs = (positions.float() / scale)[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


# rope_rows' tables: per RoPE (its rotation and dtype: `rope_tables`' arguments as given, a GGUF's
# divisors by value), cos and sin of positions 0..N-1, grown ROPE_ROWS_CHUNK positions at a time (only the
# new rows computed) up to ROPE_ROWS_MAX; a step past that computes its own (`rope_tables`). So the
# tables hold at most ROPE_ROWS_MAX x head_dim x 8 bytes per RoPE (16 MiB at Gemma 3's 256; a W-std
# run's 320 positions 2 MiB), entries are per configuration, not per loaded model, and a growth
# step costs one chunk's rows. Two threads (the side lane's worker) racing a growth compute it twice.
_ROPE_ROWS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
ROPE_ROWS_CHUNK = 1024
ROPE_ROWS_MAX = 8192


def _rope_key(v):
    """A rope_tables argument as part of rope_rows' key: a tensor (a GGUF's divisors) by value."""
    return tuple(v.tolist()) if isinstance(v, torch.Tensor) else v


def rope_rows(positions: torch.Tensor, *rope, **named):
    """`rope_tables(positions, *rope, **named)`, read from a table of every position up to the
    largest asked (the same bits: each position's row is computed as `rope_tables` computes it).
    Why: the tables were ~12 torch ops a step, twice for Gemma's two RoPEs, each step anew; a
    one-row step of Llama 3.2 1B's shape spent ~0.18 ms in them (py-spy, AMD EPYC Zen 4) of its
    ~25 ms, and Gemma 3 270M's ~11 ms one-row step about twice that. Now two index ops."""
    top = int(positions.max()) + 1 if positions.numel() else 0
    if top > ROPE_ROWS_MAX:
        return rope_tables(positions, *rope, **named)
    key = (positions.device, *map(_rope_key, rope), *((k, _rope_key(v)) for k, v in sorted(named.items())))
    have = _ROPE_ROWS.get(key)
    n = 0 if have is None else have[0].shape[0]
    if n < top:
        grow = min(ROPE_ROWS_MAX, -(-top // ROPE_ROWS_CHUNK) * ROPE_ROWS_CHUNK)
        cos, sin = rope_tables(torch.arange(n, grow, dtype=torch.int64, device=positions.device), *rope, **named)
        if have is not None:
            cos, sin = torch.cat((have[0], cos)), torch.cat((have[1], sin))
        have = _ROPE_ROWS[key] = (cos, sin)
    return have[0].index_select(0, positions), have[1].index_select(0, positions)


def _llama3_frequencies(
    inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float, old_context_len: float
) -> torch.Tensor:
    """Llama 3.1's frequency remap, HF's `_compute_llama3_parameters` operation for operation (the
    same fp32 bits): long wavelengths slow down by `factor`, short ones stay, those between blend."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def paged_attention(
    q,
    k_new,
    v_new,
    k_pool,
    v_pool,
    view: FamilyView,
    decode_rows,
    scale: float,
    native: bool = False,
    write: bool = True,
    out_dtype: torch.dtype | None = None,
):
    """Write this step's K/V into the pool, then attend each row over its own pages; with
    `native`, the decode rows read the pool in place through csrc/attn.c. `write=False` is a
    KV-sharing layer: the pool and k_new/v_new are its source layer's, already written.
    `out_dtype` (default q's): what the output projection reads (`takes`), so bf16 prompt rows
    are not widened only to be narrowed again.

    q: [T, Hq, D]; k_new/v_new: [T, Hkv, D]; pools: [slots, Hkv, D]. Returns [T, Hq, D].
    Pools may be narrower than q (fp16 KV on the q8 plan): every read of K/V, the fresh prompt's
    own rows included, sees the values as stored, so a prompt attends the same whether it walks
    in chunks (read back from the pool) or arrives whole.
    """
    hkv, d = k_pool.shape[1], k_pool.shape[2]
    # F.embedding is this CPU's fastest row gather (~2x index_select for 8 MB of bf16 rows).
    kflat, vflat = k_pool.view(-1, hkv * d), v_pool.view(-1, hkv * d)
    pd = view.prompt_dtype or q.dtype
    f16 = native and k_pool.dtype == torch.float16  # the q8 plan's pages: our kernels write and read them
    fused_gather = f16 and pd == torch.bfloat16
    if write and f16:  # the cast to fp16 and the scatter in one pass each (csrc/fused.c)
        kv_write_f16(k_pool, view.write_slots, k_new)
        kv_write_f16(v_pool, view.write_slots, v_new)
    elif write:
        k_pool.index_copy_(0, view.write_slots, k_new.to(k_pool.dtype))
        v_pool.index_copy_(0, view.write_slots, v_new.to(v_pool.dtype))
    out = torch.empty(q.shape, dtype=out_dtype or q.dtype, device=q.device)
    for r0, r1, slots, mask, starts, lens in view.prefill:
        own = view.write_slots[r0:r1] if slots is None else slots  # a fresh prompt reads back its own rows
        if starts is not None:  # each row alone through the decode kernel, over its range of the keys
            out[r0:r1] = prompt_attention(q[r0:r1], k_pool, v_pool, own, starts, lens, scale)
            continue
        if fused_gather:  # fp16 pages -> bf16 in one pass (csrc/fused.c)
            k = gather_f16_bf16(k_pool, own).transpose(0, 1).unsqueeze(0)
            v = gather_f16_bf16(v_pool, own).transpose(0, 1).unsqueeze(0)
        elif slots is None:  # fresh prompt: attend over its own new rows (as the pool stores them), causally
            k, v = k_new[r0:r1].to(k_pool.dtype), v_new[r0:r1].to(v_pool.dtype)
            k, v = k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
        else:
            k = F.embedding(slots, kflat).view(-1, hkv, d).transpose(0, 1).unsqueeze(0)  # [1, Hkv, K, D]
            v = F.embedding(slots, vflat).view(-1, hkv, d).transpose(0, 1).unsqueeze(0)
        if k.dtype != pd:
            k, v = k.to(pd), v.to(pd)
        o = F.scaled_dot_product_attention(
            q[r0:r1].to(pd).transpose(0, 1).unsqueeze(0),
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[r0:r1] = o[0].transpose(0, 1)
    d0, d1 = decode_rows
    if d1 > d0 and native and d % 8 == 0:  # the kernel walks head_dim in 8-float vectors
        out[d0:d1] = decode_attention(q[d0:d1], k_pool, v_pool, view.decode_slots, view.decode_lens, scale)
    elif d1 > d0:
        b, width = view.decode_slots.shape
        k = F.embedding(view.decode_slots, kflat).view(b, width, hkv, d).transpose(1, 2).to(q.dtype)
        v = F.embedding(view.decode_slots, vflat).view(b, width, hkv, d).transpose(1, 2).to(q.dtype)
        o = F.scaled_dot_product_attention(
            q[d0:d1].unsqueeze(2), k, v, attn_mask=view.decode_mask, scale=scale, enable_gqa=True
        )
        out[d0:d1] = o.squeeze(2)
    return out
