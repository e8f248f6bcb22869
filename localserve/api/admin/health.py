"""`GET /health`: liveness and readiness (no API key needed)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from localserve.api.admin import disk_watch
from localserve.api.state import REGISTRY


async def health(request: web.Request) -> web.Response:
    """Liveness and readiness (no API key needed)."""
    registry = request.app[REGISTRY]
    if registry.starting:
        return web.json_response({"status": "loading"}, status=503)
    if registry.load_errors:
        return web.json_response({"status": "error", "errors": registry.load_errors}, status=503)
    body: dict[str, Any] = {"status": "ok"}
    if registry.not_loaded:  # start-up models beyond --max-loaded-models: they load on first request
        body["not_loaded"] = registry.not_loaded
    disk = request.app[disk_watch.DISK_WATCH].health()
    if disk is not None:  # a read-only data directory: serving goes on, and says so
        body["disk"] = disk
    return web.json_response(body)
