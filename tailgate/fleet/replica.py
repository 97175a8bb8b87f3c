"""One engine replica of the fleet: a whole tailgate engine (`assemble.build_engine`) and the
single-process server's own app (`server/app.create_app`) inside a Ray Serve deployment.

The fleet's front (`fleet/front.py`) forwards each HTTP request as it came (method, path, query,
headers, body); the replica plays it to its app in-process as one ASGI call and streams back what
the app sends: first `("start", status, headers)`, then the body's chunks. So every route, error
body, stream and auth check is the single-process server's, not a copy of it. The replica adds
`x-tailgate-replica` (its Serve replica id) to each response.

Ray is imported by whoever builds the deployment (`deployment()`), never by this module's import.
"""

from __future__ import annotations

import asyncio
import logging
import time

REPLICA_HEADER = b"x-tailgate-replica"


def replica_state(spec: dict):
    """A replica's app state from its spec: the single server's settings (`spec["state"]`), no Host
    check (the front's, which saw the client), the plan the front chose."""
    from ..server.app import ServerState

    return ServerState(
        served_name=spec["served_name"], allowed_hosts=None, kernels=spec["kernel_plan"], **spec["state"]
    )


class EngineReplica:
    """The deployment's class. `spec` holds what `tailgate serve` resolved before Ray started
    (model, settled knobs, kernel flags, threads, server limits, chat template), so a replica
    refuses nothing the command had not already checked."""

    def __init__(self, spec: dict):
        import torch

        from ..assemble import build_engine
        from ..server.app import create_app
        from ..server.logs import configure
        from ..server.metrics import registry_for

        self.id = self._replica_id()
        # As one server logs (access lines, INFO and up), to this worker's stderr, which Ray carries
        # to the command's output; a JSON line names its replica (fleet/logs.py).
        json_logs = spec.get("log_format") == "json"
        configure(
            spec.get("log_level", "info"), spec.get("log_format", "text"), {"replica": self.id} if json_logs else None
        )
        log = logging.getLogger("tailgate")
        torch.set_num_threads(spec["threads"])
        engine, model, settled = build_engine(
            spec["model"],
            spec["config"],
            dtype=spec["dtype"],
            device=spec["device"],
            kernels=spec["kernels"],
            log=log.info,
        )
        if spec.get("grammar_warmup"):
            from ..server.main import _build_grammar_vocabulary

            _build_grammar_vocabulary(model.tokenizer)
        if spec.get("chat_template") is not None:
            model.tokenizer.set_chat_template(spec["chat_template"])
        else:
            model.tokenizer.compile_chat_template()
        # Auth stays here (the app's own check); the Host check is the front's, which saw the client.
        self.state = replica_state(spec)
        self.state.model, self.state.cfg = model, settled
        engine.delivery_wait_s = self.state.delivery_wait_s
        engine.start()
        self.state.engine = engine
        self.app = create_app(self.state)
        self.registry = registry_for(self.state)
        self.window = None  # the dashboard feed's gap window, made by the first feed call
        log.info("replica %s serving with %d thread(s)", self.id, spec["threads"])

    @staticmethod
    def _replica_id() -> str:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id

    async def __call__(self, method: str, path: str, query: bytes, headers: list, body: bytes, route_key=None):
        """Play one HTTP request to the app; yields ("start", status, headers) and then bytes.
        `route_key` is read by the router only."""
        out: asyncio.Queue = asyncio.Queue()
        gone = asyncio.Event()
        sent_body = False

        async def receive():
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()  # the client left (the front cancelled this call)
            return {"type": "http.disconnect"}

        async def send(message):
            await out.put(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query,
            "root_path": "",
            "headers": [(bytes(k), bytes(v)) for k, v in headers],
            "server": ("fleet", 0),
            "client": ("fleet", 0),
        }
        task = asyncio.ensure_future(self.app(scope, receive, send))
        try:
            while True:
                get = asyncio.ensure_future(out.get())
                await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():
                    get.cancel()
                    task.result()  # the app ended without finishing its response: raise its error
                    return
                msg = get.result()
                if msg["type"] == "http.response.start":
                    yield ("start", msg["status"], list(msg.get("headers", [])) + [(REPLICA_HEADER, self.id.encode())])
                elif msg["type"] == "http.response.body":
                    if msg.get("body"):
                        yield bytes(msg["body"])
                    if not msg.get("more_body", False):
                        return
        finally:
            gone.set()
            if not task.done():
                try:
                    await asyncio.wait_for(task, 5.0)  # the app sees the disconnect and aborts its requests
                except (asyncio.TimeoutError, Exception):
                    task.cancel()

    async def metrics(self, pin: str | None = None) -> tuple[str, str]:
        """This replica's /metrics text (`pin` is the router's: it names this replica)."""
        from ..server.metrics import render

        return self.id, render(self.registry).decode()

    async def feed(self, since: int, after: float | None, hello: bool = False, pin: str | None = None) -> dict:
        """One tick of this replica's dashboard feed for the front (`fleet/dashboard.py`): steps
        after `since`, inter-token gaps after `after`, and its hello when asked. A pinned call:
        the router neither places nor counts it, so an open dashboard is no request in flight."""
        from ..server import feed

        if self.window is None:  # the first dashboard attaches the engine observer, as one server does
            self.window = feed.ItlWindow()
            self.window.attach(self.state.engine)
        out = feed.report(self.state, self.window, since, after)
        out["replica"] = self.id
        if hello:
            out["hello"] = feed.hello(self.state)
        return out

    async def load(self, pin: str | None = None) -> dict:
        snap = self.state.engine.snapshot
        return {
            "replica": self.id,
            "running": snap.running,
            "waiting": self.state.engine.waiting,
            "error": None if self.state.engine.error is None else repr(self.state.engine.error),
        }

    def record_routing_stats(self) -> dict:
        snap = self.state.engine.snapshot
        return {"running": snap.running, "waiting": snap.waiting, "at": time.time()}

    def check_health(self) -> None:
        """Serve's health check: a dead engine fails it, and Serve replaces the replica."""
        if self.state.engine.error is not None:
            raise RuntimeError(f"engine failed: {self.state.engine.error!r}")
