"""Docs that cannot drift (issue 43 item 4): every backticked `file.py` in README.md and docs/
names a file of the repository, and every backticked `module.name` whose module is one of
tailgate's names something that module defines (a function, class, constant or attribute)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = re.compile(r"`([^`\n]+)`")
FILE = re.compile(r"^[\w./-]+\.(py|sh|c|h|toml|json)$")
DOTTED = re.compile(r"^(?:[\w/]+/)?(\w+)\.(\w+)(?:\(\))?$")
# Files the docs name that are not the repository's: a user's config, a checkpoint's, llama.cpp's converter.
NOT_OURS = {
    "serve.toml",
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "convert_hf_to_gguf.py",
}
EXTENSIONS = {"py", "md", "log", "html", "js", "css", "rs", "safetensors", "json", "gguf", "toml", "txt", "c", "h"}
NOT_CODE = {
    "kernels.measured",  # a key of /version's JSON, not the module's name
    "tokenizer.model",  # SentencePiece's file name (docs/benchmarks/real-shapes.md)
}


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def modules() -> dict[str, list[Path]]:
    out: dict[str, list[Path]] = {}
    for p in (ROOT / "tailgate").rglob("*.py"):
        out.setdefault(p.stem if p.stem != "__init__" else p.parent.name, []).append(p)
    return out


def defines(path: Path, name: str) -> bool:
    text = path.read_text()
    return bool(
        re.search(rf"^\s*(def|class|async def)\s+{name}\b|^\s*{name}\s*[:=]|self\.{name}\b|\b{name}\s*=", text, re.M)
    )


def test_every_backticked_file_in_the_docs_exists():
    files = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if not {".git", ".venv"} & set(p.parts)]
    missing = []
    for doc in docs():
        for m in CODE.finditer(doc.read_text()):
            ref = m.group(1).split(":")[0].strip()
            if not FILE.match(ref) or ref.startswith("/") or ref in NOT_OURS:
                continue
            # a path from the root, or the tail of one (`csrc/q8.c`, `families/llama.py`, `walk.py`)
            if not any(f == ref or f.endswith("/" + ref.removeprefix("./")) for f in files):
                missing.append(f"{doc.relative_to(ROOT)}: `{ref}`")
    assert not missing, "docs name files that do not exist:\n" + "\n".join(missing)


def test_every_backticked_module_name_in_the_docs_is_defined_by_that_module():
    mods, missing = modules(), []
    for doc in docs():
        for m in CODE.finditer(doc.read_text()):
            ref = m.group(1).strip()
            d = DOTTED.match(ref)
            if not d or ref in NOT_CODE or d.group(1) not in mods or d.group(1) == "tailgate":
                continue
            if d.group(2) in EXTENSIONS:
                continue
            if not any(defines(p, d.group(2)) for p in mods[d.group(1)]):
                missing.append(f"{doc.relative_to(ROOT)}: `{ref}`")
    assert not missing, "docs name what their module does not define:\n" + "\n".join(missing)
