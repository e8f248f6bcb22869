"""What `/api/v1/pull` and Ollama's `/api/pull` share: one pull per model at
a time, run in a thread and streamed as NDJSON; and what both deletes share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

from localserve.api.state import REGISTRY
from localserve.errors import InvalidRequestError, LocalServeError
from localserve.models.pull.hub import PullCancelled, PullPlan, PullProgress, PullResult, pull

log = logging.getLogger(__name__)

PULLS = web.AppKey("model_pulls", dict)  # model id -> the pull running for it
Line = dict[str, Any]


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


async def _write_line(response: web.StreamResponse, line: Line) -> None:
    await response.write(json.dumps(line).encode() + b"\n")


async def delete_files(app: web.Application, model_id: str) -> int:
    """Unload `model_id` if loaded, then delete its files; 404 unknown, 400 not ours to delete or being pulled."""
    from localserve.models.store.discovery import find
    from localserve.models.store.hf_remove import remove

    if model_id in app[PULLS]:
        raise InvalidRequestError(f"model {model_id!r} is being pulled; delete it once the pull ends", param="model")
    found = await asyncio.to_thread(find, model_id)
    served_as = found.name if found is not None else model_id
    registry = app[REGISTRY]
    if served_as in registry.records and found is not None and found.source == "huggingface":
        await registry.unload(served_as)
    freed = await asyncio.to_thread(remove, model_id)
    registry.forget_files(served_as)
    return freed
