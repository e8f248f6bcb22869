"""Protection against web pages: DNS rebinding (the `Host` check) and
cross-origin calls (CORS).

**Host check.** A page on `evil.example` can make its DNS name resolve to
127.0.0.1 and then talk to this server "same-origin"; the browser still sends
`Host: evil.example`. So a request whose `Host` is not one of these names
(any port) gets 403:

* `localhost`, `*.localhost`, `127.0.0.1`, `[::1]` (loopback);
* the machine's name (`socket.gethostname()`, and `NAME.local` for mDNS);
* the addresses the server is bound to (`--host`);
* every `--allow-host` (`*` turns the check off);
* when bound to every interface (`0.0.0.0` / `::`), any IP literal: a
  rebinding attack always arrives under the attacker's DNS name.

A request without `Host` (HTTP/1.0 tools) is not a browser's and passes.

**CORS.** A request without `Origin` is not cross-origin (curl, SDKs) and
passes. A request with an `Origin` passes only if the origin is allowed, and
then its response carries `Access-Control-Allow-Origin`. Allowed are:

* `http(s)://localhost`, `*.localhost`, `127.0.0.1`, `[::1]`, any port
  (local web UIs, JetBrains' built-in server, Tauri on Windows);
* editor and desktop-app webviews: `vscode-webview://…`,
  `vscode-file://…` (VS Code and its forks), `app://…` (Electron apps such as
  Obsidian), `tauri://…`;
* the server's own origin (a page it served itself);
* every `--cors-origin` (exact origin; `*` allows any).

Any other origin gets 403 on every method but the preflight: a simple
cross-origin POST (`Content-Type: text/plain`) skips the preflight, and would
otherwise start a generation the page cannot even read. `Origin: null`
(sandboxed iframes, `file://`) is foreign. Preflights (`OPTIONS` with
`Access-Control-Request-Method`) are answered here with 200, as llama-server
does, and need no key; a foreign origin's preflight gets no CORS headers,
so the browser never sends the call.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web

from localserve.config import ServerSettings
from localserve.errors import ForbiddenError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

LOCAL_ORIGIN = re.compile(r"^https?://(([a-z0-9-]+\.)*localhost|127\.0\.0\.1|\[::1\])(:\d{1,5})?$")
EDITOR_ORIGIN = re.compile(r"^(vscode-webview|vscode-file|app|tauri)://[a-z0-9.-]+(:\d{1,5})?$")
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})
ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
EXPOSE_HEADERS = "Retry-After, X-Request-Id"
PREFLIGHT_MAX_AGE_S = 600


def host_name(header: str) -> str:
    """`"[::1]:8400"` -> `"::1"`, `"LocalHost.:80"` -> `"localhost"`."""
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        value = value[1:end] if end != -1 else value
    elif value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostPolicy:
    """Which `Host` header names this server answers to."""

    def __init__(self, settings: ServerSettings) -> None:
        machine = socket.gethostname().lower()
        names = {"localhost", "127.0.0.1", "::1", machine, f"{machine}.local"}
        names.update(host_name(h) for h in settings.hosts)
        names.update(host_name(h) for h in settings.allow_hosts)
        self.any_host = "*" in settings.allow_hosts
        self.any_ip = any(h in WILDCARD_BINDS for h in settings.hosts)
        self.names = frozenset(n for n in names if n)

    def allows(self, name: str) -> bool:
        if self.any_host or name in self.names or name.endswith(".localhost"):
            return True
        return self.any_ip and _is_ip(name)


class OriginPolicy:
    """Which browser origins may call this server (see the module docstring)."""

    def __init__(self, settings: ServerSettings) -> None:
        # `--cors-origins a,b` as llama-server takes it; its `localhost` means the loopback origins, allowed anyway.
        origins = [o.strip().rstrip("/").lower() for entry in settings.cors_origins for o in entry.split(",")]
        self.any_origin = "*" in origins
        self.extra = frozenset(o for o in origins if o and o not in ("*", "localhost"))

    def allows(self, origin: str, host: str | None) -> bool:
        """May a page of `origin` call us? `host` is the request's Host header."""
        origin = origin.strip().rstrip("/").lower()
        if self.any_origin or origin in self.extra:
            return True
        if LOCAL_ORIGIN.match(origin) or EDITOR_ORIGIN.match(origin):
            return True
        host = (host or "").strip().lower()
        return bool(host) and origin in (f"http://{host}", f"https://{host}")


def host_middleware(settings: ServerSettings) -> Callable[..., Awaitable[web.StreamResponse]]:
    """403 for a `Host` header this server does not answer to."""
    policy = HostPolicy(settings)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Host")
        if header is not None and not policy.allows(host_name(header)):
            name = host_name(header)
            raise ForbiddenError(
                f"Host {header!r} is not allowed (protection against DNS rebinding). "
                f"If you reach this server under that name on purpose, start it with --allow-host {name}."
            )
        return await handler(request)

    return middleware


def cors_middleware(settings: ServerSettings) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Answer preflights; 403 for a foreign `Origin`."""
    policy = OriginPolicy(settings)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if origin is None:
            return await handler(request)
        allowed = policy.allows(origin, request.headers.get("Host"))
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return _preflight(request, origin if allowed else None)
        if not allowed:
            raise ForbiddenError(
                f"Origin {origin!r} is not allowed to call this server. "
                f"Start it with --cors-origin {origin} to allow that origin."
            )
        return await handler(request)

    return middleware


def _preflight(request: web.Request, origin: str | None) -> web.Response:
    """200, as llama-server answers; a foreign `origin` (None) gets no CORS
    headers, so the browser refuses the call it asked about."""
    if origin is None:
        return web.Response(status=200, headers={"Vary": "Origin"})
    headers = {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Allow-Credentials": "true",
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": request.headers.get(
            "Access-Control-Request-Headers", "Authorization, Content-Type"
        ),
        "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
        "Vary": "Origin, Access-Control-Request-Method, Access-Control-Request-Headers",
    }
    # Chrome's Private Network Access asks before a public page reaches
    # localhost; the origin is already vetted, so say yes.
    if request.headers.get("Access-Control-Request-Private-Network") == "true":
        headers["Access-Control-Allow-Private-Network"] = "true"
    return web.Response(status=200, headers=headers)


def cors_response_headers(settings: ServerSettings) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """An `on_response_prepare` hook: CORS headers on every answer to an allowed
    origin, streams and errors included (they are set before headers go out)."""
    policy = OriginPolicy(settings)

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is None or not policy.allows(origin, request.headers.get("Host")):
            return
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
        vary = response.headers.get("Vary")
        response.headers["Vary"] = f"{vary}, Origin" if vary and "Origin" not in vary else (vary or "Origin")

    return add_headers
