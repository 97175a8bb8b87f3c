"""Read a GGUF file: architecture metadata -> ModelSpec, tensors -> dequantized torch tensors.

GGUF stores Gemma norm weights with the `1 +` of Gemma's RMSNorm already folded in, and Llama's
q/k projections permuted for llama.cpp's interleaved RoPE; we undo the permutation so every model
uses the same rotate-half RoPE as HF transformers (the oracle).
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass

import numpy as np
import torch

from .. import families
from ..spec import ModelSpec

# GGUF tensor types the two packaged models use (and their close relatives): (values, bytes) per
# block, as gguf's GGML_QUANT_SIZES has them (a test holds the two equal). Kept here so a start
# reads the file without importing gguf (~4 MiB resident and ~0.1 s) unless a tensor needs its
# dequantizer (the formats the block kernel does not read: Q8_K, Q2_K, Q3_K).
QUANT_SIZES = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (32, 34),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q4_K": (256, 144),
    "Q5_K": (256, 176),
    "Q6_K": (256, 210),
    "Q8_K": (256, 292),
    "Q2_K": (256, 84),
    "Q3_K": (256, 110),
}
SUPPORTED_QTYPES = set(QUANT_SIZES)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def read_spec(reader) -> ModelSpec:
    """The spec from a gguf.GGUFReader (the conversion has one open anyway)."""
    return _spec(lambda k, d=None: _field(reader, k, d), {t.name for t in reader.tensors})


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass
class Layout:
    """A GGUF file's header: metadata (scalars and strings as values, an array as range(its
    length): only lengths are needed), each tensor's (dims, ggml type id, byte offset in the file),
    and the SHA-256 of the header bytes (metadata and tensor table: with the file's size and mtime,
    the conversion cache's key; hashing the whole file took ~1 s per start on 253 MB)."""

    meta: dict
    tensors: dict[str, tuple[tuple[int, ...], int, int]]
    header_sha: str


def read_header(path) -> tuple[dict, set[str]]:
    """The metadata and tensor names (start-up checks)."""
    layout = read_layout(path)
    return layout.meta, set(layout.tensors)


def read_layout(path) -> Layout:
    """The header of a GGUF file, without reading any tensor. gguf.GGUFReader builds a numpy view
    per array item: 30 s for Gemma 3's 262k-entry vocab on 2 cores, far too slow to check a
    start-up knob against or to run on every start. Raises ValueError on a file that is not GGUF
    v2/v3 or ends early."""
    with open(path, "rb") as f:
        buf = f.read(8 << 20)  # metadata is at the front; read more only if it runs past this
        pos = 0

        def take(n):
            nonlocal buf, pos
            while pos + n > len(buf):
                more = f.read(max(n, len(buf)))
                if not more:
                    raise ValueError(f"{path}: truncated GGUF header ({len(buf)} bytes)")
                buf += more
            pos += n
            return pos - n

        def unpack(fmt):
            at = take(struct.calcsize(fmt))  # before reading buf: take may grow it
            return struct.unpack_from(fmt, buf, at)[0]

        def string():
            at = take(unpack("<Q"))
            return buf[at:pos].decode("utf-8", "replace")

        def value(kind):
            if kind in _SCALARS:
                return unpack(_SCALARS[kind])
            if kind == _STRING:
                return string()
            if kind != _ARRAY:
                raise ValueError(f"{path}: unknown GGUF value type {kind}")
            item, n = unpack("<I"), unpack("<Q")
            if item in _SCALARS:
                take(n * struct.calcsize(_SCALARS[item]))
            else:
                for _ in range(n):
                    value(item)
            return range(n)

        if buf[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r})")
        pos = 4
        if (version := unpack("<I")) not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} (tailgate reads 2 and 3)")
        n_tensors, n_kv = unpack("<Q"), unpack("<Q")
        meta = {}
        for _ in range(n_kv):
            key = string()
            meta[key] = value(unpack("<I"))
        infos = {}
        for _ in range(n_tensors):
            name = string()
            dims = tuple(unpack("<Q") for _ in range(unpack("<I")))
            kind, offset = unpack("<I"), unpack("<Q")
            infos[name] = (dims, kind, offset)
        align = int(meta.get("general.alignment", 32))
        start = (pos + align - 1) // align * align  # tensor data begins at the next aligned byte
        sha = hashlib.sha256(buf[:pos]).hexdigest()
    # `value` calls itself, so its closure holds it: a cycle through the cells of `buf` that keeps
    # the header's bytes (16 MiB for Gemma 3's vocabulary) alive until the cyclic collector runs,
    # past the heap trims of a start (15 MiB of the resident set after two reads). Break it.
    value = None  # noqa: F841
    return Layout(meta, {n: (d, k, start + o) for n, (d, k, o) in infos.items()}, sha)


def read_header_spec(path) -> ModelSpec:
    """The spec from the header alone (start-up checks before any weights load), after the tensor
    types are known readable: an IQ* file refuses here, before the server binds its port, not
    after it answered /health for the length of a load."""
    layout = read_layout(path)
    check_qtypes(layout)
    return layout_spec(layout)


def check_qtypes(layout: Layout) -> dict:
    """{ggml type id: name} of the layout's tensors; ValueError naming any type we cannot read."""
    kinds = {k: _GGML_NAMES.get(k, str(k)) for _, k, _ in layout.tensors.values()}
    bad = sorted(set(kinds.values()) - SUPPORTED_QTYPES)
    if bad:
        raise ValueError(f"unsupported GGUF tensor type(s) {bad}; supported: {sorted(SUPPORTED_QTYPES)}")
    return kinds


def layout_spec(layout: Layout) -> ModelSpec:
    return _spec(lambda k, d=None: layout.meta.get(k, d), set(layout.tensors))


def _spec(field, names: set[str]) -> ModelSpec:
    arch = field("general.architecture")
    family = families.for_gguf_arch(arch)
    g = lambda k, d=None: field(f"{arch}.{k}", d)  # noqa: E731
    n_layers = int(g("block_count"))
    hidden = int(g("embedding_length"))
    n_heads = int(g("attention.head_count"))
    n_kv = int(g("attention.head_count_kv", n_heads))
    head_dim = int(g("attention.key_length", hidden // n_heads))
    vocab = len(field("tokenizer.ggml.tokens"))
    common = dict(
        vocab_size=vocab,
        hidden=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv,
        head_dim=head_dim,
        ffn=int(g("feed_forward_length")),
        eps=float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(g("rope.freq_base", 10000.0)),
        max_position=int(g("context_length", 8192)),
        tie_embeddings="output.weight" not in names,
    )
    return family.read_gguf(common, g)


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Invert llama.cpp's q/k permutation (interleaved RoPE pairs -> HF's rotate-half halves), of a
    weight [out, in] or a bias [out]."""
    out = w.shape[0]
    return w.reshape(n_head, out // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def internal_name(gguf_name: str, family: families.Family | None = None) -> str:
    """Our name for a GGUF tensor: `blk.N.<layer name>` (a projection's `.bias` too) or one of the
    family's top-level tensors (Llama 3's `rope_freqs`: its RoPE frequency divisors)."""
    bias = gguf_name.endswith(".bias")
    base = gguf_name.removesuffix(".bias") if bias else gguf_name.removesuffix(".weight")
    if base.startswith("blk."):
        _, idx, rest = base.split(".", 2)
        ours = families.GGUF_LAYER.get(rest)
        if ours is not None and (not bias or ours in families.BIASED):
            return f"layers.{idx}.{ours}" + (".bias" if bias else "")
    else:
        top = family.gguf_top if family is not None else families.GGUF_TOP
        if base in top and not bias:
            return top[base]
    raise ValueError(f"unknown GGUF tensor {gguf_name!r}")


_GGML_NAMES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    6: "Q5_0",
    7: "Q5_1",
    8: "Q8_0",
    9: "Q8_1",
    10: "Q2_K",
    11: "Q3_K",
    12: "Q4_K",
    13: "Q5_K",
    14: "Q6_K",
    15: "Q8_K",
    30: "BF16",
}


def read_stored(path, layout: Layout, spec: ModelSpec, progress=None) -> dict:
    """Every tensor by our name, from the memory-mapped file: a matrix in a block format the block
    kernel reads stays a `blocks.Blocks` view of the file (Llama's q/k rows un-permuted into a copy:
    whole rows of blocks move as they are); vectors, float matrices and the few other formats are
    read into fp32 tensors (exact for every GGUF format). The map stays open while a view lives."""
    from ..kernels.blocks import BLOCK, Blocks

    kinds = check_qtypes(layout)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    whole = np.frombuffer(mm, dtype=np.uint8)
    family = families.get(spec.arch)
    out = {}
    items = layout.tensors.items() if progress is None else progress(layout.tensors.items())
    for gname, (dims, kind, offset) in items:
        name = internal_name(gname, family)
        qtype = kinds[kind]
        rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
        per, nbytes = QUANT_SIZES[qtype]
        row_bytes = dims[0] // per * nbytes
        raw = whole[offset : offset + rows * row_bytes].reshape(rows, row_bytes)
        part = name.split(".")[2] if name.startswith("layers.") else ""
        heads = spec.n_heads if part == "q" else spec.n_kv_heads
        unpermute = family.gguf_unpermute and part in ("q", "k")  # the weight and, where there is one, its bias
        if qtype in BLOCK and len(dims) == 2:
            t = Blocks(raw, qtype, (rows, dims[0]), mm)
            out[name] = t.take_rows(_unpermute(np.arange(rows), heads)) if unpermute else t
            continue
        a = _widen(raw, qtype).reshape(*reversed(dims))
        if unpermute:
            a = _unpermute(a, heads)
        out[name] = torch.from_numpy(np.array(a, dtype=np.float32))  # owned: the map may close
    return out


def _widen(raw: np.ndarray, qtype: str) -> np.ndarray:
    """fp32 values of rows of a GGUF tensor (exact): the float formats here, the rest by gguf's own
    dequantizer (imported only then)."""
    if qtype == "F32":
        return raw.view(np.float32)
    if qtype == "F16":
        return raw.view(np.float16).astype(np.float32)
    if qtype == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    return np.asarray(dequantize(raw, GGMLQuantizationType[qtype]), dtype=np.float32)


def read_tokenizer_meta(reader) -> dict:
    """BOS/EOS handling and the chat template, as the GGUF metadata records them."""
    arch = _field(reader, "general.architecture")
    family = families.for_gguf_arch(arch)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    eos_ids = [int(eos)] if eos is not None else []
    # Gemma's chat turns end with <end_of_turn>; HF's generation_config lists it as an EOS too.
    for end in family.turn_ends:
        if end in tokens and tokens.index(end) not in eos_ids:
            eos_ids.append(tokens.index(end))
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    add_bos = _field(reader, "tokenizer.ggml.add_bos_token")
    return {
        "bos_id": int(bos) if bos is not None else None,
        "eos_ids": eos_ids,
        "add_bos": bool(add_bos) if add_bos is not None else family.add_bos,
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "family": family.name,
    }
