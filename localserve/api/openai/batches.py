"""The Batch API (OpenAI's), under `/v1` and `/api/v1`:

* `POST /batches` `{"input_file_id", "endpoint", "completion_window": "24h", "metadata"}`
* `GET  /batches?after=&limit=` (newest first), `GET /batches/{id}`
* `POST /batches/{id}/cancel`

`register(app)` also adds the Files API and the batch runner's lifecycle
(resumed at start-up, stopped at shutdown), and feeds the dashboard's
`batches` list.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from localserve.api.admin.stats import set_batches_provider
from localserve.api.middleware import parse_body
from localserve.api.openai import files
from localserve.api.openai.batch_service import JOBS, BatchService, jobs_of
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.jobs.types import COMPLETION_WINDOWS
from localserve.serving.openai.batches import CreateBatchRequest


def register(app: web.Application) -> None:
    """Add the Files and Batch routes, the runner's lifecycle and the stats hook."""
    service = app[JOBS] = BatchService(app)
    for prefix in API_PREFIXES:
        add_routes(
            app,
            Route("POST", f"{prefix}/batches", create_batch, CreateBatchRequest),
            Route("GET", f"{prefix}/batches", list_batches, query=("limit", "after")),
            Route("GET", f"{prefix}/batches/{{batch_id}}", get_batch),
            Route("POST", f"{prefix}/batches/{{batch_id}}/cancel", cancel_batch),
        )
    files.register(app)
    app.cleanup_ctx.append(_jobs_lifecycle)
    set_batches_provider(app, service.snapshot)


async def _jobs_lifecycle(app: web.Application) -> AsyncIterator[None]:
    service = app[JOBS]
    await service.resume()
    yield
    await service.close()


async def create_batch(request: web.Request) -> web.Response:
    """Queue a batch; it validates in the background (status `validating`)."""
    body = await parse_body(request, CreateBatchRequest)
    store, runner = await jobs_of(request)
    batch = await store.call(
        store.create_batch,
        body.endpoint,
        body.input_file_id,
        body.completion_window,
        COMPLETION_WINDOWS[body.completion_window],
        body.metadata,
    )
    runner.notify(batch)
    return web.json_response(batch.to_openai())


async def get_batch(request: web.Request) -> web.Response:
    store, _ = await jobs_of(request)
    batch = await store.call(store.get_batch, request.match_info["batch_id"])
    return web.json_response(batch.to_openai())


async def list_batches(request: web.Request) -> web.Response:
    """Newest first; `after` is the id of the last batch of the previous page."""
    store, _ = await jobs_of(request)
    limit = files.query_int(request, "limit", 20, 1, 100)
    batches, has_more = await store.call(store.list_batches, after=request.query.get("after") or None, limit=limit)
    data: list[dict[str, Any]] = [b.to_openai() for b in batches]
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


async def cancel_batch(request: web.Request) -> web.Response:
    """`cancelling` now; `cancelled`, with the finished lines' output, once the
    lines in flight are stopped."""
    store, runner = await jobs_of(request)
    batch = await store.call(store.request_cancel, request.match_info["batch_id"])
    runner.cancel(batch)
    return web.json_response(batch.to_openai())
