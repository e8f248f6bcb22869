"""Model management over HTTP (the store and the loaded models).

* `POST /api/v1/pull` `{"model": ID or "hf://OWNER/REPO[@REV]/FILE", "name": ID?,
  "stream": true, "force": false}` - fetch into the model store. Streams
  NDJSON as Ollama's `/api/pull` does: `{"status": "resolving" | "downloading"
  | "verifying" | "exists" | "success", "model", "file", "completed", "total",
  "rate_bytes_per_s", "eta_s", "file_index", "num_files"}` lines, the last one
  `{"status": "success"}` or `{"status": "error", "error": {...}}`.
  `"stream": false` answers one JSON object at the end.
* `POST /api/v1/load` `{"model": ID, "keep_alive": "5m"?, "options": {"ctx_size", "parallel",
  "kv_size", "device", "n_gpu_layers"}?}` - load now; `options` win over the
  flags, the config file and the catalog (400 if it is loaded with others).
  The answer carries the effective options.
* `DELETE /api/v1/models/{id}` (and `/v1/models/{id}`) - unload it if
  loaded and delete it from the model store.
* `GET /api/v1/loaded` - the loaded models: kind, state, keep_alive, expiry.
* `POST /api/v1/unload` lives in `api.stats`.

A pull runs in a thread; a client that disconnects stops it, and the next
pull of that model resumes where it stopped. Two pulls of one model run one
after the other (the second finds it done).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from localserve.api.leases import LIFECYCLE, release_leases_middleware
from localserve.api.middleware import parse_body
from localserve.api.state import MANAGER, SETTINGS, STATE
from localserve.errors import InvalidRequestError, LocalServeError, ModelLoadingError, ModelNotFoundError
from localserve.models.catalog import ModelOptions
from localserve.models.lifecycle import ModelLifecycle
from localserve.models.policy import format_keep_alive
from localserve.models.pull import PullCancelled, PullPlan, PullProgress, plan_pull, pull
from localserve.models.store import Manifest, ModelStore, validate_model_id

log = logging.getLogger(__name__)

PULLS = web.AppKey("model_pulls", dict)  # model id -> the pull running for it


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    name: str | None = None
    stream: bool = True
    force: bool = False


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str
    keep_alive: str | float | None = None
    options: ModelOptions | None = None


def register(app: web.Application) -> None:
    """Routes, the lifecycle (on-demand loads, LRU, keep_alive) and its reaper."""
    app[LIFECYCLE] = ModelLifecycle(app[MANAGER], app[SETTINGS])
    app[PULLS] = {}
    app.middlewares.append(release_leases_middleware)  # innermost: runs when the handler is done
    app.cleanup_ctx.append(_reaper)
    app.router.add_post("/api/v1/pull", pull_model)
    app.router.add_post("/api/v1/load", load_model)
    app.router.add_get("/api/v1/loaded", loaded_models)
    for prefix in ("/v1", "/api/v1"):
        # Any characters ('/' and newlines too): every bad id reaches the handler and its 400, not the router's 404.
        app.router.add_delete(prefix + r"/models/{model_id:[\s\S]+}", delete_model)


async def _reaper(app: web.Application) -> AsyncIterator[None]:
    app[LIFECYCLE].start()
    yield
    await app[LIFECYCLE].stop()


# ---- pull ----------------------------------------------------------------------------


async def pull_model(request: web.Request) -> web.StreamResponse:
    """`POST /api/v1/pull`: bad ids and unknown models fail before the stream starts."""
    body = await parse_body(request, PullRequest)
    plan = await asyncio.to_thread(plan_pull, body.model, name=body.name)
    if not body.stream:
        manifest = await _run_pull(request.app, plan, body.force, None)
        return web.json_response(_success(manifest))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    job = asyncio.ensure_future(_run_pull(request.app, plan, body.force, queue))
    job.add_done_callback(lambda _: queue.put_nowait({}))
    try:
        while line := await queue.get():
            await _write_line(response, line)
        await _write_line(response, _success(job.result()))
    except LocalServeError as exc:
        await _write_line(response, {"status": "error", **exc.envelope()})
    except Exception as exc:  # a bug: the status line is sent already, so say it in the stream
        log.exception("pull of %s failed", plan.model_id)
        await _write_line(response, {"status": "error", "error": {"message": str(exc), "type": "server_error"}})
    finally:
        job.cancel()  # the client left: stop the download (its .partial stays for a resume)
    await response.write_eof()
    return response


async def _run_pull(
    app: web.Application, plan: PullPlan, force: bool, queue: asyncio.Queue[dict[str, Any]] | None
) -> Manifest:
    """Pull in a thread, one pull per model at a time; progress goes to `queue`."""
    running: dict[str, asyncio.Future[Manifest]] = app[PULLS]
    while (previous := running.get(plan.model_id)) is not None and not previous.done():
        if queue is not None:
            queue.put_nowait({"status": f"waiting for another pull of {plan.model_id}", "model": plan.model_id})
        await asyncio.wait({previous})
    loop, cancel = asyncio.get_running_loop(), threading.Event()

    def report(progress: PullProgress) -> None:
        if queue is not None:
            loop.call_soon_threadsafe(queue.put_nowait, _progress_line(progress))

    task = asyncio.ensure_future(
        asyncio.to_thread(pull, plan, store=ModelStore(), progress=report, cancel=cancel, force=force)
    )
    running[plan.model_id] = task
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(PullCancelled, LocalServeError):
            await task  # the thread stops at its next chunk; the next pull of this model waits for it
        raise
    finally:
        if running.get(plan.model_id) is task and task.done():
            del running[plan.model_id]


def _progress_line(progress: PullProgress) -> dict[str, Any]:
    line = dataclasses.asdict(progress)
    line["model"] = line.pop("model_id")
    line["rate_bytes_per_s"] = round(progress.rate_bytes_per_s, 1)
    line["eta_s"] = None if progress.eta_s is None else round(progress.eta_s, 1)
    return line


def _success(manifest: Manifest) -> dict[str, Any]:
    return {"status": "success", "model": manifest.model_id, "total": manifest.size_bytes, "source": manifest.source}


async def _write_line(response: web.StreamResponse, line: dict[str, Any]) -> None:
    await response.write(json.dumps(line).encode() + b"\n")


# ---- load, loaded, delete ------------------------------------------------------------


async def load_model(request: web.Request) -> web.Response:
    """`POST /api/v1/load`: load a known model now (waits for the load)."""
    body = await parse_body(request, LoadRequest)
    validate_model_id(body.model)
    if body.model not in request.app[MANAGER].loaded and request.app[STATE].loading:
        raise ModelLoadingError("start-up models are still loading; retry in a moment")
    lifecycle = request.app[LIFECYCLE]
    lease = await lifecycle.acquire(body.model, keep_alive=body.keep_alive, options=body.options)
    lifecycle.release(lease)
    record = lease.record
    return web.json_response(
        {
            "object": "model.loaded",
            "model": body.model,
            "kind": record.kind,
            "keep_alive": format_keep_alive(record.keep_alive_s),
            "options": request.app[MANAGER].load_report(body.model),
        }
    )


async def loaded_models(request: web.Request) -> web.Response:
    """`GET /api/v1/loaded`: what the server holds, and until when."""
    return web.json_response({"object": "list", "data": request.app[LIFECYCLE].describe()})


async def delete_model(request: web.Request) -> web.Response:
    """`DELETE /api/v1/models/{id}`: unload (if loaded) and remove from the store; 404 if not stored."""
    model_id = validate_model_id(request.match_info["model_id"])
    if model_id in request.app[PULLS]:
        raise InvalidRequestError(f"model {model_id!r} is being pulled; delete it once the pull ends", param="model")
    store = ModelStore()
    if not await asyncio.to_thread(store.model_dir(model_id).is_dir):
        raise ModelNotFoundError(f"model {model_id!r} is not in the model store ({store.root})", param="model")
    lifecycle = request.app[LIFECYCLE]
    lifecycle.sync()
    if model_id in lifecycle.records:
        await lifecycle.unload(model_id)
    freed = await asyncio.to_thread(store.remove, model_id)
    lifecycle.forget(model_id)
    return web.json_response({"object": "model", "id": model_id, "deleted": True, "freed_bytes": freed})
