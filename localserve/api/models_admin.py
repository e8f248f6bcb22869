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
* `GET /api/v1/loaded` - the loaded models: kind, state, keep_alive, expiry.
* Ollama's `/api/pull`, `/api/delete` and `/api/copy` (`api.ollama_admin`).
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
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from localserve.api.leases import LIFECYCLE, release_leases_middleware
from localserve.api.middleware import parse_body
from localserve.api.state import MANAGER, SETTINGS, STATE
from localserve.errors import LocalServeError, ModelLoadingError
from localserve.models.catalog import ModelOptions
from localserve.models.lifecycle import ModelLifecycle
from localserve.models.names import validate_model_id
from localserve.models.policy import format_keep_alive
from localserve.models.pull import PullCancelled, PullPlan, PullProgress, PullResult, plan_pull, pull

log = logging.getLogger(__name__)

PULLS = web.AppKey("model_pulls", dict)  # model id -> the pull running for it
Line = dict[str, Any]


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


def register(app: web.Application) -> None:
    """Routes, the lifecycle (on-demand loads, LRU, keep_alive) and its reaper."""
    from localserve.api import ollama_admin

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
    ollama_admin.register(app)


async def _reaper(app: web.Application) -> AsyncIterator[None]:
    app[LIFECYCLE].start()
    yield
    await app[LIFECYCLE].stop()


# ---- pull ----------------------------------------------------------------------------


async def pull_model(request: web.Request) -> web.StreamResponse:
    """`POST /api/v1/pull`: bad ids and unknown models fail before the stream starts."""
    body = await parse_body(request, PullRequest)
    plan = await asyncio.to_thread(plan_pull, body.model)
    return await stream_pull(request, plan, body.force, body.stream, progress_line, success_line, error_line)


async def stream_pull(
    request: web.Request,
    plan: PullPlan,
    force: bool,
    stream: bool,
    on_progress: Callable[[PullProgress], Line | None],
    on_success: Callable[[PullResult], Line],
    on_error: Callable[[LocalServeError], Line],
) -> web.StreamResponse:
    """Run the pull and answer with NDJSON progress lines shaped by the
    callbacks (this server's own, or Ollama's), or one object at the end."""
    if not stream:
        return web.json_response(on_success(await run_pull(request.app, plan, force, None)))
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    queue: asyncio.Queue[PullProgress | None] = asyncio.Queue()
    job = asyncio.ensure_future(run_pull(request.app, plan, force, queue))
    job.add_done_callback(lambda _: queue.put_nowait(None))
    try:
        while (progress := await queue.get()) is not None:
            line = on_progress(progress)
            if line is not None:
                await _write_line(response, line)
        await _write_line(response, on_success(job.result()))
    except LocalServeError as exc:
        await _write_line(response, on_error(exc))
    except Exception as exc:  # a bug: the status line is sent already, so say it in the stream
        log.exception("pull of %s failed", plan.model_id)
        await _write_line(response, on_error(LocalServeError(str(exc))))
    finally:
        job.cancel()  # the client left: stop the download (huggingface_hub's .incomplete stays for a resume)
    await response.write_eof()
    return response


async def run_pull(
    app: web.Application, plan: PullPlan, force: bool, queue: asyncio.Queue[PullProgress | None] | None
) -> PullResult:
    """Pull in a thread, one pull per model at a time; progress goes to `queue`."""
    running: dict[str, asyncio.Future[PullResult]] = app[PULLS]
    while (previous := running.get(plan.model_id)) is not None and not previous.done():
        if queue is not None:
            queue.put_nowait(PullProgress(plan.model_id, f"waiting for another pull of {plan.model_id}"))
        await asyncio.wait({previous})
    loop, cancel = asyncio.get_running_loop(), threading.Event()

    def report(progress: PullProgress) -> None:
        if queue is not None:
            loop.call_soon_threadsafe(queue.put_nowait, progress)

    task = asyncio.ensure_future(asyncio.to_thread(pull, plan, progress=report, cancel=cancel, force=force))
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


async def _write_line(response: web.StreamResponse, line: Line) -> None:
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
    """`DELETE /api/v1/models/{id}`: unload (if loaded) and delete from the Hugging Face cache."""
    model_id = validate_model_id(request.match_info["model_id"])
    freed = await delete_files(request.app, model_id)
    return web.json_response({"object": "model", "id": model_id, "deleted": True, "freed_bytes": freed})


async def delete_files(app: web.Application, model_id: str) -> int:
    """Unload `model_id` if loaded, then delete its files; 404 unknown, 400 not ours to delete or being pulled."""
    from localserve.errors import InvalidRequestError
    from localserve.models.discovery import find
    from localserve.models.hf_remove import remove

    if model_id in app[PULLS]:
        raise InvalidRequestError(f"model {model_id!r} is being pulled; delete it once the pull ends", param="model")
    found = await asyncio.to_thread(find, model_id)
    served_as = found.name if found is not None else model_id
    lifecycle = app[LIFECYCLE]
    lifecycle.sync()
    if served_as in lifecycle.records and found is not None and found.source == "huggingface":
        await lifecycle.unload(served_as)
    freed = await asyncio.to_thread(remove, model_id)
    lifecycle.forget(served_as)
    return freed
