"""The CUDA path, checked in one run on a lent GPU machine (see docs/benchmarks/cuda-h200.md).

That machine cannot reach the package registries and its working tree is capped far below the
GGUF's 253 MB, so the check builds a checkpoint of Gemma 3 270M's exact architecture with random
weights (HF transformers' own initialisation, fixed seed) and the real Gemma tokenizer, then:

1. oracle: teacher-forced logits of tailgate on CUDA (fp32, whole and 128-row chunks) vs HF
   transformers on CUDA (fp32, eager attention), across the 512-token sliding window; bf16 vs fp32;
2. engine: the batched engine on CUDA (walk on, mixed steps) is token-exact with the serial path;
3. `tailgate bench step` on CUDA (absolute step times);
4. a live `tailgate serve` on CUDA under `tailgate bench serve` (absolute tok/s, TTFT, ITL).

Usage (on the GPU machine): python3 scripts/cuda_check.py --carry .devcarry --out "$OUT"
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

DEV = "cuda"  # --device cpu dry-runs the whole check on a machine without a GPU
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

GEMMA3_270M = dict(  # the shapes Gemma 3 270M's GGUF declares
    vocab_size=262144,
    hidden_size=640,
    intermediate_size=2048,
    num_hidden_layers=18,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=256,
    max_position_embeddings=32768,
    rms_norm_eps=1e-6,
    sliding_window=512,
    query_pre_attn_scalar=256,
    hidden_activation="gelu_pytorch_tanh",
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
    rope_parameters={
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    bos_token_id=2,
    eos_token_id=1,
    pad_token_id=0,
    tie_word_embeddings=True,
)


def make_checkpoint(carry: Path, out: Path):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(**GEMMA3_270M)
    model = Gemma3ForCausalLM(cfg).float().eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    with gzip.open(carry / "tokenizer.json.gz") as src, open(out / "tokenizer.json", "wb") as dst:
        shutil.copyfileobj(src, dst)
    shutil.copy(carry / "tokenizer_config.json", out / "tokenizer_config.json")
    return model


def oracle(hf, ckpt: Path, report: dict):
    from tailgate.engine.pages import KVBook, pool_pages
    from tailgate.model.runtime import serial
    from tailgate.model.runtime.runner import ModelRunner
    from tailgate.model.formats.weights import load_model
    from harness import ids

    m = load_model(str(ckpt), log=print)
    hf = hf.to(DEV).eval()
    hf.config._attn_implementation = "eager"
    seqs = [ids(40), ids(700, 3)]  # the second crosses the 512-token sliding window
    res = {}
    for dtype in ("fp32", "bf16"):
        pages = pool_pages(1024, 2, m.spec.sliding_window, transient_prompts=2)
        runner = ModelRunner(m.spec, m.weights, pages, dtype=dtype, device=DEV)
        book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
        for n, seq in enumerate(seqs):
            with torch.no_grad():
                ref = hf(torch.tensor([seq], device=DEV)).logits[0].float().log_softmax(-1)
            for chunk in (None, 128):
                ours = serial.teacher_forced_logits(runner, book, seq, chunk=chunk).float().log_softmax(-1)
                d = (ours - ref).abs()
                key = f"{dtype}/len{len(seq)}/chunk{chunk or 'whole'}"
                res[key] = dict(
                    max_abs_dlogprob=d.max().item(),
                    mean_abs_dlogprob=d.mean().item(),
                    argmax_agree=(ours.argmax(-1) == ref.argmax(-1)).float().mean().item(),
                )
                print("oracle", key, res[key], flush=True)
        del runner
    report["oracle"] = res
    hf.to("cpu")
    torch.cuda.empty_cache() if DEV == "cuda" else None
    return m


def engine_exact(m, report: dict):
    from tailgate.engine.pages import KVBook, pool_pages
    from tailgate.model.runtime import serial
    from tailgate.model.runtime.runner import ModelRunner
    from harness import Harness, ids

    prompts = [ids(n, s) for s, n in enumerate((20, 90, 300, 600, 33, 256, 511, 130))]
    pages = pool_pages(1024, 1, m.spec.sliding_window, transient_prompts=1)
    runner = ModelRunner(m.spec, m.weights, pages, dtype="fp32", device=DEV)
    book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    want = [serial.generate(runner, book, p, 24) for p in prompts]
    del runner
    t0 = time.monotonic()
    with Harness(m, dtype="fp32", device=DEV, DECODE_SLOTS="8", MIX_CHUNK_TOKENS="256") as h:
        reqs = []
        for p in prompts:
            reqs.append(h.submit(p, max_tokens=24))
            time.sleep(0.01)  # arrivals into a live batch: walk rounds ride decode rows
        assert h.wait(lambda: all(h.done(r) for r in reqs), 300)
        got = [h.tokens(r) for r in reqs]
        causes = sorted({ev.cause for evs in h.steps for ev in evs if hasattr(ev, "cause")})
    exact = [g == w for g, w in zip(got, want)]
    report["engine"] = dict(exact=exact, all_exact=all(exact), seconds=time.monotonic() - t0, causes=causes)
    print("engine", report["engine"], flush=True)


def run(cmd: list[str], report: dict, key: str, timeout: float):
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    print(p.stdout[-6000:], p.stderr[-3000:], flush=True)
    report[key] = dict(rc=p.returncode, stdout=p.stdout[-12000:])


def http(ckpt: Path, report: dict, out: Path, cells: str):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "tailgate.cli"]
    log = open(out / "serve.log", "w")
    srv = subprocess.Popen(
        cli
        + [
            "serve",
            "--model",
            str(ckpt),
            "--device",
            DEV,
            "--port",
            "8011",
            "--decode-slots",
            "64",
            "--max-context",
            "2048",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        import httpx

        end = time.monotonic() + 240
        while time.monotonic() < end:
            try:
                if httpx.get("http://127.0.0.1:8011/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if srv.poll() is not None:
                raise RuntimeError("server exited; see serve.log")
            time.sleep(0.5)
        report["version"] = httpx.get("http://127.0.0.1:8011/version").json()
        for c, n in (map(int, cell.split(":")) for cell in cells.split(",")):
            run(
                cli
                + [
                    "bench",
                    "serve",
                    "--base-url",
                    "http://127.0.0.1:8011",
                    "--model",
                    ckpt.name,
                    "--tokenizer",
                    str(ckpt),
                    "--num-prompts",
                    str(n),
                    "--max-concurrency",
                    str(c),
                    "--random-input-len",
                    "256",
                    "--random-output-len",
                    "64",
                    "--ignore-eos",
                    "--save-result",
                    str(out / f"serve-c{c}.json"),
                ],
                report,
                f"serve_c{c}",
                300,
            )
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--carry", default=".devcarry")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/cuda-check"))
    ap.add_argument("--ckpt", default="/tmp/gemma3-270m-random")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--serve-cells", default="16:128,64:256", help="concurrency:prompts,...")
    a = ap.parse_args()
    global DEV
    DEV = a.device
    out, ckpt = Path(a.out), Path(a.ckpt)
    out.mkdir(parents=True, exist_ok=True)
    report = dict(
        torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if DEV == "cuda" else "none", started=time.time()
    )
    print(report, flush=True)
    steps = [
        ("checkpoint", lambda: report.__setitem__("_hf", make_checkpoint(Path(a.carry), ckpt))),
        ("oracle", lambda: report.__setitem__("_m", oracle(report["_hf"], ckpt, report))),
        ("engine", lambda: engine_exact(report["_m"], report)),
        (
            "step",
            lambda: run(
                [
                    sys.executable,
                    "-m",
                    "tailgate.cli",
                    "bench",
                    "step",
                    "--model",
                    str(ckpt),
                    "--device",
                    DEV,
                    "--only-chosen",
                ],
                report,
                "bench_step",
                300,
            ),
        ),
        (
            "step_fp32",
            lambda: run(
                [
                    sys.executable,
                    "-m",
                    "tailgate.cli",
                    "bench",
                    "step",
                    "--model",
                    str(ckpt),
                    "--device",
                    DEV,
                    "--dtype",
                    "fp32",
                    "--only-chosen",
                ],
                report,
                "bench_step_fp32",
                300,
            ),
        ),
        ("http", lambda: http(ckpt, report, out, a.serve_cells)),
    ]
    for name, fn in steps:
        t0 = time.monotonic()
        try:
            fn()
        except Exception:
            report.setdefault("errors", {})[name] = traceback.format_exc()[-3000:]
            print("FAILED", name, report["errors"][name], flush=True)
        report.setdefault("seconds", {})[name] = round(time.monotonic() - t0, 1)
        print("section", name, report["seconds"][name], "s", flush=True)
        (out / "cuda-check.json").write_text(
            json.dumps({k: v for k, v in report.items() if not k.startswith("_")}, indent=1, default=str)
        )
    return 1 if report.get("errors") else 0


if __name__ == "__main__":
    sys.exit(main())
