"""StepContext: a step plan turned into flat index tensors, built once and read by every layer.

Row order: prefill segments first (in plan order), then all one-token rows batched together, so
attention runs one call per prefill segment (the native kernel over each row's key range, or SDPA
with a mask) plus one for the whole decode batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from ...engine.pages import PAGE_SIZE
from ...engine.plan import Segment
from ..kernels.native import TILE_ROWS_4BIT, TILE_ROWS_INT8


class PromptKeys(NamedTuple):
    """One prompt segment's keys in one KV family: its rows [r0, r1) of the step, and the key slots
    [K] in position order (None for a fresh prompt within the window: its keys are the step's own
    rows, `write_slots[r0:r1]`). For SDPA an additive mask [Tq, K] (0 / -inf, in the dtype the
    prompt attends in: SDPA would build that from a bool mask on every call, 18 a step, ~25 us each
    for a 64 x 192 chunk on the Xeon), None when plainly causal; for the native kernel each row's
    range of the slots instead (`starts`, `lens` [Tq] int64)."""

    r0: int
    r1: int
    slots: torch.Tensor | None
    mask: torch.Tensor | None = None
    starts: torch.Tensor | None = None
    lens: torch.Tensor | None = None


@dataclass
class FamilyView:
    """Where this step's keys live for one KV family (global or sliding)."""

    write_slots: torch.Tensor  # [T] flat slot (page*16+offset) each new row's K/V goes to
    prefill: list[PromptKeys] = field(default_factory=list)
    decode_slots: torch.Tensor | None = None  # [B, K]
    decode_mask: torch.Tensor | None = None  # [B, 1, 1, K]
    decode_lens: torch.Tensor | None = None  # [B] int64: row b's keys are decode_slots[b, :len]
    prompt_dtype: torch.dtype | None = None  # prompt rows' SDPA runs in this dtype (else q's)


@dataclass
class StepContext:
    tokens: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    sample_rows: torch.Tensor  # [S] in plan order of sampled segments
    decode_rows: tuple[int, int]  # rows [d0, d1) are the batched one-token rows
    families: dict[str, FamilyView]
    native: bool = False  # fp32 CPU step on our kernels: decode attention (csrc/attn.c), fused ops (fused.c)
    # The leading rows that run on AMX BF16 tiles in the int8 / the 4-bit panels' matrices: the rows
    # of the prompt segments at least native.TILE_ROWS_INT8 / _4BIT long, which come first.
    tile_rows: tuple[int, int] = (0, 0)


def _tile_class(rows: int) -> int:
    """0: a segment long enough for the BF16 tiles in every AMX form; 1: in the 4-bit panels only; 2: none."""
    return 0 if rows >= TILE_ROWS_INT8 else 1 if rows >= TILE_ROWS_4BIT else 2


def _slots(table: list[int], pos: np.ndarray) -> np.ndarray:
    pt = np.asarray(table, dtype=np.int64)
    return pt[pos // PAGE_SIZE] * PAGE_SIZE + pos % PAGE_SIZE


def _key_start(qpos: int, window: int | None) -> int:
    return 0 if window is None else max(0, qpos - window + 1)


def _additive(mask: np.ndarray, dtype: torch.dtype, device) -> torch.Tensor:
    masked = torch.from_numpy(np.ascontiguousarray(~mask)).to(device)
    return torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(masked, float("-inf"))


def build_context(
    segments: list[Segment],
    windows: dict[str, int | None],
    device,
    native: bool = False,
    prompt_dtype: torch.dtype | None = None,
    dtype: torch.dtype = torch.float32,
    native_prompts: bool = False,
) -> StepContext:
    """`windows` maps family name ("global", "local") to its attention window (None = full);
    `dtype`: the activations'; `prompt_dtype`: the dtype prompt rows attend in through SDPA, when
    not the activations' (`KernelPlan`); `native_prompts`: prompt rows attend through the native
    kernel (each row's key range, no mask)."""
    # Long prompt segments first (stable): the AMX kernels take a step's leading rows on BF16 tiles,
    # and a segment's own length decides whether its rows are among them (native.TILE_ROWS_*).
    prefill = sorted((s for s in segments if len(s.tokens) > 1), key=lambda s: _tile_class(len(s.tokens)))
    prompt_lens = [len(s.tokens) for s in prefill]
    decode = [s for s in segments if len(s.tokens) == 1]
    ordered = prefill + decode
    toks, pos, rows = [], [], {}
    r = 0
    for s in ordered:
        toks.extend(s.tokens)
        pos.append(np.arange(s.start, s.end, dtype=np.int64))
        rows[id(s)] = (r, r + len(s.tokens))
        r += len(s.tokens)
    positions = np.concatenate(pos) if pos else np.zeros(0, dtype=np.int64)
    d0 = r - len(decode)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
    fams = {}
    for fam, window in windows.items():
        table = (lambda s: s.pages.global_pages) if fam == "global" else (lambda s: s.pages.local_pages)
        write = np.concatenate([_slots(table(s), np.arange(s.start, s.end)) for s in ordered]) if ordered else positions
        view = FamilyView(write_slots=t(write), prompt_dtype=prompt_dtype)
        for s in prefill:
            r0, r1 = rows[id(s)]
            fresh = s.start == 0 and (window is None or len(s.tokens) <= window)
            # A fresh prompt within the window: its keys are this step's own rows and the mask is
            # plain causal, so attention skips the gather and the explicit mask.
            k0 = 0 if fresh else _key_start(s.start, window)
            kpos = np.arange(k0, s.end)
            slots = None if fresh else t(_slots(table(s), kpos))
            qpos = np.arange(s.start, s.end)
            if native_prompts:  # row i sees keys [max(k0, q - window + 1), q]: a range of the slots
                lo = np.maximum(qpos - (window or s.end) + 1, k0) - k0
                lens = qpos - k0 + 1 - lo
                view.prefill.append(PromptKeys(r0, r1, slots, None, t(lo), t(lens)))
            elif fresh:
                view.prefill.append(PromptKeys(r0, r1, None))
            else:
                diff = qpos[:, None] - kpos[None, :]
                mask = diff >= 0
                if window is not None:
                    mask &= diff < window
                view.prefill.append(PromptKeys(r0, r1, slots, _additive(mask, prompt_dtype or dtype, device)))
        if decode:
            starts = [_key_start(s.start, window) for s in decode]
            width = max(s.start + 1 - k0 for s, k0 in zip(decode, starts))
            slots = np.zeros((len(decode), width), dtype=np.int64)  # padding reads page 0
            mask = np.zeros((len(decode), 1, 1, width), dtype=bool)
            lens = np.zeros(len(decode), dtype=np.int64)
            for b, (s, k0) in enumerate(zip(decode, starts)):
                n = s.start + 1 - k0
                slots[b, :n] = _slots(table(s), np.arange(k0, s.start + 1))
                mask[b, 0, 0, :n] = True
                lens[b] = n
            view.decode_slots, view.decode_mask, view.decode_lens = t(slots), t(mask), t(lens)
        fams[fam] = view
    sample_rows = []
    for s in segments:
        r0, r1 = rows[id(s)]
        if s.all_logits:
            sample_rows.extend(range(r0, r1))
        elif s.sample:
            sample_rows.append(r1 - 1)
    return StepContext(
        tokens=t(np.asarray(toks, dtype=np.int64)),
        positions=t(positions),
        sample_rows=t(np.asarray(sample_rows, dtype=np.int64)),
        decode_rows=(d0, r),
        families=fams,
        native=native,
        tile_rows=tuple(sum(n for n in prompt_lens if _tile_class(n) <= c) for c in (0, 1)),
    )
