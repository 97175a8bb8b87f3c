"""The fleet's one HTTP endpoint: an ASGI app (run by uvicorn in the `tailgate serve --replicas N`
process) that forwards every request, as it came, to an engine replica through the deployment's
Serve handle (whose router, `fleet/router.py`, picks the replica), and streams the replica's answer
back. Only /metrics (every replica's, merged), /health (the fleet's) and the dashboard's feed
(every replica's, merged: `fleet/dashboard.py`) are answered here.

Why not Serve's own HTTP proxy: it would put a second hop (proxy actor, then an ingress replica)
in front of the engines on a 2-core machine, and the front needs fleet-wide /metrics and /health
and control over retries anyway; replacement of dead replicas, routing and scaling stay Serve's.

Faults: a request whose replica is lost before its response started (nothing sent to the client
yet) is sent again, to another replica (the router forgot the dead one), up to `attempts` times;
a response that had started (a stream) ends with an OpenAI error event and `data: [DONE]`, as the
single-process server ends a stream whose generation failed. No request waits on a dead replica.
"""

from __future__ import annotations

import asyncio
import json
import logging

from ..server.protocol import ApiError

log = logging.getLogger("tailgate.fleet")
LOCAL = ("/metrics", "/health")
FEED = "/dashboard/feed"  # answered here from every replica's feed (fleet/dashboard.py)
# A replica's feed tick answers in milliseconds; one that has not in 2 s is gone or stuck, and the
# fleet's tick (every replica's together) must not wait the /metrics fan-out's 10 s for it.
FEED_TIMEOUT_S = 2.0


def route_key(path: str, body: bytes):
    """What the router matches prefixes on: the prompt's token ids or text, or the chat messages'
    text in order; "" when the body has none (the replica answers it with the error)."""
    if not path.startswith("/v1/") or not body:
        return ""
    try:
        obj = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(obj, dict):
        return ""
    p = obj.get("prompt")
    if isinstance(p, list) and p and isinstance(p[0], (list, str)):
        p = p[0]  # a batch: the first prompt places it
    if isinstance(p, str):
        return p
    if isinstance(p, list) and all(isinstance(t, int) for t in p):
        return tuple(p)
    msgs = obj.get("messages")
    if isinstance(msgs, list):
        parts = []
        for m in msgs:
            c = m.get("content") if isinstance(m, dict) else None
            if isinstance(c, list):
                c = "".join(x.get("text", "") for x in c if isinstance(x, dict))
            parts.append(f"{m.get('role', '') if isinstance(m, dict) else ''}\x1f{c or ''}\x1e")
        return "".join(parts)
    return ""


class Front:
    """`handle`: the engine deployment's DeploymentHandle; `fleet`: a zero-argument callable
    giving {"running": n, "target": N, "replicas": [unique ids]} (Serve's status);
    `routes`: a zero-argument callable giving the router's counts by reason; `loads` one giving
    its requests in flight by replica; `api_key`: the key the dashboard's feed checks;
    `allowed_origins`: the origins its feed answers cross-origin (--allowed-origins)."""

    def __init__(
        self,
        handle,
        fleet,
        routes,
        max_body_bytes: int,
        api_key: str | None = None,
        loads=dict,
        allowed_origins: tuple[str, ...] = (),
        attempts: int = 3,
        metrics_timeout: float = 10.0,
    ):
        self.handle, self.fleet, self.routes, self.api_key, self.loads = handle, fleet, routes, api_key, loads
        # The feed answered here gets the CORS headers a single server's would (its preflight is
        # forwarded, and a replica's own middleware answers it); forwarded responses carry theirs.
        self.feed = self._dashboard
        if allowed_origins:
            from starlette.middleware.cors import CORSMiddleware

            self.feed = CORSMiddleware(self._dashboard, allow_origins=list(allowed_origins), allow_headers=["*"])
        self.max_body_bytes, self.attempts, self.metrics_timeout = max_body_bytes, attempts, metrics_timeout
        self.counts = {"retries": 0, "stream_errors": 0}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path in LOCAL and scope["method"] in ("GET", "HEAD"):
            return await self._local(path, scope, send)
        if path == FEED and scope["method"] == "GET":
            return await self.feed(scope, receive, send)
        try:
            body = await self._body(scope, receive)
        except ApiError as e:
            return await self._reply(send, e.status, json.dumps(e.body()).encode(), e.headers)
        await self._forward(scope, receive, send, body)

    async def _body(self, scope, receive) -> bytes:
        declared = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise ApiError(
                413,
                f"request body of {declared} bytes exceeds the server's {self.max_body_bytes} "
                "(tailgate serve --max-body-mb)",
            )
        raw = bytearray()
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise ApiError(499, "client disconnected")
            raw += msg.get("body", b"")
            if len(raw) > self.max_body_bytes:
                raise ApiError(
                    413, f"request body exceeds the server's {self.max_body_bytes} bytes (tailgate serve --max-body-mb)"
                )
            if not msg.get("more_body", False):
                return bytes(raw)

    async def _forward(self, scope, receive, send, body: bytes) -> None:
        key = route_key(scope["path"], body)
        args = (scope["method"], scope["path"], scope.get("query_string", b""), list(scope["headers"]), body)
        left = asyncio.Event()

        async def watch():  # the client hanging up cancels the replica's call (its engine requests abort)
            await _disconnected(receive)
            left.set()

        watcher = asyncio.ensure_future(watch())
        started, sse, last = False, False, None
        try:
            for attempt in range(self.attempts):
                gen = self.handle.options(stream=True).remote(*args, route_key=key)
                try:
                    async for item in _until(gen, left):
                        if isinstance(item, tuple):
                            _, status, headers = item
                            sse = any(
                                k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers
                            )
                            await send({"type": "http.response.start", "status": status, "headers": headers})
                            started = True
                        else:
                            await send({"type": "http.response.body", "body": item, "more_body": True})
                    if left.is_set():
                        return
                    if started:
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # the replica was lost (died, unavailable) or failed the call
                    last = e
                    if started:
                        break
                    self.counts["retries"] += 1
                    log.warning(
                        "request to a lost replica, not started: retrying elsewhere (%d/%d): %r",
                        attempt + 1,
                        self.attempts,
                        e,
                    )
            if not started:
                err = ApiError(503, f"no replica could take the request after {self.attempts} attempts: {last!r}")
                return await self._reply(send, 503, json.dumps(err.body()).encode())
            self.counts["stream_errors"] += 1
            log.warning("replica lost mid-response: %r", last)
            if sse:
                err = ApiError(503, f"the replica serving this stream was lost: {last!r}; retry the request")
                msg = f"data: {json.dumps(err.body())}\n\ndata: [DONE]\n\n".encode()
                await send({"type": "http.response.body", "body": msg, "more_body": False})
            else:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()

    async def _local(self, path: str, scope, send) -> None:
        fleet = await asyncio.to_thread(self.fleet)
        if path == "/health":
            n, target = fleet["running"], fleet["target"]
            status = "ok" if n >= target else ("degraded" if n else "unavailable")
            body = {"status": status, "replicas": {"running": n, "target": target}, "members": fleet.get("members", [])}
            return await self._reply(send, 200 if n else 503, json.dumps(body).encode())
        from .metrics import render

        async def one(rid):
            try:
                return await asyncio.wait_for(self.handle.metrics.remote(pin=rid), self.metrics_timeout)
            except Exception as e:  # a replica gone between the status and the call: it has no figures
                log.warning("no metrics from replica %s: %r", rid, e)
                return None

        got = await asyncio.gather(*(one(r) for r in fleet["replicas"]))
        texts = dict(x for x in got if x is not None)
        size = {"running": fleet["running"], "target": fleet["target"]}
        text = render(texts, self.routes(), self.counts, size, self.loads())
        await self._reply(send, 200, text, [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")])

    async def _dashboard(self, scope, receive, send) -> None:
        """The fleet's dashboard feed: the single server's checks (key, then `since` and `window`), then one
        merged tick a period from pinned calls to every running replica, until the client leaves."""
        from urllib.parse import parse_qs

        from ..server.guards import check_key
        from ..server.web import parse_since, parse_window
        from . import dashboard

        try:
            check_key(dict(scope["headers"]).get(b"authorization", b"").decode("latin-1"), self.api_key)
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            parse_since(query.get("since", ["-1"])[-1])
            window_s = parse_window(query.get("window", [None])[-1])
        except ApiError as e:
            return await self._reply(send, e.status, json.dumps(e.body()).encode(), e.headers)

        async def ask(rid, since, after, hello):
            try:
                call = self.handle.feed.remote(since, after, hello, pin=rid)
                return await asyncio.wait_for(call, FEED_TIMEOUT_S)
            except Exception as e:  # gone between the status and the call: left out of this tick
                log.warning("no dashboard feed from replica %s: %r", rid, e)
                return None

        async def members():
            return (await asyncio.to_thread(self.fleet))["replicas"]

        async def pump():
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream"),
                        (b"cache-control", b"no-cache"),
                        (b"x-accel-buffering", b"no"),
                    ],
                }
            )
            try:
                async for text in dashboard.events(ask, members, dashboard.FleetWindow(window_s)):
                    await send({"type": "http.response.body", "body": text.encode(), "more_body": True})
            except Exception as e:  # Serve's status unreadable, say: the page hears why, then reconnects
                log.warning("fleet dashboard feed failed: %r", e)
                msg = f"event: error\ndata: {json.dumps({'message': f'fleet feed failed: {e!r}'})}\n\n"
                await send({"type": "http.response.body", "body": msg.encode(), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        feed = asyncio.ensure_future(pump())
        left = asyncio.ensure_future(_disconnected(receive))
        await asyncio.wait({feed, left}, return_when=asyncio.FIRST_COMPLETED)
        for t in (feed, left):
            t.cancel()

    @staticmethod
    async def _reply(send, status: int, body: bytes, headers=None) -> None:
        if isinstance(headers, dict) or headers is None:  # an error body: JSON, plus the error's own headers
            headers = [(b"content-type", b"application/json")] + list((headers or {}).items())
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (bytes(k, "latin-1") if isinstance(k, str) else k, bytes(v, "latin-1") if isinstance(v, str) else v)
                    for k, v in headers
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _until(gen, left: asyncio.Event):
    """The replica's items until it ends or the client leaves (then the call is cancelled)."""
    it = gen.__aiter__()
    while True:
        nxt = asyncio.ensure_future(it.__anext__())
        stop = asyncio.ensure_future(left.wait())
        await asyncio.wait({nxt, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not nxt.done():
            # The cancelled call's future ends in Ray's RequestCancelledError: retrieve it, or
            # asyncio logs "exception was never retrieved" with a traceback for every request
            # whose client left before the replica's last item (issue 44: each non-streamed one).
            nxt.add_done_callback(lambda f: f.cancelled() or f.exception())
            nxt.cancel()
            gen.cancel()
            return
        try:
            yield nxt.result()
        except StopAsyncIteration:
            return
