"""`--model ORG/NAME[@REVISION]` through huggingface_hub (model/formats/hub.py): a cache laid out as the hub
lays it (models--ORG--NAME/refs/main -> snapshots/<commit>/...), built from the shipped
checkpoints, serves offline; what is neither cached nor downloadable refuses naming both."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from live import start_server, stop_server
from tailgate.model.formats import hub
from tailgate.model.formats.weights import resolve_model_path, served_name

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, repo: str, files: dict[str, Path | bytes], commit: str = COMMIT) -> Path:
    """A hub cache holding `repo` at `commit` (also its `main`): each file a symlink into blobs/, as
    huggingface_hub writes them (or the bytes given)."""
    d = root / ("models--" + repo.replace("/", "--"))
    snap = d / "snapshots" / commit
    snap.mkdir(parents=True)
    (d / "blobs").mkdir(exist_ok=True)
    (d / "refs").mkdir(exist_ok=True)
    (d / "refs" / "main").write_text(commit)
    for name, src in files.items():
        blob = d / "blobs" / f"{abs(hash((name, commit))):x}"
        if isinstance(src, bytes):
            blob.write_bytes(src)
        else:
            blob.symlink_to(src)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    return snap


@pytest.fixture(scope="module")
def smol_gguf() -> Path:
    return resolve_model_path("smollm2-135m")


def test_a_hub_id_in_the_cache_resolves_offline_to_its_one_gguf_or_its_checkpoint(tmp_path, smol_gguf, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    snap = hub_cache(tmp_path, "acme/smol-gguf", {"smol.gguf": smol_gguf, "README.md": b"# smol\n"})
    assert hub.resolve("acme/smol-gguf", cache_dir=str(tmp_path)) == snap / "smol.gguf"
    assert hub.resolve(f"acme/smol-gguf@{COMMIT}", cache_dir=str(tmp_path)) == snap / "smol.gguf"
    ckpt = hub_cache(
        tmp_path, "acme/smol-hf", {"config.json": b"{}", "model.safetensors": b"", "tokenizer.json": b"{}"}
    )
    assert hub.resolve("acme/smol-hf", cache_dir=str(tmp_path)) == ckpt
    assert served_name("acme/smol-gguf@main") == "acme/smol-gguf"


def test_a_repository_with_several_ggufs_needs_gguf_file_and_names_them(tmp_path, smol_gguf, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    snap = hub_cache(tmp_path, "acme/quants", {"m-Q4_K_M.gguf": smol_gguf, "m-Q8_0.gguf": smol_gguf})
    with pytest.raises(
        FileNotFoundError, match=r"holds 2 GGUF files: name one with --gguf-file \(m-Q4_K_M.gguf, m-Q8_0.gguf\)"
    ):
        hub.resolve("acme/quants", cache_dir=str(tmp_path))
    assert hub.resolve("acme/quants", "m-Q8_0.gguf", cache_dir=str(tmp_path)) == snap / "m-Q8_0.gguf"


def test_a_hub_id_neither_cached_nor_reachable_refuses_naming_the_cache_and_the_hub(tmp_path, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError) as e:
        hub.resolve("acme/absent", cache_dir=str(tmp_path))
    assert "not in the Hugging Face cache" in str(e.value) and str(tmp_path) in str(e.value)
    assert "the hub is unreachable (HF_HUB_OFFLINE is set)" in str(e.value)


def closed_port() -> str:
    """An endpoint nothing listens on: connecting to it is refused at once, as offline."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_uncached_hub_id_offline_refuses_at_once_with_a_line_a_person_can_act_on(tmp_path, monkeypatch):
    """Issue 44: huggingface_hub retried for 27-32 s, then the refusal quoted its Python advice."""
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", closed_port())
    for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(FileNotFoundError) as e:
        hub.resolve("acme/absent", cache_dir=str(tmp_path))
    msg = str(e.value)
    assert "the hub is unreachable (127.0.0.1:" in msg and "`hf download acme/absent`" in msg, msg
    assert "local_files_only" not in msg and "\n" not in msg


def test_a_cached_repository_of_several_ggufs_names_them_without_asking_the_hub(tmp_path, smol_gguf, monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", closed_port())
    hub_cache(tmp_path, "acme/quants", {"a.gguf": smol_gguf, "b.gguf": smol_gguf})
    with pytest.raises(hub.Ambiguous, match=r"name one with --gguf-file \(a.gguf, b.gguf\)"):
        hub.resolve("acme/quants", cache_dir=str(tmp_path))


def test_a_mistyped_relative_path_says_no_such_file_instead_of_asking_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not hub.is_hub_id("models/x.gguf")
    with pytest.raises(FileNotFoundError, match=r"'models/x.gguf': no such file or directory"):
        resolve_model_path("models/x.gguf")


def test_a_path_that_exists_is_a_path_even_when_it_looks_like_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "acme").mkdir()
    (tmp_path / "acme" / "local").mkdir()
    assert hub.is_hub_id("acme/remote") and not hub.is_hub_id("acme/local") and not hub.is_hub_id("./x.gguf")


def test_serve_answers_an_openai_chat_request_for_a_hub_id_from_the_cache(tmp_path, smol_gguf):
    hub_cache(tmp_path, "acme/smol-gguf", {"smol.gguf": smol_gguf})
    openai = pytest.importorskip("openai")
    p, base, _ = start_server(args=["--model", "acme/smol-gguf"], HF_HUB_CACHE=str(tmp_path), HF_HUB_OFFLINE="1")
    try:
        assert [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]] == ["acme/smol-gguf"]
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
        r = c.chat.completions.create(
            model="acme/smol-gguf", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
        )
        assert r.choices[0].message.content and r.usage.completion_tokens <= 4
    finally:
        stop_server(p)
