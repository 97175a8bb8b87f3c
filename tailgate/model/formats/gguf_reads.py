"""transformers' GGUF readers, made fast for the length of a `with`: each GGUF file parsed once, by
gguf's own reader over a plain array view of its memory map.

`from_pretrained(gguf_file=...)` (the tokenizer conversion on a GGUF model's first start, and the
tests' HF oracle) builds a `gguf.GGUFReader` for the config and another for the weights, and the
reader makes a `np.memmap` slice (Python-level `__getitem__` and `__array_finalize__`) for every
part of every field: Gemma 3's 262k-token vocabulary is 1.9 M parts, 15-34 s and ~670 MB a parse
on a busy 2-core host; over an `np.ndarray` view of the same map the same code takes a third of the
time and half the memory. The reader's own parsing code runs unchanged, on the same bytes
(read-only: mode "r"); the fields and tensors it yields are equal, part for part and dtype for
dtype. Likewise `gguf.get_tensor_name_map(arch, n_blocks)`, which transformers calls once per
submodule of the model it maps (~300-400 times, each building the same read-only name table), is
built once per (arch, n_blocks)."""

from __future__ import annotations

import contextlib
import os
import threading

_lock = threading.Lock()  # the patch is module-global: one `with` at a time


@contextlib.contextmanager
def plain_gguf_reads():
    import gguf
    import numpy as np

    real, real_map = gguf.GGUFReader, gguf.get_tensor_name_map

    class PlainArrayReader(real):
        def _get(self, offset, dtype, count=1, override_order=None):
            if type(self.data) is not np.ndarray:
                self.data = np.asarray(self.data)  # the same buffer, minus np.memmap's Python hooks
            return super()._get(offset, dtype, count, override_order)

    readers, maps = {}, {}

    def reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = PlainArrayReader(path, mode)
        return readers[key]

    def name_map(arch, n_blocks):
        if (arch, n_blocks) not in maps:
            maps[(arch, n_blocks)] = real_map(arch, n_blocks)
        return maps[(arch, n_blocks)]

    with _lock:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map  # transformers imports both from `gguf` per call
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = real, real_map
