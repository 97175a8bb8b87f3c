"""The pages a person opens: the chat playground at `/`, the live dashboard at `/dashboard`, their
static files (package data under `static/`, plain HTML + JS modules, no build step, no network),
and the dashboard's server-sent-events feed at `/dashboard/feed` (`feed.py`).

The pages themselves carry no data, so they load without the API key; everything they show
comes from calls that need it when one is set (the /v1 endpoints and the feed), sent by the
page's JS as `Authorization: Bearer` from the key field (the feed is read with fetch, not
EventSource, for that reason: EventSource cannot send headers).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from starlette.responses import Response, StreamingResponse

from . import feed
from .guards import check_auth, check_ready, server_state
from .protocol import ApiError

router = APIRouter(include_in_schema=False)  # pages, not API: kept out of /openapi.json (and its fuzzing)

STATIC = resources.files(__package__) / "static"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The files are read once, at first request: a page load then costs no disk read.
_cache: dict[str, tuple[bytes, str]] = {}


def _file(name: str) -> Response:
    if name not in _cache:
        suffix = name[name.rfind(".") :] if "." in name else ""
        path = STATIC / name
        # Only plain names of files we ship: no "..", no sub-folders, no other types.
        if "/" in name or "\\" in name or name.startswith(".") or suffix not in TYPES or not path.is_file():
            raise ApiError(404, f"GET /static/{name}: not found")
        _cache[name] = (path.read_bytes(), TYPES[suffix])
    body, ctype = _cache[name]
    # no-cache: the browser revalidates, so a page never runs JS from an older tailgate.
    return Response(body, media_type=ctype, headers={"Cache-Control": "no-cache"})


@router.get("/")
async def playground():
    return _file("playground.html")


@router.get("/dashboard")
async def dashboard():
    return _file("dashboard.html")


@router.get("/static/{name}")
async def static(name: str):
    return _file(name)


def parse_since(raw: str) -> int:
    """The feed's `since`: -1 or a step number; an ApiError (400) naming it otherwise."""
    if not (raw == "-1" or (raw.isascii() and raw.isdigit() and len(raw) <= 18)):
        raise ApiError(400, f"'since' must be -1 or a step number (0, 1, ...), got {raw!r}", "since")
    return int(raw)


@router.get("/dashboard/feed")
async def dashboard_feed(req: Request):
    """`?since=N`: the last step `seq` the client already has (a reconnecting page sends it)."""
    # The order every API route checks in: the key, the request (a bad one is a 400 even while
    # loading), then that the model is serving.
    check_auth(req)
    state = server_state(req)
    since = parse_since(req.query_params.get("since", "-1"))
    check_ready(state)
    window = getattr(req.app.state, "itl_window", None)
    if window is None:  # one per app: every dashboard shares the gaps it has gathered
        window = req.app.state.itl_window = feed.ItlWindow()
    return StreamingResponse(
        feed.events(state, window, since),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
