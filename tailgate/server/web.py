"""The pages a person opens: the chat playground at `/`, the live dashboard at `/dashboard`, their
static files (package data under `static/`, plain HTML + JS modules, no build step, no network),
the dashboard's server-sent-events feed at `/dashboard/feed` (`feed.py`), and the API's Swagger UI
at `/docs`, whose JS and CSS this server serves too (the `swagger-ui-bundle-v2` package's files,
`/docs/static/...`): FastAPI's own page loads them from a CDN, which an offline user never reaches.

The pages themselves carry no data, so they load without the API key; everything they show
comes from calls that need it when one is set (the /v1 endpoints and the feed), sent by the
page's JS as `Authorization: Bearer` from the key field (the feed is read with fetch, not
EventSource, for that reason: EventSource cannot send headers).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
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


# The Swagger UI files /docs uses, by name (nothing else under the package's folder is served).
DOCS_FILES = {
    "swagger-ui-bundle.js": TYPES[".js"],
    "swagger-ui.css": TYPES[".css"],
    "favicon-32x32.png": "image/png",
}


def _docs_file(name: str) -> Response:
    key = "docs/" + name
    if key not in _cache:
        if name not in DOCS_FILES:
            raise ApiError(404, f"GET /docs/static/{name}: not found")
        try:
            from swagger_ui_bundle import swagger_ui_path
        except ImportError:
            raise ApiError(404, "GET /docs: Swagger UI's files are not installed (pip install swagger-ui-bundle-v2)")
        _cache[key] = ((swagger_ui_path / name).read_bytes(), DOCS_FILES[name])
    body, ctype = _cache[key]
    return Response(body, media_type=ctype, headers={"Cache-Control": "no-cache"})


@router.get("/docs")
async def docs(req: Request):
    """Swagger UI over /openapi.json, every file from this server (a proxy's root_path kept)."""
    _docs_file("swagger-ui-bundle.js")  # a 404 naming the package, not a page that draws nothing
    root = req.scope.get("root_path", "").rstrip("/")
    return get_swagger_ui_html(
        openapi_url=root + req.app.openapi_url,
        title=f"{req.app.title} {req.app.version}: API",
        swagger_js_url=f"{root}/docs/static/swagger-ui-bundle.js",
        swagger_css_url=f"{root}/docs/static/swagger-ui.css",
        swagger_favicon_url=f"{root}/docs/static/favicon-32x32.png",
    )


@router.get("/docs/static/{name}")
async def docs_static(name: str):
    return _docs_file(name)


def parse_since(raw: str) -> int:
    """The feed's `since`: -1 or a step number; an ApiError (400) naming it otherwise."""
    if not (raw == "-1" or (raw.isascii() and raw.isdigit() and len(raw) <= 18)):
        raise ApiError(400, f"'since' must be -1 or a step number (0, 1, ...), got {raw!r}", "since")
    return int(raw)


def parse_window(raw: str | None) -> float:
    """The feed's `window`: the seconds its gap percentiles cover (default feed.WINDOW_S), a number
    from 1 to feed.KEEP_S; an ApiError (400) naming it otherwise."""
    if raw is None:
        return feed.WINDOW_S
    try:
        s = float(raw)
    except ValueError:
        s = float("nan")
    if not 1.0 <= s <= feed.KEEP_S:  # NaN and inf fail here too
        raise ApiError(400, f"'window' must be seconds from 1 to {feed.KEEP_S:.0f}, got {raw!r}", "window")
    return s


@router.get("/dashboard/feed")
async def dashboard_feed(req: Request):
    """`?since=N`: the last step `seq` the client already has (a reconnecting page sends it);
    `?window=S`: the seconds each tick's gap percentiles cover (60 unless asked; a client comparing
    its own figures over a longer run asks for the run's)."""
    # The order every API route checks in: the key, the request (a bad one is a 400 even while
    # loading), then that the model is serving.
    check_auth(req)
    state = server_state(req)
    since = parse_since(req.query_params.get("since", "-1"))
    window_s = parse_window(req.query_params.get("window"))
    check_ready(state)
    window = getattr(req.app.state, "itl_window", None)
    if window is None:  # one per app: every dashboard shares the gaps it has gathered
        window = req.app.state.itl_window = feed.ItlWindow()
    return StreamingResponse(
        feed.events(state, window, since, window_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
