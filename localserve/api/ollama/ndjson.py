"""Ollama's NDJSON streams: one JSON object per line (`application/x-ndjson`),
the lines `serving.ollama.answer` builds; an error after the first line is a
last `{"error": "..."}` line."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

from aiohttp import web

from localserve.api.http_edge import BYTES_SENT, note_abandoned
from localserve.errors import LocalServeError
from localserve.serving.answer import Answer
from localserve.serving.ollama.answer import OllamaLines

log = logging.getLogger(__name__)


class NdjsonWriter:
    """One JSON object per line; headers go out with the first line, so an
    error before it is still a plain `{"error"}` response with its status."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self.request = request
        self.response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", **headers})

    @property
    def started(self) -> bool:
        return self.response.prepared

    async def send(self, obj: dict[str, Any]) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        try:
            await self.response.write(data)
        except ConnectionResetError:  # the client is gone
            note_abandoned(self.request)
            raise
        self.request[BYTES_SENT] = self.request.get(BYTES_SENT, 0) + len(data)


async def ollama_stream(
    request: web.Request, answer: Answer, lines: OllamaLines, writer: NdjsonWriter
) -> web.StreamResponse:
    """Stream an answer's lines; a client that leaves aborts it."""
    try:
        async with answer:
            async for delta in answer.deltas():
                for line in lines.add(delta, answer):
                    await writer.send(line)
    except ConnectionResetError:
        log.debug("client left %s during streaming; aborted", request.path)
    except Exception as exc:
        if not writer.started:
            raise
        if not isinstance(exc, LocalServeError):
            log.exception("error while streaming %s", request.path)
        message = (
            exc.message if isinstance(exc, LocalServeError) else "the server had an unexpected error while streaming"
        )
        with contextlib.suppress(ConnectionResetError):
            await writer.send({"error": message})
    return writer.response
