"""Models held for the requests that use them.

`hold_model(request, model_id, kind=...)` loads the model if needed and holds
it until the request is over (the middleware below gives it back, streaming
answers included), so that it is never evicted mid-request; the request's
`keep_alive` then starts the model's idle clock. `keep_alive` is taken from
the caller, else from the JSON body (Ollama's field; accepted on every JSON
route as an extension).

`holding(app, model_id)` holds a model for longer work than one request:
the batch runner holds the model of a running batch, so that neither LRU
eviction nor keep_alive unloads it between two of its lines.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from localserve.api.state import REGISTRY
from localserve.errors import LocalServeError
from localserve.models.kinds import Kinds
from localserve.models.registry import ModelHold

log = logging.getLogger(__name__)

_HOLDS = "localserve.model_holds"  # request key: the holds this request has


@web.middleware
async def release_holds_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """Give back the models a request held once its answer is written (or it failed or was cancelled)."""
    try:
        return await handler(request)  # type: ignore[no-any-return]
    finally:
        holds: list[ModelHold] = request.pop(_HOLDS, [])
        for hold in holds:
            request.app[REGISTRY].release(hold)


async def hold_model(request: web.Request, model_id: str, *, kind: Kinds | None, keep_alive: Any = None) -> str:
    """Load `model_id` if needed and hold it for this request; the id it is
    served under (`llama3.2` is `llama3.2:latest`). 400 bad id or kind, 404
    unknown, 503 no room."""
    if keep_alive is None:
        keep_alive = await body_keep_alive(request)
    hold = await request.app[REGISTRY].hold(model_id, kind=kind, keep_alive=keep_alive)
    request.setdefault(_HOLDS, []).append(hold)
    return hold.model_id


async def body_keep_alive(request: web.Request) -> Any:
    """`keep_alive` of a JSON body already read by the handler (aiohttp keeps the bytes)."""
    if request.method != "POST" or not request.body_exists or request.content_type != "application/json":
        return None
    raw = await request.read()
    if b'"keep_alive"' not in raw:  # most bodies: no second parse
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data.get("keep_alive") if isinstance(data, dict) else None


@contextlib.asynccontextmanager
async def holding(app: web.Application, model_id: str | None) -> AsyncIterator[ModelHold | None]:
    """Hold `model_id` loaded (loading it if needed) until the block ends.

    Yields None, holding nothing, without a model id, or when the model
    cannot be held now (unknown, wrong, no room): the work's own requests
    then meet that error, each with its envelope."""
    registry = app[REGISTRY]
    hold = None
    if model_id:
        try:
            hold = await registry.hold(model_id)
        except LocalServeError as exc:
            log.info("not holding model %r: %s", model_id, exc.message)
    try:
        yield hold
    finally:
        if hold is not None:
            registry.release(hold)
