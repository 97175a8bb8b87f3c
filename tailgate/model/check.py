"""`tailgate check --against-hf DIR`: our logits for a checkpoint directory against HF
transformers' own implementation of it, in fp32.

HF runs first and is freed before our runtime loads, so the peak is one fp32 copy of the weights
plus the reference logprobs, not two models. The tolerances are the oracle gates'
(tests/test_oracle.py): measured floor mean |Δ logprob| ~1e-6, p99 ~1e-5 on Gemma 3 270M.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path

import torch

MEAN_TOL = 1e-4
P99_TOL = 5e-4
REGRET_TOL = 0.2  # logprob the reference gives up where our top token differs from its own
# The quality gate's bounds for every kernel plan a CPU can choose (tests/test_oracle.py): teacher-
# forced logprobs against HF transformers in fp32 on the oracle sequences, (mean |Δlogprob|, p99 over
# positions of the per-position mean, KL(HF || ours) per sequence). Keyed by the plan's coarsest
# arithmetic (`precision_class`); each bound about 2x the worst of both models measured on AMD EPYC
# Zen 3 (docs/kernels.md, "The quality gate"), so that a wrong rounding lands outside it.
PLAN_BOUNDS = {
    "fp32": (MEAN_TOL, P99_TOL, 1e-5),  # measured: 1.8e-5, 5.9e-5, 5e-8 (F.linear + SDPA: 0, the same bits)
    "bf16": (0.3, 1.0, 0.006),  # measured: 0.144, 0.471, 0.0026 (all-bf16, both models)
    "gguf": (
        0.45,
        1.5,
        0.02,
    ),  # measured: 0.226, 0.72, 0.0091 (SmolLM2; Gemma 3 0.193, 0.598, 0.0027: panels from the blocks)
    "q8": (0.4, 1.5, 0.02),  # measured: 0.22, 0.77, 0.0091 (AVX2 panels, every layer call, fp16 KV)
    "int8": (0.45, 1.0, 0.025),  # measured: 0.21, 0.38, 0.012
    "int4": (2.5, 3.5, 0.4),  # measured: 1.11, 1.51, 0.19 (lossy on this file: opt-in)
}


def precision_class(plan) -> str:
    """The coarsest arithmetic a `KernelPlan` puts on the path: its quantized kernel (for the calls
    under its cut), else bf16 activations or weights, else exact fp32 (fp16 KV only comes with q8)."""
    if plan.quant == "gguf":  # blocks or their q8 panels take every call
        return "gguf"
    if plan.quant and max(plan.quant_rows) > 0:
        return plan.quant
    if torch.bfloat16 in (plan.dtype, plan.dense_dtype) or plan.kv != torch.float32:
        return "bf16"
    return "fp32"


PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village by the sea,"]
LONG_TEXT = (  # repeated into the text that crosses a sliding window (the tests' long sequences too)
    "The river town woke slowly. Fishermen dragged their boats across the wet stones while the baker "
    "counted loaves by the door, and the schoolteacher rang a bell that nobody seemed to hear. "
    "By noon the market had filled with cloth merchants, spice sellers and a man who sold nothing but "
    "keys, hundreds of them, each tagged with the name of a door he swore still existed somewhere. "
)


@dataclass
class SeqResult:
    length: int
    mean: float  # mean |Δ logprob| over positions and vocabulary
    p99: float  # p99 over positions of the per-position mean
    max: float
    regret: float
    kl: float = 0.0  # mean over positions of KL(reference || ours)

    @property
    def ok(self) -> bool:
        return self.mean < MEAN_TOL and self.p99 < P99_TOL and self.regret <= REGRET_TOL


@dataclass
class CheckResult:
    sequences: list[SeqResult] = field(default_factory=list)
    greedy_ours: list[int] = field(default_factory=list)
    greedy_hf: list[int] = field(default_factory=list)

    @property
    def greedy_agree(self) -> int:
        n = 0
        for a, b in zip(self.greedy_ours, self.greedy_hf):
            if a != b:
                break
            n += 1
        return n

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.sequences) and self.greedy_agree == len(self.greedy_hf)


def sequences(tok, window: int | None) -> list[list[int]]:
    """The oracle prompts, plus one text 64 tokens longer than the sliding window (512 tokens when
    the model has none)."""
    seqs = [tok.encode(p) for p in PROMPTS]
    want = (window or 448) + 64
    long_ids = tok.encode(LONG_TEXT * (want // 40 + 2))[:want]
    return seqs + [long_ids]


def compare(ours: torch.Tensor, ref: torch.Tensor) -> SeqResult:
    """Teacher-forced logprobs [positions, vocab], ours against the reference's."""
    diff = (ours - ref).abs()
    top = ref.argmax(-1)
    regret = (ref.gather(-1, top[:, None]) - ref.gather(-1, ours.argmax(-1)[:, None])).max().item()
    kl = (ref.exp() * (ref - ours)).sum(-1).mean().item()
    return SeqResult(
        ours.shape[0], diff.mean().item(), torch.quantile(diff.mean(-1), 0.99).item(), diff.max().item(), regret, kl
    )


def check_against_hf(
    directory: str | Path, greedy_tokens: int = 16, kernels: str = "auto", log=print, model: str | Path | None = None
) -> CheckResult:
    """`kernels`: our fp32 plan ("auto": what `serve --dtype fp32` runs here; "torch": plain torch ops).
    `model`: what tailgate loads (default: the same directory), e.g. a GGUF file of the same weights.
    The family (config reading, weight names, forward) is the registry's (`model/families/`), found
    from the directory's config.json."""
    from .formats.hf_loader import read_spec, read_tokenizer_meta

    directory = Path(directory)
    spec = read_spec(directory)  # refuses an unsupported config before any weights load (or transformers' import)

    from transformers import AutoModelForCausalLM

    from ..engine.pages import KVBook, pool_pages
    from .runtime import serial
    from .runtime.runner import ModelRunner
    from .tokenizer import Tokenizer
    from .formats.weights import load_model

    tok = Tokenizer(str(directory / "tokenizer.json"), read_tokenizer_meta(directory, spec))
    seqs = sequences(tok, spec.sliding_window if spec.has_sliding else None)
    log(f"HF transformers: loading {directory} in fp32")
    hf = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    refs = []
    with torch.inference_mode():
        for ids in seqs:
            refs.append(torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1))
        # HF stops at an end-of-sequence token (kept in its output); ours runs on without EOS ids,
        # so the comparison covers HF's tokens.
        out = hf.generate(torch.tensor([seqs[0]]), max_new_tokens=greedy_tokens, do_sample=False)
    greedy_hf = out[0, len(seqs[0]) :].tolist()
    del hf, out
    gc.collect()
    log("tailgate: loading the same directory in fp32")
    m = load_model(str(model or directory), log=log)
    pages = pool_pages(max(len(s) for s in seqs) + greedy_tokens + 16, 1, m.spec.sliding_window)
    runner = ModelRunner(m.spec, m.weights, pages, dtype="fp32", device="cpu", kernels=kernels)
    book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    res = CheckResult(greedy_hf=greedy_hf)
    for ids, ref in zip(seqs, refs):
        res.sequences.append(
            compare(torch.log_softmax(serial.teacher_forced_logits(runner, book, ids).float(), -1), ref)
        )
    res.greedy_ours = serial.generate(runner, book, seqs[0], greedy_tokens)[: len(greedy_hf)]
    return res


def report(res: CheckResult) -> str:
    lines = [f"{'tokens':>7} {'mean|Δlp|':>10} {'p99':>9} {'max':>9} {'KL':>9} {'regret':>7}  verdict"]
    for s in res.sequences:
        lines.append(
            f"{s.length:>7} {s.mean:>10.2e} {s.p99:>9.2e} {s.max:>9.2e} {s.kl:>9.2e} {s.regret:>7.3f}  "
            f"{'ok' if s.ok else 'FAIL'}"
        )
    lines.append(f"greedy: {res.greedy_agree}/{len(res.greedy_hf)} tokens equal to HF generate()")
    lines.append(
        f"tolerances: mean < {MEAN_TOL:g}, p99 < {P99_TOL:g}, regret <= {REGRET_TOL}; "
        f"verdict: {'PASS' if res.ok else 'FAIL'}"
    )
    return "\n".join(lines)
