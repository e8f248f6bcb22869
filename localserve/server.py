"""Run the HTTP server: `serve(settings)` is what `localserve serve` calls.

The server runs until SIGINT or SIGTERM, then shuts down gracefully (see
`api.app._drain`: the batch runner stops, requests in flight get up to
`--shutdown-timeout` seconds). A second signal during that drain ends the
requests still running at once, as the timeout would: streams get a last
chunk with `finish_reason: "error"` and the error event, other requests a
503; the server says so in one log line and exits as after the first.

A model named at start-up that cannot load stops the server: `serve` raises
`LocalServeError` with one line naming the model and the reason, so
`localserve serve` exits with status 1 instead of serving without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

from aiohttp import web

from localserve.api.app import STARTUP_MODELS_REQUIRED, create_app
from localserve.api.http_edge import ApiRunner
from localserve.api.state import REGISTRY
from localserve.config import ServerSettings
from localserve.engine.engine import Engine, EngineConfig
from localserve.errors import LocalServeError
from localserve.models.registry import ModelRegistry

log = logging.getLogger(__name__)

KEEPALIVE_TIMEOUT_S = 75.0  # idle keep-alive connections close after this (aiohttp's run_app default)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def display_host(host: str) -> str:
    """The host as it goes into a URL (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def build_app(settings: ServerSettings) -> web.Application:
    """The application with a fresh engine and model registry."""
    registry = ModelRegistry(Engine(EngineConfig(max_queue=settings.max_queue)), settings)
    # Named models are resolved now, so a typo fails at start-up with a clear
    # message instead of a server that never gets ready.
    registry.resolve_startup()
    return create_app(settings, registry)


def serve(settings: ServerSettings) -> None:
    """Serve until interrupted (Ctrl-C / SIGTERM), then stop generating and
    close the models. Raises `LocalServeError` for a model that cannot be
    found or loaded, `OSError` for an address that cannot be bound."""
    app = build_app(settings)
    app[STARTUP_MODELS_REQUIRED] = True
    asyncio.run(_serve(app, settings))


async def _serve(app: web.Application, settings: ServerSettings) -> None:
    runner = ApiRunner(
        app,
        handle_signals=False,  # ours below: a second signal must not cut the drain short mid-chunk
        shutdown_timeout=settings.shutdown_timeout_s,
        keepalive_timeout=KEEPALIVE_TIMEOUT_S,
        # A client that disconnects cancels its handler, which aborts its
        # requests at the next step even while they wait in the queue.
        handler_cancellation=True,
    )
    await runner.setup()  # starts the models loading in the background
    stop = asyncio.Event()
    signals = _SignalHandler(app, stop)
    try:
        for host in settings.hosts:  # one site per address (--host 127.0.0.1,::1)
            await web.TCPSite(runner, host, settings.port).start()
        url, *more = (f"http://{display_host(host)}:{settings.port}" for host in settings.hosts)
        models = ", ".join(settings.models) or "none"
        also = f" and {', '.join(more)}" if more else ""
        print(f"localserve listening on {url}{also} (models: {models}; loading in the background, see {url}/health)")
        signals.install()
        failure = await _until_stopped(app, stop)
    finally:
        await runner.cleanup()  # the graceful drain; a second signal ends it at once
        signals.remove()
    if failure:
        raise LocalServeError(failure)


async def _until_stopped(app: web.Application, stop: asyncio.Event) -> str | None:
    """Wait for a signal, or for a start-up model that fails to load; that
    failure, as one line, or None."""
    registry = app[REGISTRY]
    waiter = asyncio.create_task(stop.wait())
    if registry.startup is not None:
        await asyncio.wait({waiter, registry.startup}, return_when=asyncio.FIRST_COMPLETED)
    if registry.load_errors:
        name, reason = next(iter(registry.load_errors.items()))
        waiter.cancel()
        return f"could not load model {name}: {reason}"
    await waiter
    return None


class _SignalHandler:
    """SIGINT/SIGTERM: the first starts the graceful shutdown, each later one
    ends the requests still running at once."""

    def __init__(self, app: web.Application, stop: asyncio.Event) -> None:
        self.app, self.stop = app, stop
        self.loop = asyncio.get_running_loop()
        self.tasks: set[asyncio.Task[int]] = set()

    def install(self) -> None:
        for sig in SIGNALS:
            with contextlib.suppress(NotImplementedError):  # Windows: Ctrl-C raises KeyboardInterrupt instead
                self.loop.add_signal_handler(sig, self.on_signal, sig)

    def remove(self) -> None:
        for sig in SIGNALS:
            with contextlib.suppress(NotImplementedError):
                self.loop.remove_signal_handler(sig)

    def on_signal(self, sig: signal.Signals) -> None:
        if not self.stop.is_set():
            log.info("%s: shutting down; requests in flight get up to the shutdown timeout", sig.name)
            self.stop.set()
            return
        engine = self.app[REGISTRY].engine
        task = self.loop.create_task(engine.drain(0))  # the drain's own end, now: error events, 503s
        self.tasks.add(task)
        task.add_done_callback(lambda done: self._ended(done, sig))

    def _ended(self, task: asyncio.Task[int], sig: signal.Signals) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is None:
            log.warning(
                "%s again: ended the %d requests still running at once (streams got the error event); exiting",
                sig.name,
                task.result(),
            )
