"""`tailgate serve --replicas N [--ray-address ADDR] [--router ...]`: the single-process server's
checks (knobs, chat template, kernels, the model's shapes, the KV budget: all before Ray starts or
any weights load), then Ray (a local instance started and stopped with the command, or the cluster
at ADDR), the engine deployment of N replicas with the fleet's router, and the front on --port."""

from __future__ import annotations

import logging
import os
import sys

from ..config import resolve, usable_cores

APP, DEPLOYMENT = "tailgate", "engine"
ROUTERS = ("prefix", "least-loaded", "random", "pow2")


def replica_spec(args, cfg, plan, template: str | None) -> dict:
    """What each replica is built from: the engine's settings, and `state`, the app's settings
    exactly as the single server derives them (`server.main.state_settings`), with the log format."""
    from ..model.formats.weights import served_name
    from ..server.main import state_settings

    state = state_settings(args, os.environ)
    return {
        "model": args.model,
        "config": cfg,
        "dtype": args.dtype,
        "device": args.device,
        "kernels": args.kernels,
        "kernel_plan": plan.as_dict(),
        "chat_template": template,
        "threads": args.threads or max(1, usable_cores() // args.replicas),
        "served_name": args.served_model_name or served_name(args.model),
        "state": state,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "grammar_warmup": args.grammar_warmup,
    }


def deploy(spec: dict, replicas: int, router: str, cpus_per_replica: float, drain_s: int, log_level: str = "info"):
    """Run the engine deployment; returns its handle."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from .replica import EngineReplica

    opts = {}
    if router != "pow2":  # pow2: Serve's own default router, the baseline the A/B compares against
        opts["request_router_config"] = RequestRouterConfig(
            request_router_class="tailgate.fleet.router.TailgateRouter", request_router_kwargs={"policy": router}
        )
    # The engine queues (and refuses past --max-queued-requests with a 429), so Serve never should:
    # a replica Serve called full would make the router back off instead of placing the request.
    dep = serve.deployment(
        EngineReplica,
        name=DEPLOYMENT,
        num_replicas=replicas,
        max_ongoing_requests=spec["state"]["max_queued_requests"] + 1024,
        ray_actor_options={"num_cpus": cpus_per_replica},
        health_check_period_s=2.0,
        health_check_timeout_s=60.0,
        graceful_shutdown_timeout_s=float(drain_s),
        # Serve's access log writes a line per call (every request, every scrape)
        # from each replica; tailgate's own log lines stay, at the command's level.
        logging_config={
            "enable_access_log": False,
            "log_level": log_level.upper(),
            # --log-format json: Serve writes the replicas' records as JSON too
            "encoding": "JSON" if spec.get("log_format") == "json" else "TEXT",
        },
        **opts,
    )
    return serve.run(dep.bind(spec), name=APP, route_prefix=None)


def fleet_status(target: int):
    """A callable giving the fleet as Serve's controller sees it: replicas running, the target,
    and the running replicas' ids (the front's /metrics asks each of them)."""
    from ray.serve.context import _get_global_client

    def status() -> dict:
        details = _get_global_client().get_serve_details()
        dep = details.get("applications", {}).get(APP, {}).get("deployments", {}).get(DEPLOYMENT, {})
        live = [r for r in dep.get("replicas", []) if r.get("state") == "RUNNING"]
        return {
            "running": len(live),
            "target": target,
            "replicas": [r["replica_id"] for r in live],
            "members": [{"id": r["replica_id"], "pid": r.get("pid"), "node_ip": r.get("node_ip")} for r in live],
        }

    return status


def ray_to_root() -> None:
    """Ray's own loggers in this process write through the root logger's handler (JSON), not their
    own plain-text one."""
    for name in ("ray", "ray.serve"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True


def serve_fleet(args, lookup) -> int:
    import uvicorn

    from ..assemble import PreflightError, preflight
    from ..server.app import HostCheck
    from ..server.main import allowed_hosts, chat_template

    cfg = resolve(lookup)
    try:
        template = chat_template(getattr(args, "chat_template", None), os.environ)
        # the single server's checks, the same function: kernels, the model's file, shapes and
        # tensor types, the KV budget (KernelError, FileNotFoundError, KnobError -> exit 2 in cli)
        plan, _ = preflight(args.model, cfg, args.dtype, args.kernels, args.device)
    except (ValueError, PreflightError) as e:
        print(f"tailgate: {e}", file=sys.stderr)
        return 2
    from ..server.logs import configure

    configure(args.log_level, args.log_format)  # this process's lines, as one server's (text or JSON)
    # Every replica's lines as they come: Ray's driver would fold look-alike lines of different
    # workers (two replicas' access lines) into one "[repeated Nx]" line, later (fleet/logs.py).
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    import ray
    from ray import serve

    json_logs = args.log_format == "json"
    if json_logs:
        from .logs import json_worker_lines

        ray_to_root()
        json_worker_lines()  # before ray.init, which binds the printer

    rspec = replica_spec(args, cfg, plan, template)
    # A local Ray gets this machine's cores, shared out (fractions allowed); a cluster places each
    # replica on a node with its thread count free.
    cpus = float(rspec["threads"]) if args.ray_address else usable_cores() / args.replicas
    ray.init(
        address=args.ray_address,
        include_dashboard=False,
        log_to_driver=True,
        **({} if args.ray_address else {"num_cpus": usable_cores()}),
    )
    try:
        serve.start(proxy_location="Disabled")
        handle = deploy(rspec, args.replicas, args.router, cpus, args.drain_timeout, args.log_level)
        from .front import Front

        from .registry import route_loads, route_totals

        routes, loads = ((lambda: {}), (lambda: {})) if args.router == "pow2" else (route_totals, route_loads)
        front = Front(
            handle,
            fleet_status(args.replicas),
            routes,
            rspec["state"]["max_body_bytes"],
            rspec["state"]["api_key"],
            loads,
            rspec["state"]["allowed_origins"],
        )
        hosts = allowed_hosts(args.host, args.allowed_hosts)
        app = HostCheck(front, hosts) if hosts is not None else front
        logging.getLogger("tailgate").info(
            "fleet of %d replicas (%d thread(s) each, router %s) on http://%s:%d",
            args.replicas,
            rspec["threads"],
            args.router,
            args.host,
            args.port,
        )
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            loop="asyncio",
            http="h11",
            timeout_graceful_shutdown=args.drain_timeout,
            access_log=False,
            # json: uvicorn's own lines go through the root logger's JSON handler too (as one server's)
            **({"log_config": None} if json_logs else {}),
        )
    finally:
        # uvicorn has drained the open requests by now. On a cluster, take our app off it; a local
        # Ray is ours, and stopping it stops Serve's actors with it (serve.shutdown() first waited
        # out its 30 s controller timeout on a busy 2-core host, for nothing more).
        try:
            if args.ray_address:
                serve.delete(APP)
        finally:
            ray.shutdown()
    return 0
