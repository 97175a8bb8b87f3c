"""GGUF matrices kept in their stored blocks, and the matmul that reads them (`csrc/blocks.c`).

A `Blocks` is one [out, in] matrix as the file stores it: a uint8 array of out rows of the type's
bytes per row, usually a read-only view of the memory-mapped file (a copy only where the loader had
to reorder rows: Llama's q/k un-permutation). Nothing widens it whole: the embedding dequantizes
the rows a step looks up, the tied head and every layer matrix run `matmul` on the blocks, and the
one wider form the plan may ask for (q8 panels for the layers' large calls) is made at load by
`choice.Linear` and counted in the resident size it logs.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import torch

from . import native

# ggml type ids of the block formats csrc/blocks.c reads, and (values, bytes) per block.
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
BLOCK = {
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q8_0": (32, 34),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
}


class Blocks:
    """A matrix [out, in] in a GGUF block format; `data` uint8 [out, bytes per row]."""

    __slots__ = ("data", "qtype", "shape", "_map")

    def __init__(self, data: np.ndarray, qtype: str, shape: tuple[int, int], source: mmap.mmap | None = None):
        if qtype not in TYPES:
            raise ValueError(f"no block kernel for GGUF type {qtype}; read: {', '.join(TYPES)}")
        per, nbytes = BLOCK[qtype]
        if (
            data.dtype != np.uint8
            or data.ndim != 2
            or shape[1] % per
            or data.shape != (shape[0], shape[1] // per * nbytes)
        ):
            raise ValueError(f"{qtype} blocks of {data.shape} {data.dtype} do not hold a {shape} matrix")
        self.data, self.qtype, self.shape = data, qtype, tuple(shape)
        self._map = source  # the file's map when `data` is a view of it

    def release(self) -> None:
        """Drop this view's pages from the process's resident set (a wider form replaced it for the
        matmul, and only looked-up rows are read again: the embedding). The file's pages stay in
        the page cache; a later read maps them back. No-op for an owned copy."""
        if self._map is None or not hasattr(self._map, "madvise"):
            return
        base = np.frombuffer(self._map, dtype=np.uint8).ctypes.data
        start = self.data.ctypes.data - base
        lo = start // mmap.PAGESIZE * mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, lo, start + self.data.nbytes - lo)

    # What the model files ask of an embedding table (gemma3_forward.py: emb.dtype, emb.device, emb[ids]).
    dtype = torch.float32
    device = torch.device("cpu")

    def dim(self) -> int:
        return 2

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def take_rows(self, order: np.ndarray) -> "Blocks":
        """The rows in `order` (a permutation of output rows: whole rows of blocks move as they are)."""
        return Blocks(np.ascontiguousarray(self.data[order]), self.qtype, self.shape)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 [len(rows) or out, in]: the stored values exactly (every block format is exact in fp32)."""
        idx = None if rows is None else rows.reshape(-1).to(torch.int64).contiguous()
        n = self.shape[0] if idx is None else idx.numel()
        out = torch.empty(n, self.shape[1], dtype=torch.float32, device="cpu")  # blocks live in host memory
        if idx is not None and n and not (0 <= int(idx.min()) and int(idx.max()) < self.shape[0]):
            raise IndexError(f"row index outside 0..{self.shape[0] - 1}")
        native._lib().gq_dequantize(
            self.data.ctypes.data,
            TYPES[self.qtype],
            self.shape[1],
            None if idx is None else idx.data_ptr(),
            n,
            out.data_ptr(),
        )
        return out if rows is None else out.view(*rows.shape, self.shape[1])

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """Embedding lookup: the rows `ids` names, dequantized."""
        return self.dequantize(ids)


def dequantize_all(parts: list[Blocks]) -> torch.Tensor:
    """The parts stacked along the outputs, fp32 (a one-time wider form, or a dense plan's weights)."""
    return torch.cat([p.dequantize() for p in parts]) if len(parts) > 1 else parts[0].dequantize()


class BlockMatmul:
    """x @ W^T for W the parts stacked along the outputs (a fused q/k/v or gate/up whose parts may
    be stored in different formats), in one native call."""

    __slots__ = ("parts", "k", "n", "_args")

    def __init__(self, parts: list[Blocks]):
        k = {p.shape[1] for p in parts}
        if len(k) != 1:
            raise ValueError(f"parts of one matmul must share their inputs, got {sorted(k)}")
        self.parts, self.k = parts, k.pop()
        self.n = sum(p.shape[0] for p in parts)
        P = len(parts)
        cols = np.cumsum([0] + [p.shape[0] for p in parts])[:-1]
        self._args = (
            P,
            (ctypes.c_void_p * P)(*[p.data.ctypes.data for p in parts]),
            (ctypes.c_int * P)(*[TYPES[p.qtype] for p in parts]),
            (ctypes.c_int64 * P)(*[p.shape[0] for p in parts]),
            (ctypes.c_int64 * P)(*cols.tolist()),
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] (any float dtype) -> [M, N] fp32; each row's result is the same in any batch."""
        x = x.float().contiguous()
        m = x.shape[0]
        if x.shape[1] != self.k:
            raise ValueError(f"x has {x.shape[1]} columns, the blocks {self.k} inputs")
        y = torch.empty(m, self.n, dtype=torch.float32, device="cpu")  # a CPU kernel's output
        if m and native._LIB.gq_linear(x.data_ptr(), m, self.k, *self._args, y.data_ptr(), self.n):
            raise MemoryError("gguf blocks: no scratch memory for the quantized activations")
        return y


class Panels(tuple):
    """(q, d, variant code): the q8 kernel's weights (`native.q8_linear(x, *panels)`). `as_stored`:
    every value is the blocks' own (Q8_0 blocks moved into the AVX2 layout with their fp16 scales,
    code 4: `gq_q8_0_panels`; Q5_0 blocks into the 5-bit panels, code 5: `gq_q5_0_panels`; Q4_K
    into the 4-bit ones, code 6: `gq_q4_k_panels`), so rows
    read back from int8 panels (`PanelRows`) are the blocks' rows, bit for bit."""

    as_stored = False

    def linear(self, x: torch.Tensor, tiles: tuple[int, int] = (0, 0)) -> torch.Tensor:
        return native.q8_linear(x, *self, tiles=tiles)

    def tensors(self) -> list[torch.Tensor]:
        return [self[0], self[1]]


class SegmentPanels(tuple):
    """A fused matrix's AVX2 panels, one `Panels` per part stored in its own form (Gemma 3's q/k/v:
    5-bit q and k beside an int8 v in half its layers), run side by side in one call."""

    as_stored = False

    def linear(self, x: torch.Tensor, tiles: tuple[int, int] = (0, 0)) -> torch.Tensor:
        return native.q8_linear_segments(x, self, tiles)

    def tensors(self) -> list[torch.Tensor]:
        return [t for p in self for t in p.tensors()]


def _avx2_panels(p: Blocks, chunk: int, six: bool = False) -> Panels:
    """One matrix's AVX2 panels: Q5_0 as its own 5-bit values (code 5), Q4_K as its own 4-bit
    values, scales and mins (code 6), with `six` Q6_K as its own 6-bit values in the 16-output
    panels read by halves (code 10), Q8_0 moved with its fp16 scales (code 4) when that gives the
    q8 plan's values (every block's max |q| is 127), anything else (Q6_K without `six`, ...)
    dequantized and quantized to int8 a chunk of rows at a time (code 0)."""
    n, k = p.shape
    lib = native._lib()
    if _in_bits(p, six) and p.qtype == "Q6_K":
        return _six_bit_panels(p, native.Q6K_HALVES)
    if p.qtype == "Q5_0":
        q = torch.empty(n, k * 5 // 8, dtype=torch.uint8)
        d = torch.empty(n, k // native.GROUP, dtype=torch.float16)
        lib.gq_q5_0_panels(p.data.ctypes.data, n, k, q.data_ptr(), d.data_ptr())
        out = Panels((q, d, native.Q5_PANELS))
        out.as_stored = True
        return out
    if p.qtype == "Q4_K" and k % 256 == 0:
        q = torch.empty(n, k * 9 // 16, dtype=torch.uint8)
        d = torch.empty(n, k // 256 * 2, dtype=torch.float16)
        lib.gq_q4_k_panels(p.data.ctypes.data, n, k, q.data_ptr(), d.data_ptr())
        out = Panels((q, d, native.Q4K_PANELS))
        out.as_stored = True
        return out
    q = torch.empty(n, k, dtype=torch.int8)
    if p.qtype == "Q8_0":
        d = torch.empty(n, k // native.GROUP, dtype=torch.float16)
        if not any(
            lib.gq_q8_0_panels(p.data[r0:].ctypes.data, min(chunk, n - r0), k, q[r0].data_ptr(), d[r0].data_ptr(), 1)
            for r0 in range(0, n, chunk)
        ):
            out = Panels((q, d, native.Q8_F16_SCALES))
            out.as_stored = True
            return out
    d = torch.empty(n, k // native.GROUP, dtype=torch.float32)
    for r0 in range(0, n, chunk):
        rows = torch.arange(r0, min(r0 + chunk, n))
        x = p.dequantize(rows)
        lib.q8_quantize(x.data_ptr(), len(rows), k, q[r0].data_ptr(), d[r0].data_ptr())
    return Panels((q, d, 0))


def wide_q4k(p: Panels, variant: str) -> Panels:
    """The 8-output 4-bit panels of a Q4_K matrix (code 6) as the 16-output ones of the AVX-512 VNNI
    and AMX kernels (codes 7, 8; csrc/q8.c wide4_rows): panels 2g and 2g + 1 interleaved, per block
    of 32 inputs each one's 4 nibble vectors side by side, then the 8 + 8 scales, then the 8 + 8 mins;
    per 256 inputs their 8 + 8 d, then their 8 + 8 dmin. The same bytes, moved."""
    q, d, _ = p
    n = d.shape[0]
    nb, ns = q.shape[1] * 16 // 9 // 32, d.shape[1] // 2
    blk = q.view(n // 16, 2, nb, 144)
    nib = blk[..., :128].reshape(n // 16, 2, nb, 4, 32).permute(0, 2, 3, 1, 4).reshape(n // 16, nb, 256)
    sc = blk[..., 128:].reshape(n // 16, 2, nb, 2, 8).permute(0, 2, 3, 1, 4).reshape(n // 16, nb, 32)
    wq = torch.cat([nib, sc], -1).reshape(q.shape)
    wd = d.view(n // 16, 2, ns, 2, 8).permute(0, 2, 3, 1, 4).reshape(d.shape).contiguous()
    out = Panels((wq, wd, native.Q4K_WIDE[variant]))
    out.as_stored = True
    return out


def q8_panels(
    parts: list[Blocks], variant: str, panel: int, chunk: int = 4096, six: bool = False
) -> Panels | SegmentPanels:
    """The q8 kernel's panels (native.q8_quantize) of the parts stacked along the outputs, made a
    few thousand rows at a time so no fp32 copy of a whole matrix is ever held (the 262k-row head
    would be 671 MB of it). The AVX2 panels keep what the file stores where their forms hold it
    exactly (`_avx2_panels`: Q5_0 in 5 bits, Q8_0 with its fp16 scales), one form per part
    (`SegmentPanels` for a fused matrix); so do the 16-output ones for Q4_K (4 bits) and, with
    `six`, Q6_K (6 bits; choice.py `six_bits` says which matrices); the other variants' panels are
    quantized from the dequantized values, each panel covering `panel` consecutive rows and lying whole in the rows'
    share of the arrays, so chunks of a multiple of `panel` rows fill them in place."""
    k = parts[0].shape[1]
    n = sum(p.shape[0] for p in parts)
    code = native.Q8_VARIANTS[variant]
    if any(p.shape[0] % panel for p in parts):
        q, d, code = native.q8_quantize(dequantize_all(parts), variant)
        return Panels((q, d, code))
    if code == 0 and len(parts) <= 7:
        return _segments([_avx2_panels(p, chunk, six) for p in parts])
    if variant in native.Q4K_WIDE and len(parts) <= 7 and any(_in_bits(p, six) for p in parts):
        # the Q4_K (and Q6_K) parts in their own bits, each other part in the variant's int8 panels
        return _segments(
            [
                _wide_bits(p, variant, chunk) if _in_bits(p, six) else q8_panels([p], variant, panel, chunk)
                for p in parts
            ]
        )
    q = torch.empty(n, k, dtype=torch.int8)
    d = torch.empty(n, k // native.GROUP, dtype=torch.float32)
    at = 0
    stored = all(p.qtype == "Q8_0" for p in parts)
    for p in parts:
        for r0 in range(0, p.shape[0], chunk):
            rows = torch.arange(r0, min(r0 + chunk, p.shape[0]))
            stored = stored and _requantizes_exactly(p.data[r0 : r0 + len(rows)])
            cq, cd, code = native.q8_quantize(p.dequantize(rows), variant)
            q[at : at + len(rows)], d[at : at + len(rows)] = cq, cd
            at += len(rows)
    out = Panels((q, d, code))
    out.as_stored = stored
    return out


def _in_bits(p: Blocks, six: bool) -> bool:
    """Whether a part's wide bit panels can be made: Q4_K (or, with `six`, Q6_K) in whole 256-input
    super-blocks of whole 16-output panels."""
    kept = p.qtype == "Q4_K" or (six and p.qtype == "Q6_K")
    return kept and p.shape[1] % 256 == 0 and p.shape[0] % 16 == 0


def _wide_bits(p: Blocks, variant: str, chunk: int) -> Panels:
    """A Q4_K or Q6_K matrix's wide panels of its own values (codes 7 / 8, 9)."""
    if p.qtype == "Q4_K":
        return wide_q4k(_avx2_panels(p, chunk), variant)
    return _six_bit_panels(p, native.Q6K_WIDE)


def _six_bit_panels(p: Blocks, code: int) -> Panels:
    """A Q6_K matrix's 16-output 6-bit panels (csrc/blocks.c gq_q6_k_wide), read whole on AVX-512
    VNNI (code 9) or by 8-output halves on AVX2 (code 10): the same bytes."""
    n, k = p.shape
    q = torch.empty(n, k * 13 // 16, dtype=torch.uint8)
    d = torch.empty(n, k // 256, dtype=torch.float16)
    native._lib().gq_q6_k_wide(p.data.ctypes.data, n, k, q.data_ptr(), d.data_ptr())
    out = Panels((q, d, code))
    out.as_stored = True
    return out


def _segments(segs: list[Panels]) -> Panels | SegmentPanels:
    """One part's panels, or a fused matrix's parts side by side (as stored when every part is)."""
    if len(segs) == 1:
        return segs[0]
    out = SegmentPanels(segs)
    out.as_stored = all(s.as_stored for s in segs)
    return out


def _requantizes_exactly(data: np.ndarray) -> bool:
    """Whether q8_quantize gives Q8_0 blocks (uint8 rows of 34-byte blocks) back value for value:
    true when every block's max |q| is 127 or 0 (then its scale is max |d * q| / 127 = |d| exactly,
    every q / d rounds back to q, and q * d is the stored value), as llama.cpp's quantizer writes them."""
    q = data.reshape(data.shape[0], -1, 34)[:, :, 2:].view(np.int8)
    amax = np.abs(q.astype(np.int16)).max(axis=-1)
    return bool(((amax == 127) | (amax == 0)).all())


class PanelRows:
    """An embedding table read from the tied head's q8 panels, where those hold the table's
    values as stored (`Panels.as_stored`): a lookup gives the blocks' rows bit for bit, and the
    file's blocks are not read again. The AVX2 panels (codes 0, 4) are read by csrc/blocks.c; the
    16-output panels of the AVX-512 VNNI and AMX variants (codes 2, 3; `native.q8_quantize`'s
    interleave, VNNI's bytes offset by 128) by a gather here; their 6-bit panels of a Q6_K table
    (codes 9 and 10, a Q4_K_M file's tied embedding) by csrc/blocks.c `gq_q6_k_wide_rows`. (Read from the
    mapped file, each new token's rows brought its pages back into the resident set: after the ~7k
    distinct tokens of this repository's docs and code, 104 MiB of Gemma 3 270M's 170 MiB table, on
    top of the head's panels.)"""

    dtype = torch.float32
    device = torch.device("cpu")

    __slots__ = ("q", "d", "shape", "code")
    # the panel codes whose values rows can be read back from: int8 (AVX2 fp32 / fp16 scales,
    # AVX-512 VNNI, AMX) and 6-bit
    WIDE = frozenset({native.Q8_VARIANTS["avx512_vnni"], native.Q8_VARIANTS["amx"]})  # 16-output int8
    CODES = frozenset({native.Q8_VARIANTS["avx2"], native.Q8_F16_SCALES, *WIDE, *native.Q6K_CODES})

    def __init__(self, panels: Panels):
        q, d, code = panels if isinstance(panels, Panels) else (None, None, None)
        if code not in self.CODES or not panels.as_stored:
            raise ValueError("rows are read back only from int8 or 6-bit panels that hold the values as stored")
        k = d.shape[1] * 256 if code in native.Q6K_CODES else q.shape[1]
        self.q, self.d, self.shape, self.code = q, d, (q.shape[0], k), code

    def dim(self) -> int:
        return 2

    @property
    def nbytes(self) -> int:
        return 0  # the head's panels: counted there

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """fp32 rows `ids` names (csrc/blocks.c `gq_panel_rows`): each value q * d, as the blocks' d * q."""
        idx = ids.reshape(-1).to(torch.int64).contiguous()
        n, k = self.shape
        if idx.numel() and not (0 <= int(idx.min()) and int(idx.max()) < n):
            raise IndexError(f"row index outside 0..{n - 1}")
        if self.code in self.WIDE:
            return self._wide_rows(idx).view(*ids.shape, k)
        out = torch.empty(idx.numel(), k, dtype=torch.float32, device=self.device)
        if self.code in native.Q6K_CODES:  # a tied Q6_K table (Q4_K_M files): d * scale * (q - 32), as stored
            native._lib().gq_q6_k_wide_rows(
                self.q.data_ptr(), self.d.data_ptr(), k, idx.data_ptr(), idx.numel(), out.data_ptr()
            )
            return out.view(*ids.shape, k)
        native._lib().gq_panel_rows(
            self.q.data_ptr(),
            self.d.data_ptr(),
            k,
            idx.data_ptr(),
            idx.numel(),
            out.data_ptr(),
            int(self.d.dtype == torch.float16),
        )
        return out.view(*ids.shape, k)

    def _wide_rows(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows of 16-output panels: row r is output r % 8 of half (r % 16) // 8 of panel pair
        r // 16; its bytes sit per 32-input block as 8 groups of 4 inputs (the AVX2 panel's
        order), its scales per block beside its pair's."""
        n, k = self.shape
        nb = k // native.GROUP
        pair, half, out = idx // 16, (idx % 16) // 8, idx % 8
        q = self.q.view(n // 16, nb, 8, 2, 8, 4)[pair, :, :, half, out, :]  # [ids, nb, 8 groups, 4]
        if self.code == 2:  # VNNI's unsigned bytes: the sign bit flipped back
            q = torch.where(q >= 0, q.to(torch.int16) - 128, q.to(torch.int16) + 128)
        d = self.d.view(n // 16, nb, 2, 8)[pair, :, half, out]  # [ids, nb]
        return (q.reshape(len(idx), nb, 32).float() * d[:, :, None]).reshape(len(idx), k)
