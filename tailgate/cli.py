"""`tailgate` command line: serve, generate, bench."""
from __future__ import annotations

import argparse
import sys
import time


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="gemma3-270m",
                   help="gemma3-270m | smollm2-135m | path to a .gguf file | HF checkpoint directory")
    p.add_argument("--dtype", default="auto", help="auto | bf16 | fp32 | fp16 (auto: bf16 where the CPU has it)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")


def cmd_generate(args) -> int:
    import torch

    from .engine.pages import KVBook, pool_pages
    from .model import serial
    from .model.runner import ModelRunner
    from .model.sampler import SamplingParams
    from .model.weights import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    m = load_model(args.model)
    ids = m.tokenizer.encode_chat([{"role": "user", "content": args.prompt}]) if args.chat else m.tokenizer.encode(args.prompt)
    ctx = len(ids) + args.max_tokens
    pages = pool_pages(ctx, 1, m.spec.sliding_window)
    runner = ModelRunner(m.spec, m.weights, pages, dtype=args.dtype, device=args.device)
    book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    print(f"[loaded {m.source.name} in {time.perf_counter() - t0:.1f}s, {runner.dtype}, {runner.device}]", file=sys.stderr)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    sys.stdout.write(args.prompt if not args.chat else "")
    produced: list[int] = []
    shown = ""

    def show(tok):
        nonlocal shown
        produced.append(tok)
        text = m.tokenizer.decode(produced)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text

    t1 = time.perf_counter()
    out = serial.generate(runner, book, ids, args.max_tokens, params, eos_ids=m.tokenizer.eos_ids, on_token=show)
    dt = time.perf_counter() - t1
    print(f"\n[{len(out)} tokens in {dt:.2f}s, {len(out) / max(dt, 1e-9):.1f} tok/s]", file=sys.stderr)
    return 0


def cmd_bench_step(args) -> int:
    import torch

    from .bench import step

    if args.threads:
        torch.set_num_threads(args.threads)
    step.run(args.model, args.dtype, context=args.context, reps=args.reps)
    return 0


def cmd_serve(args) -> int:
    from .config import KNOB_NAMES, env_lookup
    from .server.main import serve

    lookup = env_lookup({name: getattr(args, "knob_" + name) for name in KNOB_NAMES})
    return serve(args, lookup)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tailgate", description="LLM serving engine that protects the decode tail")
    sub = parser.add_subparsers(dest="cmd", required=True)
    from .server.main import add_serve_args

    sv = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    _add_model_args(sv)
    add_serve_args(sv)
    sv.set_defaults(fn=cmd_serve)
    g = sub.add_parser("generate", help="one-shot generation from a prompt")
    g.add_argument("prompt")
    _add_model_args(g)
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.set_defaults(fn=cmd_generate)
    bench = sub.add_parser("bench", help="benchmarks that print figures").add_subparsers(dest="bench", required=True)
    b = bench.add_parser("step", help="step latency: decode batches and prefill segments vs matmul peak")
    _add_model_args(b)
    b.add_argument("--context", type=int, default=256, help="KV tokens per decode row")
    b.add_argument("--reps", type=int, default=5)
    b.set_defaults(fn=cmd_bench_step)
    args = parser.parse_args(argv)
    from .config import KnobError

    try:
        return args.fn(args)
    except (KnobError, FileNotFoundError) as e:
        print(f"tailgate: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
