"""`--model ORG/NAME[@REVISION]`: a Hugging Face Hub repository, resolved as vLLM and the HF tools
resolve one, through `huggingface_hub`: the local hub cache first (what `hf download`,
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


# A name ending like a file is a path, never a hub id: a mistyped `models/x.gguf` says "no such
# file" instead of going to the hub (issue 44).
FILE_SUFFIXES = (".gguf", ".safetensors", ".bin", ".json", ".pt", ".pth")


def is_hub_id(model: str) -> bool:
    return (
        bool(HUB_ID.match(model))
        and not model.lower().endswith(FILE_SUFFIXES)
        and not Path(model).expanduser().exists()
    )


class Ambiguous(FileNotFoundError):
    """A snapshot (or repository) that holds several GGUF files and no --gguf-file naming one."""


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached from here, in a few seconds (None: it answers a TCP connect,
    or a proxy is in the way and only a request can tell). huggingface_hub alone retries for
    27-32 s offline before it refuses (issue 44)."""
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub.constants import ENDPOINT, HF_HUB_OFFLINE

    if HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError as e:
        return f"{url.hostname}: {e.strerror or type(e).__name__}"
    return None


def split(model: str) -> tuple[str, str | None]:
    repo, _, revision = model.partition("@")
    return repo, revision or None


def resolve(model: str, gguf_file: str | None = None, cache_dir: str | None = None) -> Path:
    """The local path to serve for hub id `model`: the cached snapshot's checkpoint directory or
    GGUF file, downloading what is missing where the hub answers. FileNotFoundError naming the
    cache looked in and why the hub did not serve it."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo, revision = split(model)
    try:
        snap = Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir, local_files_only=True))
        return pick(snap, model, gguf_file)
    except Ambiguous:
        raise  # the cache has it: the user names one file, the hub would not choose either
    except LocalEntryNotFoundError:  # (a FileNotFoundError too; its advice is for Python callers)
        cached = "not there"
    except FileNotFoundError as e:  # pick(): the snapshot holds nothing servable
        cached = str(e)
    except Exception:  # huggingface_hub's other "not in the cache" errors
        cached = "not there"
    if (why := hub_unreachable()) is not None:
        raise FileNotFoundError(
            f"--model {model!r}: not in the Hugging Face cache ({cache_dir or HF_HUB_CACHE}: {cached}) and the hub "
            f"is unreachable ({why}); download it where the hub answers (`hf download {repo}`), "
            "or give a local .gguf file or checkpoint directory"
        )
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
    raise Ambiguous(_which(repo, ggufs))


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
    names = [str(g.relative_to(snap)) for g in ggufs]
    raise (Ambiguous if ggufs else FileNotFoundError)(_which(model, names, snap))


def _which(model: str, ggufs: list[str], where: Path | None = None) -> str:
    at = f" (snapshot {where})" if where else ""
    if ggufs:
        return f"--model {model!r}{at} holds {len(ggufs)} GGUF files: name one with --gguf-file ({', '.join(ggufs)})"
    return f"--model {model!r}{at}: neither an HF checkpoint (config.json + *.safetensors) nor a GGUF file"
