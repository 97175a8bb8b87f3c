"""`tailgate` command line: serve, generate, bench."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .server.args import uint_arg


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="gemma3-270m",
        help="gemma3-270m | smollm2-135m | path to a .gguf file | HF checkpoint directory | "
        "Hugging Face Hub id ORG/NAME[@REVISION] (the hub cache first, then a download)",
    )
    p.add_argument("--gguf-file", default=None, help="with a hub id (or a directory) holding several GGUF files: which")
    p.add_argument("--dtype", default="auto", help="auto | bf16 | fp32 | fp16 (auto: bf16 where the CPU has it)")
    p.add_argument(
        "--kernels",
        default=os.environ.get("TAILGATE_KERNELS", "auto"),
        help="auto | torch | onednn | q8 | gguf | int8 | int4 (env TAILGATE_KERNELS; auto: the fastest for this "
        "CPU, see docs/kernels.md; an explicit --dtype fp32/bf16 keeps weights dense)",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--threads", type=uint_arg(), default=0, help="torch threads (0 = torch's default)")


def package_version() -> str:
    """The installed distribution's version (what pip and /version report), else the source tree's."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tailgate")
    except PackageNotFoundError:
        from . import __version__

        return __version__


def uint_list(raw: str) -> tuple[int, ...]:
    """Comma-separated integers, each read as uint_arg reads one."""
    return tuple(uint_arg(1)(c) for c in raw.split(","))


def cmd_generate(args) -> int:
    import torch

    from .engine.pages import KVBook, pool_pages
    from .model.runtime import serial
    from .model.runtime.runner import ModelRunner
    from .model.runtime.sampler import SamplingParams
    from .model.formats.weights import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    from .model.kernels.choice import choose

    plan = choose(args.dtype, args.kernels, args.device)  # refuses before any weights load
    print(f"[{plan.line()}]", file=sys.stderr)
    t0 = time.perf_counter()
    m = load_model(args.model)
    ids = (
        m.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
        if args.chat
        else m.tokenizer.encode(args.prompt)
    )
    ctx = len(ids) + args.max_tokens
    pages = pool_pages(ctx, 1, m.spec.sliding_window)
    runner = ModelRunner(m.spec, m.weights, pages, plan=plan)
    book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    print(
        f"[loaded {m.source.name} in {time.perf_counter() - t0:.1f}s, {runner.dtype}, {runner.device}]", file=sys.stderr
    )
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    sys.stdout.write(args.prompt if not args.chat else "")
    produced: list[int] = []
    shown = ""

    def show(tok):
        nonlocal shown
        produced.append(tok)
        text = m.tokenizer.decode(produced)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            sys.stdout.write(text[len(shown) :])
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
    step.run(
        args.model,
        args.dtype,
        context=args.context,
        reps=args.reps,
        kernels=args.kernels,
        compare=not args.only_chosen,
        device=args.device,
    )
    return 0


def cmd_bench_kernels(args) -> int:
    import torch

    from .bench import kernels

    if args.threads:
        torch.set_num_threads(args.threads)
    kernels.run(args.model, reps=args.reps)
    return 0


def local_model(args) -> None:
    """A hub id (or --gguf-file) resolved once to the local path every later step reads; it is
    served under the repository id unless --served-model-name says otherwise."""
    from .model.formats.hub import is_hub_id
    from .model.formats.weights import resolve_model_path, served_name

    if args.gguf_file is not None and not (is_hub_id(args.model) or os.path.isdir(args.model)):
        raise FileNotFoundError(
            f"--gguf-file {args.gguf_file!r} picks a file of a hub id or a directory, not of --model {args.model!r}"
        )
    if is_hub_id(args.model) or args.gguf_file is not None:
        path = (
            resolve_model_path(args.model, args.gguf_file)
            if is_hub_id(args.model)
            else os.path.join(args.model, args.gguf_file)
        )
        if not os.path.isfile(path) and not os.path.isdir(path):
            raise FileNotFoundError(f"--gguf-file: no {path}")
        args.served_model_name = getattr(args, "served_model_name", None) or served_name(args.model)
        args.model = str(path)


def cmd_serve(args) -> int:
    from .config import cli_lookup
    from .server.settings import SettingsError, apply

    try:  # flags, TAILGATE_<NAME>, --config: one resolved value each, before anything loads
        apply(args)
        local_model(args)
    except (SettingsError, FileNotFoundError) as e:
        print(f"tailgate: {e}", file=sys.stderr)
        return 2

    if args.replicas > 1:
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            print(
                "tailgate: --replicas needs Ray Serve, the `ray` extra: pip install .[ray] "
                "(or bash scripts/setup --ray)",
                file=sys.stderr,
            )
            return 2
        from .fleet.launch import serve_fleet

        args.router = args.router or "prefix"
        return serve_fleet(args, cli_lookup(args))
    for flag, value in (("--ray-address", args.ray_address), ("--router", args.router)):
        if value is not None:
            print(
                f"tailgate: {flag} {value!r} needs --replicas N with N > 1 (one replica is served without Ray)",
                file=sys.stderr,
            )
            return 2
    from .server.main import serve

    return serve(args, cli_lookup(args))


def cmd_check(args) -> int:
    from .model.check import check_against_hf, report

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        res = check_against_hf(
            args.against_hf,
            greedy_tokens=args.greedy_tokens,
            kernels=args.kernels,
            log=lambda m: print(f"[{m}]", file=sys.stderr),
            model=args.model,
        )
    except ValueError as e:  # an unsupported config: named, before any weights load
        print(f"tailgate: {e}", file=sys.stderr)
        return 2
    print(report(res))
    return 0 if res.ok else 1


def cmd_bench_engine(args) -> int:
    import json

    import torch

    from .bench import engine_load

    if args.threads:
        torch.set_num_threads(args.threads)
    doors = tuple(args.doors.split(","))
    res = engine_load.run(
        args.model,
        doors,
        args.concurrency,
        args.rounds,
        args.input_len,
        args.output_len,
        args.dtype,
        args.slots,
        not args.no_bursty,
    )
    print(engine_load.table(res, doors))
    if args.save:
        with open(args.save, "w") as f:
            json.dump(res, f, indent=1)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailgate", description="LLM serving engine that protects the decode tail")
    parser.add_argument("--version", action="version", version=f"tailgate {package_version()}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    from .server.args import add_serve_args

    sv = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    _add_model_args(sv)
    add_serve_args(sv)
    sv.set_defaults(fn=cmd_serve)
    g = sub.add_parser("generate", help="one-shot generation from a prompt")
    g.add_argument("prompt")
    _add_model_args(g)
    g.add_argument("--max-tokens", type=uint_arg(1), default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=uint_arg(), default=0)
    g.add_argument("--seed", type=uint_arg(), default=None)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.set_defaults(fn=cmd_generate)
    ck = sub.add_parser("check", help="our logits vs HF transformers' for a checkpoint directory (fp32)")
    ck.add_argument(
        "--against-hf",
        required=True,
        metavar="DIR",
        help="HF checkpoint directory (config.json, *.safetensors, tokenizer.json)",
    )
    ck.add_argument(
        "--model",
        default=None,
        metavar="PATH",
        help="what tailgate loads instead of DIR: a .gguf file of the same weights (HF still runs DIR)",
    )
    ck.add_argument("--greedy-tokens", type=uint_arg(), default=16)
    ck.add_argument("--kernels", default="auto", help="our fp32 kernels: auto (what serve --dtype fp32 runs) | torch")
    ck.add_argument("--threads", type=uint_arg(), default=0, help="torch threads (0 = torch's default)")
    ck.set_defaults(fn=cmd_check)
    bench = sub.add_parser("bench", help="benchmarks that print figures").add_subparsers(dest="bench", required=True)
    b = bench.add_parser("step", help="step latency: decode batches and prefill segments vs matmul peak")
    _add_model_args(b)
    b.add_argument("--context", type=uint_arg(1), default=256, help="KV tokens per decode row")
    b.add_argument("--reps", type=uint_arg(1), default=5)
    b.add_argument("--only-chosen", action="store_true", help="skip the alternative kernel plans")
    b.set_defaults(fn=cmd_bench_step)
    k = bench.add_parser(
        "kernels", help="layer and head matmul times per kernel and row count (the kernel choice's table)"
    )
    _add_model_args(k)
    k.add_argument("--reps", type=uint_arg(1), default=3)
    k.set_defaults(fn=cmd_bench_kernels)
    e = bench.add_parser("engine", help="in-process load generator: door off vs on, alternating rounds")
    _add_model_args(e)
    e.add_argument("--doors", default="off,300", help="comma-separated ADMIT_COALESCE_MS values, one arm each")
    e.add_argument("--concurrency", type=uint_list, default="4,8,16")
    e.add_argument("--rounds", type=uint_arg(1), default=2)
    e.add_argument("--input-len", type=uint_arg(1), default=256)
    e.add_argument("--output-len", type=uint_arg(1), default=64)
    e.add_argument("--slots", type=uint_arg(1), default=16)
    e.add_argument("--no-bursty", action="store_true")
    e.add_argument("--save", default=None, help="write the raw per-round results as JSON")
    e.set_defaults(fn=cmd_bench_engine)
    from .bench import serve as bench_serve

    bs = bench.add_parser("serve", help="serving benchmark against any OpenAI-compatible server")
    bench_serve.add_args(bs)
    bs.set_defaults(fn=bench_serve.main)
    from .bench import ab as bench_ab

    ba = bench.add_parser("ab", help="alternating A/B rounds of whole server configurations")
    bench_ab.add_args(ba)
    ba.set_defaults(fn=bench_ab.main)
    from .bench import soak as bench_soak

    bk = bench.add_parser("soak", help="minutes of hostile mixed load, then an audit of every response")
    bench_soak.add_args(bk)
    bk.set_defaults(fn=bench_soak.main)
    from .bench import plot as bench_plot

    bp = bench.add_parser("plot", help="ITL/TTFT CDFs and a token timeline from --save-detailed results")
    bench_plot.add_args(bp)
    bp.set_defaults(fn=bench_plot.main)
    from .sim import run as sim_run

    sm = sub.add_parser("sim", help="the real scheduler on a virtual clock with a step-cost model")
    sim_run.add_args(sm)
    sm.set_defaults(fn=cmd_sim)
    return parser


def cmd_sim(args) -> int:
    """`tailgate sim`: a simulated run (sim/run.py), or `sim calibrate`, which loads the model and
    so lives in bench/calibrate.py (the simulator never imports `model`)."""
    if args.action == "calibrate":
        from .bench.calibrate import calibrate

        return calibrate(args)
    from .sim import run as sim_run

    return sim_run.main(args)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .config import KnobError
    from .model.kernels.cpu import KernelError

    try:
        if args.fn is not cmd_serve and hasattr(args, "gguf_file"):  # serve resolves it after its settings
            local_model(args)
        return args.fn(args)
    except (KnobError, KernelError, FileNotFoundError) as e:
        print(f"tailgate: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
