"""What the Files and Batch routes share: the job store and the batch runner
of the app (opened lazily, resumed at start-up), and the executor that runs a
batch line through the very handler of its endpoint.

A line is not an HTTP request, but the handlers only read a request's app and
body (and keep notes in it): `LineRequest` carries those, and the line goes
through the same handler, error envelope and model leases as an interactive
request, so validation, errors and answers are the same to the byte. Only
`stream` is forced off and `priority` raised to at least `batch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

from localserve.api.chat import chat_completions
from localserve.api.completions import completions
from localserve.api.embeddings import create_embeddings
from localserve.api.leases import model_lease, release_leases_middleware
from localserve.api.middleware import error_middleware
from localserve.api.state import MANAGER, SETTINGS, STATE, ApiState
from localserve.config import ServerSettings
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.types import PRIORITY_ALIASES, parse_priority
from localserve.errors import LocalServeError
from localserve.jobs.runner import BatchRunner, RunnerConfig
from localserve.jobs.store import JobStore
from localserve.jobs.types import LineResult, new_id
from localserve.jobs.validate import Limits
from localserve.models.registry import ModelManager, resolve

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HANDLERS: dict[str, Handler] = {
    "/v1/chat/completions": chat_completions,
    "/v1/completions": completions,
    "/v1/embeddings": create_embeddings,
}
#: What a line goes through around its handler, outermost first: the error
#: envelope and the model leases are part of answering; the Host, CORS and key
#: checks guard the HTTP edge (the batch passed them when it was created), and
#: the HTTP metrics count answers sent over HTTP.
LINE_MIDDLEWARES = (error_middleware, release_leases_middleware)
BATCH_PRIORITY = PRIORITY_ALIASES["batch"]
RETRY_CODES = frozenset({"model_loading", "queue_full"})  # "not now": the line is sent again
EMBEDDING_IN_FLIGHT = 8  # embedding lines at a time (the model's batcher groups them)


class LineRequest(dict[str, Any]):
    """The parts of `web.Request` the endpoint handlers read, for a batch line
    (a mapping too, like `web.Request`, for per-request notes)."""

    method = "POST"
    content_type = "application/json"
    can_read_body = body_exists = True
    remote = None
    transport = None

    def __init__(self, app: web.Application, path: str, body: bytes) -> None:
        super().__init__()
        self.app = app
        self.path = path
        self.headers = CIMultiDictProxy(CIMultiDict({"Content-Type": self.content_type}))
        self.query: MultiDictProxy[str] = MultiDictProxy(MultiDict())
        self.match_info: dict[str, str] = {}
        self._body = body

    async def read(self) -> bytes:
        return self._body

    async def text(self) -> str:
        return self._body.decode("utf-8")

    async def json(self) -> Any:
        return json.loads(self._body)


def _with_middlewares(handler: Handler) -> Handler:
    for middleware in reversed(LINE_MIDDLEWARES):
        handler = functools.partial(middleware, handler=handler)
    return handler


def batch_priority(value: Any) -> Any:
    """A line's priority: at least as patient as `batch`. A bad value is left
    for the handler to refuse, as it would for any request."""
    if value is None:
        return BATCH_PRIORITY
    try:
        return max(parse_priority(value), BATCH_PRIORITY)
    except (TypeError, ValueError):
        return value


class AppLineExecutor:
    """Runs batch lines through `app`'s handlers (the runner's `LineExecutor`)."""

    def __init__(self, app: web.Application, concurrency: int = 0) -> None:
        self.app = app
        self.concurrency = concurrency  # lines in flight; 0 = the model's slots

    async def execute(self, endpoint: str, body: dict[str, Any]) -> LineResult:
        data = {**body, "stream": False, "priority": batch_priority(body.get("priority"))}
        data.pop("stream_options", None)
        request = LineRequest(self.app, endpoint, json.dumps(data).encode())
        response = await _with_middlewares(HANDLERS[endpoint])(cast(web.Request, request))
        if not isinstance(response, web.Response) or not isinstance(response.body, bytes):  # handlers answer JSON
            raise TypeError(f"{endpoint} answered a batch line with {type(response).__name__}, not a JSON response")
        payload = json.loads(response.body)
        request_id = response.headers.get("X-Request-Id") or new_id("req_")
        retry_after = None
        if response.status == 503 and (payload.get("error") or {}).get("code") in RETRY_CODES:
            retry_after = float(response.headers.get("Retry-After", "1"))
        return LineResult(response.status, payload, request_id, retry_after)

    def max_in_flight(self, endpoint: str, model: str | None) -> int:
        """The model's slots. How many of them compute in each step beside
        other requests is the scheduler's call (it narrows batch work while
        the model is busy, see `SchedulerConfig.batch_seqs_busy`)."""
        if self.concurrency:
            return self.concurrency
        if endpoint == "/v1/embeddings":
            return EMBEDDING_IN_FLIGHT
        engine = self.app[MANAGER].engine
        if not model or not engine.has_model(model):
            return 1  # not loaded (yet): one line finds out, and waits or fails
        return engine.capacity(model).max_num_seqs


def headless_app(settings: ServerSettings) -> web.Application:
    """An app with the API's state and a fresh engine, never served: what
    `localserve batch run` runs its lines through."""
    app = web.Application()
    app[SETTINGS] = settings
    app[MANAGER] = ModelManager(Engine(EngineConfig(max_queue=settings.max_queue)), settings)
    app[STATE] = ApiState()
    return app


@contextlib.asynccontextmanager
async def local_model(
    settings: ServerSettings, name: str, concurrency: int = 0
) -> AsyncIterator[tuple[AppLineExecutor, str]]:
    """Load model `name` into a headless app for `localserve batch run`;
    yields the executor and the model's id, and closes the model after."""
    app = headless_app(settings)
    manager = app[MANAGER]
    try:
        loaded = await manager.load(resolve(name))
        yield AppLineExecutor(app, concurrency), loaded.spec.model_id
    finally:
        await manager.engine.close()
        await manager.close_oneshot()


class BatchService:
    """The app's job store and runner. Opened on first use of the Files or
    Batch API, or at start-up when a store exists (to resume its batches)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.store: JobStore | None = None
        self.runner: BatchRunner | None = None
        self._lock = asyncio.Lock()

    @property
    def root(self) -> Path:
        return self.app[SETTINGS].data_path() / "jobs"

    def limits(self) -> Limits:
        settings = self.app[SETTINGS]
        return Limits(max_lines=settings.batch_max_lines, max_bytes=settings.batch_max_file_bytes)

    async def open(self) -> tuple[JobStore, BatchRunner]:
        async with self._lock:
            if self.store is None or self.runner is None:
                store = await asyncio.to_thread(JobStore, self.root)
                executor = AppLineExecutor(self.app, self.app[SETTINGS].batch_concurrency)
                hold = functools.partial(model_lease, self.app)  # the batch's model stays loaded while it runs
                runner = BatchRunner(store, executor, RunnerConfig(limits=self.limits()), hold_model=hold)
                await runner.start()
                self.store, self.runner = store, runner
                log.info("batch jobs in %s", self.root)
        return self.store, self.runner

    async def resume(self) -> None:
        """At start-up: open an existing store, so its unfinished batches go on."""
        if await asyncio.to_thread((self.root / "jobs.sqlite3").exists):
            try:
                await self.open()
            except LocalServeError as exc:  # e.g. another server runs them: serve the rest anyway
                log.warning("batch jobs not resumed: %s", exc.message)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.stop()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        self.store = self.runner = None

    def snapshot(self) -> list[dict[str, Any]]:
        """The stats hook: batch objects of unfinished and recent batches."""
        return self.runner.snapshot() if self.runner is not None else []


JOBS = web.AppKey("jobs", BatchService)


async def jobs_of(request: web.Request) -> tuple[JobStore, BatchRunner]:
    return await request.app[JOBS].open()
