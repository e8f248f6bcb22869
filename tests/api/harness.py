"""A real server for the API tests: the real engine and model behind the
real aiohttp app, listening on a loopback port, on its own event-loop thread,
so that tests talk to it with the official (sync or async) `openai` SDK over
HTTP and can still peek at the engine."""

from __future__ import annotations

import asyncio
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from aiohttp import web

from localserve.api.app import create_app
from localserve.api.http_edge import ApiRunner
from localserve.config import ServerSettings
from localserve.engine.engine import Engine, EngineConfig
from localserve.models.registry import ModelRegistry

MODEL_ID = "smollm2-135m-instruct"
API_KEY = "test-key-1234"

RegistryFactory = Callable[[Engine, ServerSettings], ModelRegistry]


class ServerThread:
    """`create_app` served by an `AppRunner` on its own loop thread."""

    def __init__(self, settings: ServerSettings, registry_factory: RegistryFactory = ModelRegistry) -> None:
        self.settings = settings
        self._registry_factory = registry_factory
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="api-test-server", daemon=True)

    # ---- life ---------------------------------------------------------------------

    def start(self) -> ServerThread:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:  # surface start-up failures in the test
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())  # runs cleanup_ctx: engine.close()
        self.loop.close()

    async def _start(self) -> None:
        self.engine = Engine(EngineConfig(max_queue=self.settings.max_queue))
        self.registry = self._registry_factory(self.engine, self.settings)
        self.app = create_app(self.settings, self.registry)
        self.runner = ApiRunner(self.app, handler_cancellation=True)  # as `localserve serve` runs it
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.settings.host, 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)

    # ---- helpers ------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            response = httpx.get(f"{self.base_url}/health", timeout=5)
            if response.status_code == 200:
                return
            if response.json().get("status") == "error":
                raise RuntimeError(f"server failed to load its models: {response.text}")
            time.sleep(0.05)
        raise TimeoutError("server did not become healthy")

    def call(self, fn: Callable[[], Any], timeout: float = 10.0) -> Any:
        """Run `fn` on the server's loop (engine state is the loop's)."""

        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def num_in_flight(self) -> int:
        return int(self.call(lambda: self.engine.num_in_flight(MODEL_ID)))

    def wait_in_flight(self, predicate: Callable[[int], bool], timeout: float) -> int:
        """Poll the number of requests in flight until `predicate` holds."""
        deadline = time.monotonic() + timeout
        while True:
            count = self.num_in_flight()
            if predicate(count) or time.monotonic() > deadline:
                return count
            time.sleep(0.02)

    def tokenize(self, text: str) -> list[int]:
        return list(self.call(lambda: self.engine.tokenizer(MODEL_ID).encode(text)))


def open_raw_stream(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> socket.socket:
    """Send a POST by hand and return the socket unread: a client we can cut off."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    lines.append(f"Content-Length: {len(body)}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return sock


def read_until(sock: socket.socket, marker: bytes, limit: int = 1 << 20) -> bytes:
    data = b""
    while marker not in data and len(data) < limit:
        piece = sock.recv(4096)
        if not piece:
            break
        data += piece
    return data


def make_settings(**overrides: Any) -> ServerSettings:
    base: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "models": [MODEL_ID],
        "parallel": 16,
        "ctx_size": 2048,
        "kv_size": 8192,
        "batch_tokens": 512,
        "max_queue": 64,
        "data_dir": tempfile.mkdtemp(prefix="localserve-test-data-"),  # batch jobs: never the user's own
    }
    base.update(overrides)
    return ServerSettings(**base)
