"""Server-sent events in OpenAI's dialect: `data: {json}\\n\\n` per chunk,
then `data: [DONE]\\n\\n`.

The headers go out with the first chunk, not before: an answer that fails
before producing anything still gets a proper JSON error with its status.
After that, an error can only be told in-band: each choice still open gets a
last chunk with `finish_reason: "error"`, then one `data: {"error": ...}`
event ends the stream, without `[DONE]` (the `openai` SDK raises it as an
`APIError`). A shutdown's error is `engine_stopped` (retry), a failed step's
`backend_error`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import Any, Protocol

from aiohttp import web

from localserve.api.generation import MergedStreams, event_error
from localserve.engine.types import FinishReason, TokenEvent
from localserve.errors import LocalServeError

log = logging.getLogger(__name__)


class ChunkFormat(Protocol):
    """Turns token events into the endpoint's chunk objects."""

    def chunks(self, index: int, event: TokenEvent) -> list[dict[str, Any]]: ...

    def usage_chunk(self) -> dict[str, Any]: ...


class SseWriter:
    """Writes SSE chunks to one client, sending the headers on first use."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self.request = request
        self.response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # proxies must not hold chunks back
                **headers,
            }
        )

    @property
    def started(self) -> bool:
        return self.response.prepared

    async def send(self, payload: dict[str, Any]) -> None:
        await self._write(b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")

    async def send_error(self, exc: LocalServeError) -> None:
        with contextlib.suppress(ConnectionResetError):
            await self.send(exc.envelope())

    async def done(self) -> None:
        await self._write(b"data: [DONE]\n\n")

    async def _write(self, data: bytes) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        # Raises ConnectionResetError once the client is gone.
        await self.response.write(data)


async def stream_answer(
    request: web.Request,
    merged: MergedStreams,
    fmt: ChunkFormat,
    *,
    include_usage: bool,
    headers: dict[str, str],
) -> web.StreamResponse:
    """Stream an answer as SSE. A client that disconnects makes the next
    write fail (or, with handler cancellation, cancels this task); either way
    the `finally` aborts every request of the answer before the next step."""
    writer = SseWriter(request, headers)
    open_choices = set(range(len(merged.streams)))
    try:
        async for index, event in merged:
            if event.finish_reason is FinishReason.ERROR:
                if writer.started:
                    await _finish_with_error(writer, fmt, event, [index, *sorted(open_choices - {index})])
                raise event_error(event)
            for chunk in fmt.chunks(index, event):
                await writer.send(chunk)
            if event.finished:
                open_choices.discard(index)
        if include_usage:
            await writer.send(fmt.usage_chunk())
        await writer.done()
    except ConnectionResetError:
        log.debug("client left %s during streaming; aborted", request.path)
    except LocalServeError as exc:
        if not writer.started:
            raise  # nothing sent yet: a plain error response with its status
        await writer.send_error(exc)
    except Exception:
        if not writer.started:
            raise
        log.exception("error while streaming %s", request.path)
        await writer.send_error(LocalServeError("The server had an unexpected error while streaming."))
    finally:
        merged.abort()
    return writer.response


async def _finish_with_error(writer: SseWriter, fmt: ChunkFormat, event: TokenEvent, indexes: list[int]) -> None:
    """The last chunk, `finish_reason: "error"`, of each choice in `indexes`
    (the failed one first, with its own event): a client that reads finish
    reasons sees every choice end, and why, before the error event."""
    for index in indexes:
        choice_event = event if index == indexes[0] else dataclasses.replace(event, num_output_tokens=0)
        for chunk in fmt.chunks(index, choice_event):
            await writer.send(chunk)
