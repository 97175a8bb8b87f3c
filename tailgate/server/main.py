"""`tailgate serve`: knobs and the model's shapes first, then the HTTP server, then the model (health
says 503 meanwhile; a load failure ends the process non-zero)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

from ..config import resolve
from .app import ServerState, create_app


LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def api_key(cli_value: str | None, environ) -> str | None:
    """--api-key, else TAILGATE_API_KEY (a key on the command line is visible in `ps`)."""
    return cli_value if cli_value is not None else environ.get("TAILGATE_API_KEY") or None


def state_settings(args, environ) -> dict:
    """The `ServerState` settings the serve flags give, in one place: the single server and every
    replica of a fleet (fleet/launch.py's spec) build their app's state from the same dict (issue
    37: --allowed-origins and --sse-keep-alive never reached the replicas; a CORS preflight got 405)."""
    return {
        "api_key": api_key(args.api_key, environ),
        "max_queued_requests": args.max_queued_requests,
        "max_queued_tokens": args.max_queued_tokens,
        "max_body_bytes": args.max_body_mb << 20,
        "allowed_origins": tuple(o.strip() for o in (args.allowed_origins or "").split(",") if o.strip()),
        "keep_alive_s": args.sse_keep_alive,
        "delivery_wait_s": args.delivery_wait_ms / 1000,
    }


def exposure_warning(host: str, key: str | None) -> str | None:
    """What `serve` warns at start when it binds beyond loopback without an API key (None: nothing
    to say). It still starts: a trusted network or a proxy in front may be the point."""
    if host.strip("[]").lower() in LOOPBACK or key:
        return None
    return (
        f"binding {host} without an API key: anyone who can reach this port can use the model "
        "(set --api-key or TAILGATE_API_KEY)"
    )


def chat_template(cli_value: str | None, environ) -> str | None:
    """--chat-template, else TAILGATE_CHAT_TEMPLATE: the template's text (a file's, or the value
    itself, as vLLM reads it), compiled in transformers' environment; ValueError naming the source
    for a file that cannot be read or a template that does not compile."""
    from ..model.tokenizer import compile_chat_template, load_chat_template

    name, raw = (
        ("--chat-template", cli_value)
        if cli_value is not None
        else ("TAILGATE_CHAT_TEMPLATE", environ.get("TAILGATE_CHAT_TEMPLATE") or None)
    )
    if raw is None:
        return None
    try:
        text = load_chat_template(raw)
        compile_chat_template(text)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return text


def allowed_hosts(bind: str, extra: str | None) -> frozenset | None:
    """Host header names a server answers. Bound to loopback: only loopback names (a web page
    that rebinds its own DNS name to 127.0.0.1 must not reach it), plus --allowed-hosts. Bound
    elsewhere: any, unless --allowed-hosts lists them. `*` in the list: any."""
    names = {h.strip().strip("[]").lower() for h in (extra or "").split(",") if h.strip()}
    if "*" in names:
        return None
    if bind.strip("[]").lower() in LOOPBACK:
        return frozenset(LOOPBACK | names)
    return frozenset(names | {bind.strip("[]").lower()}) if names else None


def _build_grammar_vocabulary(tokenizer) -> None:
    """The grammar engine's view of the vocabulary (model/constraint.py), built before `ready`:
    built at the first structured request instead, it held the GIL for its whole build (3.1 s for
    Gemma 3's 262k tokens on AMD EPYC Zen 5, 8-56 s on a loaded Zen 3), stalling every live stream
    and that request (issue 37). `--grammar-warmup false` leaves it to the first request."""
    from ..model.constraint import book_for

    t0 = time.monotonic()
    book_for(tokenizer).tokenizer
    logging.getLogger("tailgate").info(
        "structured outputs: the grammar engine's vocabulary built in %.1f s", time.monotonic() - t0
    )


def serve(args, lookup) -> int:
    import uvicorn

    cfg = resolve(lookup)  # refuses bad knobs before anything loads (KnobError -> exit 2 in cli)
    try:  # a template file that cannot be read, or a template that does not compile: before any weights
        template = chat_template(getattr(args, "chat_template", None), os.environ)
    except ValueError as e:
        print(f"tailgate: {e}", file=sys.stderr)
        return 2
    from ..assemble import PreflightError, preflight

    # The kernel plan, the model file and all that its shapes decide, before the port binds or any
    # weights load (KernelError, FileNotFoundError, KnobError -> exit 2 in cli).
    try:
        plan, name = preflight(args.model, cfg, args.dtype, args.kernels, args.device)
    except PreflightError as e:
        print(f"tailgate: {e}", file=sys.stderr)
        return 2
    from .logs import configure

    configure(args.log_level, args.log_format)
    if (why := exposure_warning(args.host, api_key(args.api_key, os.environ))) is not None:
        logging.getLogger("tailgate").warning(why)
    state = ServerState(
        served_name=args.served_model_name or name,
        allowed_hosts=allowed_hosts(args.host, args.allowed_hosts),
        kernels=plan.as_dict(),
        **state_settings(args, os.environ),
    )
    app = create_app(state)
    failed: list[BaseException] = []

    def load():
        try:
            # transformers' template renderer takes ~1 s to import (not torch): import it beside the
            # weights' load, so compiling the template below costs milliseconds.
            from ..model.tokenizer import import_template_renderer

            warm = threading.Thread(target=import_template_renderer, name="tailgate-template", daemon=True)
            warm.start()
            import torch

            from ..assemble import build_engine

            if args.threads:
                torch.set_num_threads(args.threads)
            engine, model, settled = build_engine(
                args.model,
                cfg,
                dtype=args.dtype,
                device=args.device,
                kernels=args.kernels,
                log=logging.getLogger("tailgate").info,
            )
            warm.join()
            if args.grammar_warmup:
                _build_grammar_vocabulary(model.tokenizer)
            if template is not None:
                model.tokenizer.set_chat_template(template)
            elif (why := model.tokenizer.compile_chat_template()) is not None:
                logging.getLogger("tailgate").warning("chat requests will get a 400: %s", why)
            state.model, state.cfg = model, settled
            if state.sampling_defaults:
                logging.getLogger("tailgate").info(
                    "sampling defaults from the model's generation_config.json (a request's own values win): %s",
                    state.sampling_defaults,
                )
            if engine.probe is not None:  # this CPU's measured step costs beside the plan in /version
                state.kernels = {**(state.kernels or {}), "measured": engine.probe}
            engine.on_death.append(died)
            engine.delivery_wait_s = state.delivery_wait_s
            engine.start()
            state.engine = engine
            url = f"http://{f'[{args.host}]' if ':' in args.host else args.host}:{args.port}"
            logging.getLogger("tailgate").info(
                "ready: open %s/ (chat playground) and %s/dashboard (the engine "
                "live); serving %s (max_context=%d, slots=%d, KV cache %s MiB, door=%s); %s",
                url,
                url,
                state.served_name,
                settled.max_context,
                settled.decode_slots,
                (engine.kv or {}).get("mib", "?"),
                settled.admit_coalesce_ms or "off",
                state.model_card["note"],
            )
        except Exception as e:
            # Like vLLM: a model that cannot load ends the process non-zero (after the traceback),
            # so a supervisor restarts or reports it instead of polling a server that never serves.
            # should_exit is uvicorn's own stop; set before its startup, it binds and stops at once.
            state.load_error = f"model failed to load: {e}"
            logging.getLogger("tailgate").exception("model failed to load; shutting down")
            failed.append(e)
            server.should_exit = True

    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.drain_timeout,
        access_log=False,
        # json: uvicorn's own lines go through the root logger's JSON handler too
        **({"log_config": None} if args.log_format == "json" else {}),
    )
    server = uvicorn.Server(config)

    def died(e: BaseException) -> None:
        # Like vLLM: a dead engine takes the process down (non-zero) so a supervisor restarts it;
        # open requests were already failed, new ones get 503 until the server has stopped.
        logging.getLogger("tailgate").error("engine died (%r); shutting down", e)
        server.should_exit = True

    threading.Thread(target=load, name="tailgate-load", daemon=True).start()
    server.run()
    if failed:
        return 1
    if state.engine is not None:
        state.engine.stop()
        if state.engine.error is not None:
            return 1
    return 0
