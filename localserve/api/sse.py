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
import json
import logging
from typing import Any, Protocol

from aiohttp import web

from localserve.api.http_edge import BYTES_SENT, note_abandoned
from localserve.engine.types import FinishReason
from localserve.errors import LocalServeError
from localserve.serving.answer import Answer
from localserve.serving.types import ChoiceEnd, Delta, Event

log = logging.getLogger(__name__)


class ChunkFormat(Protocol):
    """Turns the serving layer's deltas into the endpoint's chunk objects."""

    def chunks(self, delta: Delta) -> list[dict[str, Any]]: ...

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

    async def send(self, payload: dict[str, Any], *, event: str | None = None) -> None:
        """One `data:` event; with `event`, named (`event: NAME` first)."""
        head = f"event: {event}\n".encode() if event else b""
        data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        await self._write(head + b"data: " + data + b"\n\n")

    async def send_error(self, exc: LocalServeError) -> None:
        with contextlib.suppress(ConnectionResetError):
            await self.send(exc.envelope())

    async def done(self) -> None:
        await self._write(b"data: [DONE]\n\n")

    async def _write(self, data: bytes) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        try:
            await self.response.write(data)
        except ConnectionResetError:  # the client is gone
            note_abandoned(self.request)
            raise
        self.request[BYTES_SENT] = self.request.get(BYTES_SENT, 0) + len(data)


async def stream_answer(
    request: web.Request,
    answer: Answer,
    fmt: ChunkFormat,
    *,
    include_usage: bool,
    headers: dict[str, str],
) -> web.StreamResponse:
    """Stream an answer as SSE. A client that disconnects makes the next
    write fail (or, with handler cancellation, cancels this task); either way
    the answer is aborted before the next step."""
    writer = SseWriter(request, headers)
    open_choices = set(range(answer.num_choices))
    try:
        async with answer:
            async for delta in answer.deltas():
                if isinstance(delta, ChoiceEnd) and delta.error is not None:
                    if writer.started:
                        await _finish_with_error(writer, fmt, delta, sorted(open_choices - {delta.index}))
                    raise delta.error
                for chunk in fmt.chunks(delta):
                    await writer.send(chunk)
                if isinstance(delta, ChoiceEnd):
                    open_choices.discard(delta.index)
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
    return writer.response


async def _finish_with_error(writer: SseWriter, fmt: ChunkFormat, failed: ChoiceEnd, others: list[int]) -> None:
    """The last chunk, `finish_reason: "error"`, of the failed choice and of
    every other choice still open: a client that reads finish reasons sees
    every choice end, and why, before the error event."""
    ends = [failed, *(ChoiceEnd(index, FinishReason.ERROR.value, error=failed.error) for index in others)]
    for end in ends:
        for chunk in fmt.chunks(end):
            await writer.send(chunk)


class EventFormat(Protocol):
    """Turns an answer into named events: the opening ones, those of each
    delta, and those that tell a failure after the stream began."""

    def opening(self) -> list[Event]: ...

    def events(self, delta: Delta) -> list[Event]: ...

    def failure(self, exc: LocalServeError) -> list[Event]: ...


async def stream_events(
    request: web.Request, answer: Answer, fmt: EventFormat, *, headers: dict[str, str]
) -> web.StreamResponse:
    """Stream an answer as named SSE events (no `[DONE]`); a client that
    leaves aborts the answer, as in `stream_answer`."""
    writer = SseWriter(request, headers)
    try:
        async with answer:
            for name, payload in fmt.opening():
                await writer.send(payload, event=name)
            async for delta in answer.deltas():
                if isinstance(delta, ChoiceEnd) and delta.error is not None:
                    raise delta.error
                for name, payload in fmt.events(delta):
                    await writer.send(payload, event=name)
    except ConnectionResetError:
        log.debug("client left %s during streaming; aborted", request.path)
    except Exception as exc:
        if not writer.started:
            raise
        if not isinstance(exc, LocalServeError):
            log.exception("error while streaming %s", request.path)
            exc = LocalServeError("The server had an unexpected error while streaming.")
        with contextlib.suppress(ConnectionResetError):
            for name, payload in fmt.failure(exc):
                await writer.send(payload, event=name)
    return writer.response
