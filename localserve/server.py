"""Run the HTTP server: `serve(settings)` is what `localserve serve` calls."""

from __future__ import annotations

import logging

from aiohttp import web

from localserve.api.app import create_app
from localserve.config import ServerSettings
from localserve.engine.engine import Engine, EngineConfig
from localserve.models.registry import ModelManager, resolve

log = logging.getLogger(__name__)


def display_host(host: str) -> str:
    """The host as it goes into a URL (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def build_app(settings: ServerSettings) -> web.Application:
    """The application with a fresh engine and model manager."""
    # Named models are checked now, so a typo fails at start-up with a clear
    # message instead of a server that never gets ready.
    for name in settings.models:
        resolve(name)
    engine = Engine(EngineConfig(max_queue=settings.max_queue))
    manager = ModelManager(engine, settings)
    return create_app(settings, manager)


def serve(settings: ServerSettings) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM), then stop generating and
    close the models. Raises `LocalServeError` for a model that cannot be found."""
    app = build_app(settings)
    url = f"http://{display_host(settings.host)}:{settings.port}"
    models = ", ".join(settings.models) or "none"

    def announce(_: str) -> None:
        # run_app prints its own banner; one line of ours says what matters.
        print(f"localserve listening on {url} (models: {models}; loading in the background, see {url}/health)")

    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        shutdown_timeout=settings.shutdown_timeout_s,
        print=announce,
        # A client that disconnects cancels its handler, which aborts its
        # requests at the next step even while they wait in the queue.
        handler_cancellation=True,
    )
