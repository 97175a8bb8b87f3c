"""`--model ORG/NAME[@REVISION]`: a Hugging Face Hub repository, resolved as vLLM and the HF tools
resolve one, through `huggingface_hub`: the local hub cache first (what `huggingface-cli download`,
vLLM or transformers left there; works offline), then a download where the hub is reachable.

What is served from the snapshot: an HF checkpoint (config.json + *.safetensors) as a directory,
else its GGUF file (`--gguf-file NAME` when the repository holds several quantizations). Only the
files that choice needs are downloaded (one GGUF, not every quantization of a repository).
"""

from __future__ import annotations

import re
from pathlib import Path

# owner/name[@revision] (the hub's names: letters, digits, '-', '_', '.'); a path that exists wins.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
CHECKPOINT_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.jinja"]


def is_hub_id(model: str) -> bool:
    return bool(HUB_ID.match(model)) and not Path(model).expanduser().exists()


def split(model: str) -> tuple[str, str | None]:
    repo, _, revision = model.partition("@")
    return repo, revision or None


def resolve(model: str, gguf_file: str | None = None, cache_dir: str | None = None) -> Path:
    """The local path to serve for hub id `model`: the cached snapshot's checkpoint directory or
    GGUF file, downloading what is missing where the hub answers. FileNotFoundError naming the
    cache looked in and why the hub did not serve it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE

    repo, revision = split(model)
    try:
        snap = Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir, local_files_only=True))
        return pick(snap, model, gguf_file)
    except FileNotFoundError as e:
        cached = str(e)
    except Exception as e:  # huggingface_hub's "not in the cache" errors
        cached = f"{type(e).__name__}: {e}"
    try:
        patterns = _wanted(repo, revision, gguf_file)
        snap = Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir, allow_patterns=patterns))
    except Exception as e:
        raise FileNotFoundError(
            f"--model {model!r}: not usable from the Hugging Face cache ({cache_dir or HF_HUB_CACHE}: {cached}), "
            f"and not downloadable from the hub ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
        ) from None
    return pick(snap, model, gguf_file)


def _wanted(repo: str, revision: str | None, gguf_file: str | None) -> list[str]:
    """The files to download: the GGUF asked for, else the checkpoint, else the one GGUF file."""
    if gguf_file:
        return [gguf_file]
    from huggingface_hub import HfApi

    files = HfApi().list_repo_files(repo, revision=revision)
    if "config.json" in files and any(f.endswith(".safetensors") for f in files):
        return CHECKPOINT_FILES
    ggufs = [f for f in files if f.endswith(".gguf")]
    if len(ggufs) == 1:
        return ggufs
    raise FileNotFoundError(_which(repo, ggufs))


def pick(snap: Path, model: str, gguf_file: str | None) -> Path:
    """What a snapshot directory serves (module doc)."""
    if gguf_file:
        p = snap / gguf_file
        if p.is_file():
            return p
        raise FileNotFoundError(f"--model {model!r}: no {gguf_file!r} in {snap}")
    if (snap / "config.json").is_file() and any(snap.glob("*.safetensors")):
        return snap
    ggufs = sorted(snap.rglob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    raise FileNotFoundError(_which(model, [str(g.relative_to(snap)) for g in ggufs], snap))


def _which(model: str, ggufs: list[str], where: Path | None = None) -> str:
    at = f" (snapshot {where})" if where else ""
    if ggufs:
        return f"--model {model!r}{at} holds {len(ggufs)} GGUF files: name one with --gguf-file ({', '.join(ggufs)})"
    return f"--model {model!r}{at}: neither an HF checkpoint (config.json + *.safetensors) nor a GGUF file"
