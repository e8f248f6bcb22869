"""The browser UI: a page of plain ES modules in `localserve/webui/` (package
data; nothing is built at install time, and nothing is fetched from another
origin).

* `GET /` with `Accept: text/html` (a browser) - the page; any other client
  (Ollama's probes) still reads "Ollama is running" (`api.ollama.routes.root`)
* `GET /ui/{name}` - the page's scripts, styles and icon

The page and its files need no API key (they hold no secret and the page
asks for the key itself); everything they call does. Each answer carries a
strict Content-Security-Policy (scripts, styles and connections from this
origin only, no inline script, no framing), `X-Content-Type-Options:
nosniff` and `Referrer-Policy: no-referrer`. `--no-ui` turns both routes off
(`/ui/...` answers 404, `/` the text).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from aiohttp import web

from localserve.api.routes import Route, add_routes
from localserve.api.state import SETTINGS
from localserve.errors import NotFoundError

WEBUI_DIR = Path(__file__).resolve().parent.parent / "webui"
INDEX = "index.html"
CONTENT_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
#: A file name the UI may ask for: lower-case words, one optional folder, a known suffix.
SAFE_NAME = re.compile(r"^[a-z0-9_-]+(/[a-z0-9_-]+)?\.(js|css|svg)$")
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "media-src 'self' blob:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate: a new version of the server serves new files
}


def register(app: web.Application) -> None:
    """Add `GET /ui/{name}` (`/` is Ollama's route, which hands browsers `page`)."""
    add_routes(app, Route("GET", "/ui/{name:.+}", asset, media_types=tuple(sorted(set(CONTENT_TYPES.values())))))


def ui_enabled(request: web.Request) -> bool:
    return not request.app[SETTINGS].no_ui


def wants_page(request: web.Request) -> bool:
    """A browser asking for `/`: it names text/html in `Accept` (Ollama's
    clients and curl do not)."""
    return request.path == "/" and "text/html" in request.headers.get("Accept", "") and ui_enabled(request)


def is_public(request: web.Request) -> bool:
    """Answered without the API key: the page and its files."""
    return wants_page(request) or (request.path.startswith("/ui/") and ui_enabled(request))


async def page(request: web.Request) -> web.Response:
    """The UI's HTML shell."""
    return _file_response(INDEX, "text/html; charset=utf-8")


async def asset(request: web.Request) -> web.Response:
    """`GET /ui/{name}`: one of the UI's scripts, styles or icons."""
    name = request.match_info["name"]
    if not ui_enabled(request) or not SAFE_NAME.match(name):
        raise NotFoundError(f"no UI file {name!r}")
    return _file_response(name, CONTENT_TYPES[Path(name).suffix])


@functools.cache
def _read(name: str) -> bytes | None:
    """A UI file's bytes, read once (a few kB each; the package does not change under a running server)."""
    path = WEBUI_DIR / name
    return path.read_bytes() if path.is_file() else None


def _file_response(name: str, content_type: str) -> web.Response:
    body = _read(name)
    if body is None:
        raise NotFoundError(f"no UI file {name!r}")
    response = web.Response(body=body, headers=SECURITY_HEADERS)
    response.headers["Content-Type"] = content_type
    return response
