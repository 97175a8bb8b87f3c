"""A step's layers in one native call (csrc/layers.c `step_layers`): the Llama-shaped families
(Llama, Qwen3, SmolLM2) and Gemma 3.

The model files ask `step_layers` first; where it answers False their Python layer loop runs as
before. The C loop calls the kernels that loop calls, in its order, with its arguments, so a row's
bits are the same either way (tests/test_native_layers.py compares the logits bit for bit); what
goes is ~12 trips a layer through Python, torch and ctypes (docs/kernels.md, "A step's layers in
one native call": 3.9 of a 25.3 ms one-row step of Llama 3.2 1B's shape, AMD EPYC Zen 4).

It takes a step only where the loop would have run exactly those kernels: decode rows and prompt
segments whose attention is the native kernel's (each prompt row over its range of the keys), the
native ops over fp16 pages, fp32 activations, and every layer matrix on q8 panels at this many rows
with no bias (the AMX panels' BF16 tile rows passed as the loop passes them). The layer table (pointers to the panels, norms and
pools, which live as long as the runner) is built once per runner and row regime (`max_q_rows`
decides a matrix's kernel by row count) and kept on the runner's `KVCache`.
"""

from __future__ import annotations

import torch

from ..kernels import native
from ..kernels.blocks import SegmentPanels
from ..kernels.choice import Linear
from .context import StepContext
from .kv_cache import KVCache

MATRICES = ("qkv", "o", "gate_up", "down")
NORMS = ("attn_norm", "ffn_norm", "q_norm", "k_norm")  # then the pools, then POST_NORMS
POST_NORMS = ("post_attn_norm", "post_ffn_norm")  # Gemma's; Llama adds the residual plainly
FAMILIES = ("global", "local")  # csrc/layers.c's family index
MAX_SEGMENTS = 7  # csrc/layers.c MAX_SEG
FAM_WORDS = 8  # csrc/layers.c FAM_WORDS
GLU = {"swiglu": 0, "geglu": 1}
ENABLED = True  # scripts/experiments/step_ab.py turns it off for the A/B; nothing else does
# The call holds every scratch activation of a layer at once (csrc/layers.c: ~36k floats a row at
# Llama 3.2 1B's shape, 140 KB), where the loop frees each as it goes: a 4096-row prefill would
# hold ~0.6 GB. Past this many rows a step keeps the loop, whose ~2-4 ms of Python is < 2 % of a
# step that long (a 512-row step of Gemma 3 270M is ~0.2 s on a 2-core AMD EPYC).
MAX_ROWS = 512


def _segments(lin, rows: int) -> list[tuple[int, int, int, int]] | None:
    """(q, d, outputs, code) of the panels `lin.raw` would multiply `rows` rows by, or None where it
    would take another kernel (the blocks' own, dense, a bias, no panels)."""
    panels = lin.panels(rows) if type(lin) is Linear else None
    if panels is None:
        return None
    parts = list(panels) if isinstance(panels, SegmentPanels) else [panels]
    if len(parts) > MAX_SEGMENTS:
        return None
    return [(q.data_ptr(), d.data_ptr(), d.shape[0], int(code)) for q, d, code in parts]


def _table(w: dict, spec, kv: KVCache, rows: int, post_norms: bool) -> tuple[torch.Tensor, set] | None:
    """The layers' table at `rows` rows and the KV families it reads, or None where a layer's
    kernels are not the ones csrc/layers.c calls (or its shapes not the ones it sizes scratch by)."""
    mat_words = 1 + 4 * MAX_SEGMENTS
    d = spec.head_dim
    outputs = ((spec.n_heads + 2 * spec.n_kv_heads) * d, spec.hidden, 2 * spec.ffn, spec.hidden)
    table = torch.zeros(spec.n_layers, native._LIB.step_layer_words(), dtype=torch.int64, device="cpu")
    used = set()
    for i in range(spec.n_layers):
        p = f"layers.{i}."
        for j, name in enumerate(MATRICES):
            segs = _segments(w[p + name], rows)
            if segs is None or sum(s[2] for s in segs) != outputs[j]:
                return None
            row = [len(segs)] + [v for s in segs for v in s]
            table[i, j * mat_words : j * mat_words + len(row)] = torch.tensor(row, dtype=torch.int64, device="cpu")
        fam, k_pool, v_pool = kv.layer(i)
        norms = [w.get(p + n) for n in NORMS]
        post = [w.get(p + n) if post_norms else None for n in POST_NORMS]
        if any(t is not None and (t.dtype != torch.float32 or not t.is_contiguous()) for t in norms + post):
            return None
        if norms[0] is None or norms[1] is None or fam not in FAMILIES or k_pool.dtype != torch.float16:
            return None
        if post_norms and None in post or k_pool.shape[1:] != (spec.n_kv_heads, d):
            return None
        ptrs = [0 if t is None else t.data_ptr() for t in norms] + [k_pool.data_ptr(), v_pool.data_ptr()]
        ptrs += [0 if t is None else t.data_ptr() for t in post] + [FAMILIES.index(fam)]
        table[i, 4 * mat_words :] = torch.tensor(ptrs, dtype=torch.int64, device="cpu")
        used.add(fam)
    return table, used


def step_layers(
    w: dict,
    spec,
    ctx: StepContext,
    kv: KVCache,
    h: torch.Tensor,
    x: torch.Tensor,
    ropes: dict,
    glu: str,
    post_norms: bool = False,
) -> bool:
    """Run every layer of this step in one native call when it can (h updated in place, as the
    Python loop leaves it); False where the Python loop must run instead. `ropes`: each KV family's
    (cos, sin) for this step's rows; `glu`: "swiglu" | "geglu"; `post_norms`: the family normalises
    each sublayer's output before its residual add (Gemma's post-attention and post-MLP norms)."""
    t = h.shape[0]
    d0, d1 = ctx.decode_rows  # prompt rows first, then the decode rows
    if not (ENABLED and ctx.native and native._LIB is not None and 0 < t <= MAX_ROWS and d1 == t):
        return False
    if h.dtype != torch.float32 or x.dtype != torch.float32:
        return False
    views = ctx.families
    for f, v in views.items():
        if f not in FAMILIES or (t > d0 and v.decode_slots is None) or any(p.starts is None for p in v.prefill):
            return False  # (a prompt segment without its rows' key ranges attends through SDPA)
    d, lanes = spec.head_dim, native.attention_width(spec.head_dim)
    first = w["layers.0.qkv"]
    if d % lanes or d > 1024 or not isinstance(first, Linear):  # norm_rope's row buffer: 1024 floats
        return False
    # Per runner (on its KVCache, which lives and goes with it): its layer matrices, then a table per
    # row regime, keyed by which side of its own cut each matrix is at this many rows. The cuts are
    # read every step, not cached: the start-up probe moves them (probe.apply_layer_cut) after the
    # warm-up's steps have built a table. One entry, replaced whole (never cleared in place): the
    # side lane's worker runs prompt steps on another thread (model/runtime/lane.py), and two
    # threads racing here build a table twice at worst.
    state = kv.native_tables.get("layers")
    if state is None or state[0] is not first:
        mats = [w[f"layers.{i}.{m}"] for i in range(spec.n_layers) for m in MATRICES]
        state = kv.native_tables["layers"] = (first, mats, {})
    key = tuple(t <= getattr(m, "max_q_rows", 0) for m in state[1])
    built = state[2].get(key, False)
    if built is False:
        built = state[2][key] = _table(w, spec, kv, t, post_norms)
    if built is None or not built[1] <= views.keys():
        return False
    table = built[0]
    keep, fams = [], torch.zeros(len(FAMILIES), FAM_WORDS, dtype=torch.int64, device="cpu")
    for j, fam in enumerate(FAMILIES):
        if fam not in views:  # a family no layer reads (checked above)
            continue
        v = views[fam]
        cos, sin = (r.float().contiguous() for r in ropes[fam])
        write = v.write_slots.contiguous()
        parts = [cos, sin, write]
        words = [cos.data_ptr(), sin.data_ptr(), write.data_ptr()]
        if t > d0:
            parts += [v.decode_slots.contiguous(), v.decode_lens.contiguous()]
            words += [parts[-2].data_ptr(), parts[-1].data_ptr(), v.decode_slots.shape[1]]
        else:
            words += [0, 0, 0]
        prompts = []
        for p in v.prefill:  # a fresh prompt reads back its own rows (layers.paged_attention)
            keys = write[p.r0 : p.r1] if p.slots is None else p.slots.contiguous()
            starts, lens = p.starts.contiguous(), p.lens.contiguous()
            parts += [keys, starts, lens]
            prompts += [p.r0, p.r1, keys.data_ptr(), starts.data_ptr(), lens.data_ptr()]
        segments = torch.tensor(prompts or [0], dtype=torch.int64, device="cpu")
        parts.append(segments)
        words += [len(v.prefill), segments.data_ptr()]
        keep += parts
        fams[j] = torch.tensor(words, dtype=torch.int64, device="cpu")
    if native._LIB.step_layers(
        table.data_ptr(),
        spec.n_layers,
        h.data_ptr(),
        x.data_ptr(),
        t,
        d0,
        h.shape[1],
        spec.n_heads,
        spec.n_kv_heads,
        d,
        spec.ffn,
        spec.eps,
        GLU[glu],
        fams.data_ptr(),
        spec.scale,
        lanes,
        *first._tiles(),  # (the layer matrices' BF16 tile rows on AMX, as the loop's calls pass them)
    ):
        raise MemoryError("step layers: no scratch memory")
    return True
