"""A real server (real engine, real model, the real aiohttp app) on a fixed
loopback port, on its own event-loop thread, that a test can stop and start
again on the same port (to watch the dashboard reconnect)."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
import time
from typing import Any

import httpx
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from localserve.api.app import create_app
from localserve.config import ServerSettings
from localserve.engine.engine import Engine, EngineConfig
from localserve.models.registry import ModelRegistry

MODEL_ID = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_settings(**overrides: Any) -> ServerSettings:
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": free_port(),
        "models": [MODEL_ID],
        "parallel": 4,
        "ctx_size": 1024,
        "kv_size": 4096,
        "batch_tokens": 256,
        # One thread: on a busy shared machine llama.cpp's spinning workers
        # slow each other down (3x slower decoding with two threads).
        "threads": 1,
        "data_dir": tempfile.mkdtemp(prefix="localserve-tui-data-"),  # batch jobs: never the user's own
    }
    return ServerSettings(**{**base, **overrides})


class LiveServer:
    """`create_app` with a fresh engine each `start()`, on `settings.port`."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.port}"

    def start(self, timeout: float = 60.0) -> LiveServer:
        ready = threading.Event()
        errors: list[BaseException] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, args=(self._loop, ready, errors), daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise TimeoutError("the test server did not start")
        if errors:
            raise errors[0]
        return self

    def _run(self, loop: asyncio.AbstractEventLoop, ready: threading.Event, errors: list[BaseException]) -> None:
        asyncio.set_event_loop(loop)
        try:
            runner = loop.run_until_complete(self._serve())
        except BaseException as exc:  # surface start-up failures in the test
            errors.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())  # ends the streams, closes the engine
        loop.close()

    async def _serve(self) -> web.AppRunner:
        engine = Engine(EngineConfig(max_queue=self.settings.max_queue))
        app = create_app(self.settings, ModelRegistry(engine, self.settings))
        runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=5.0)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.settings.port).start()
        return runner

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(60)
        self._loop = self._thread = None

    def wait_healthy(self, timeout: float = 120.0) -> LiveServer:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                response = httpx.get(f"{self.base_url}/health", timeout=5, trust_env=False)
            except httpx.HTTPError:
                response = None
            if response is not None and response.status_code == 200:
                return self
            if response is not None and response.json().get("status") == "error":
                raise RuntimeError(f"the server failed to load its model: {response.text}")
            time.sleep(0.1)
        raise TimeoutError("the test server did not become healthy")


def empty_app(**settings: Any) -> web.Application:
    """The real app with no model (nothing to load): for fast route tests."""
    config = ServerSettings(models=[], **settings)
    return create_app(config, ModelRegistry(Engine(), config))


def serve(app: web.Application) -> TestClient:
    """A test client of `app` on a loopback port (use with `async with`)."""
    return TestClient(TestServer(app))
