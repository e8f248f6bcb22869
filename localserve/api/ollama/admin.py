"""Ollama's model management routes, for Ollama's clients (`ollama pull`,
`ollama rm`, `ollama cp`, the `ollama` Python library, Open WebUI):

* `POST /api/pull` `{"model", "stream"?}` - fetch from the Hugging Face Hub
  into its cache (`org/repo[:QUANT]`, `hf.co/org/repo[:QUANT]`, a catalog
  id); streams Ollama's progress lines: `pulling manifest`, `pulling
  DIGEST` with `digest`, `total` and `completed`, `verifying sha256 digest`,
  `writing manifest`, `success`; an error is an `{"error": ...}` line.
* `DELETE /api/delete` `{"model"}` - unload and delete a pulled model (a
  model in Ollama's own store or LM Studio's folder is left alone: 400).
* `POST /api/copy` `{"source", "destination"}` - serve a model under a
  second name too (kept in `aliases.json` in the data directory).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from localserve.api.admin.pulls import delete_files, stream_pull
from localserve.api.middleware import parse_body
from localserve.api.routes import Route, add_routes
from localserve.errors import InvalidRequestError, LocalServeError, ModelNotFoundError
from localserve.models.names import validate_model_id
from localserve.models.pull.hub import PullResult, plan_pull
from localserve.models.pull.progress import PullProgress
from localserve.models.store.discovery import find, set_alias
from localserve.serving.ollama.request import CopyRequest, DeleteRequest, OllamaPullRequest


def register(app: web.Application) -> None:
    add_routes(
        app,
        Route("POST", "/api/pull", pull, OllamaPullRequest),
        Route("DELETE", "/api/delete", delete, DeleteRequest),
        Route("POST", "/api/copy", copy, CopyRequest),
    )


async def pull(request: web.Request) -> web.StreamResponse:
    body = await parse_body(request, OllamaPullRequest)
    plan = await asyncio.to_thread(plan_pull, body.model)
    return await stream_pull(request, plan, False, body.stream, _progress, _success, _error)


def _progress(progress: PullProgress) -> dict[str, object] | None:
    if progress.status == "resolving":
        return {"status": "pulling manifest"}
    if progress.status == "downloading":
        digest = progress.digest or progress.file
        return {
            "status": f"pulling {digest[:12]}",
            "digest": f"sha256:{progress.digest}" if progress.digest else progress.file,
            "total": progress.total,
            "completed": progress.completed,
        }
    if progress.status == "verifying":
        return {"status": "verifying sha256 digest"}
    return None


def _success(result: PullResult) -> dict[str, object]:
    return {"status": "success"}


def _error(exc: LocalServeError) -> dict[str, object]:
    return {"error": exc.message}


async def delete(request: web.Request) -> web.Response:
    body = await parse_body(request, DeleteRequest)
    model_id = validate_model_id(body.model)
    await delete_files(request.app, model_id)
    return web.Response(status=200)


async def copy(request: web.Request) -> web.Response:
    body = await parse_body(request, CopyRequest)
    source = validate_model_id(body.source, param="source")
    destination = validate_model_id(body.destination, param="destination")
    found = await asyncio.to_thread(find, source)
    if found is None:
        raise ModelNotFoundError(f"model '{source}' not found", param="source")
    if destination != source and await asyncio.to_thread(_taken, destination):
        raise InvalidRequestError(f"model '{destination}' already exists", param="destination")
    await asyncio.to_thread(set_alias, destination, found.name)
    return web.Response(status=200)


def _taken(name: str) -> bool:
    """Whether `name` already means a model (a catalog id counts even when not downloaded)."""
    try:
        return find(name) is not None
    except ModelNotFoundError:
        return True
