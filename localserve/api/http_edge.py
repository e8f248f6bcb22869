"""Requests too malformed to reach the app, answered like every other error.

aiohttp's HTTP parser refuses some requests before any handler or
middleware runs: a non-numeric or duplicate `Content-Length`, a header line
over 8190 bytes, an unknown method, TLS sent to the HTTP port. Left alone it
answers them in `text/plain` and logs a traceback for each. `ApiRunner`
serves the app with `JsonErrorRequestHandler`, which answers them with the
OpenAI error envelope (and closes the connection, as aiohttp does) and logs
one line. The same goes for the client's bytes that fail after the answer,
while aiohttp reads and drops the rest of an unread body (a body that
stopped arriving, gzip that is not gzip).

Use `ApiRunner` wherever `web.AppRunner` would serve `create_app`'s app.
It also writes the access log with `AccessLog`: one line per request.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from localserve.errors import InvalidRequestError, LocalServeError

log = logging.getLogger(__name__)

MAX_DETAIL_CHARS = 200
#: The client's fault, not the server's: one log line, no traceback.
CLIENT_ERRORS = (HttpProcessingError, web.RequestPayloadError, LocalServeError, ConnectionError)


def describe(exc: BaseException | None) -> str:
    """aiohttp's multi-line parser message ("Invalid character in
    Content-Length:\\n\\n  b'...'\\n  ^") as one short line."""
    if isinstance(exc, HttpProcessingError | LocalServeError):
        text = exc.message
    else:
        text = str(exc or "") or type(exc).__name__
    lines = [line.strip() for line in text.removeprefix("400, message:").splitlines() if line.strip()]
    detail = lines[0].rstrip(":.") if lines else "malformed request"
    if len(lines) > 1 and lines[1].startswith(("b'", 'b"')):  # the offending line, as the parser quotes it
        detail += f" ({lines[1]})"
    return detail if len(detail) <= MAX_DETAIL_CHARS else detail[: MAX_DETAIL_CHARS - 3] + "..."


class JsonErrorRequestHandler(RequestHandler):
    """aiohttp's protocol handler with JSON error answers and one-line logs
    for requests the parser refused."""

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:  # the server's own failure (or a handler timeout): logged with its traceback
            if exc is not None:
                self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
            error = LocalServeError("The server had an unexpected error while processing your request.")
        else:
            detail = describe(exc) if exc is not None else (message or "malformed request")
            log.warning("refused a malformed request from %s: %s", request.remote or "an unknown client", detail)
            error = InvalidRequestError(f"The request is not valid HTTP: {detail}.", code="bad_request")
        if request.writer.output_size > 0:  # as aiohttp: part of an answer went out, nothing to add
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        response = web.Response(status=status, text=json.dumps(error.envelope()), content_type="application/json")
        response.force_close()
        return response

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, CLIENT_ERRORS):  # e.g. the rest of a body that stopped arriving
            peer = self.transport.get_extra_info("peername") if self.transport else None
            log.info("closed the connection from %s: %s", peer[0] if peer else "an unknown client", describe(exc))
            return
        super().log_exception(*args, **kwargs)


class ApiServer(web.Server):
    """`web.Server` whose connections use `JsonErrorRequestHandler`."""

    def __call__(self) -> RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


#: Request keys: the answer's generated tokens so far, the bytes a stream sent (the abandoned request's log line).
OUTPUT_TOKENS = "localserve.output_tokens"
BYTES_SENT = "localserve.bytes_sent"
ABANDONED = "localserve.abandoned"  # the client left while its answer was being written
CLIENT_CLOSED = 499  # nginx's code for "the client went away first"
ACCESS_LOG = logging.getLogger("aiohttp.access")


def note_abandoned(request: BaseRequest) -> None:
    """A write found the client gone: log and count the request as 499."""
    request[ABANDONED] = True


def log_abandoned(request: BaseRequest, status: int, seconds: float) -> None:
    """The access-log line of a request whose client left before its answer
    ended (aiohttp writes none for a cancelled handler): `AccessLog`'s
    format with status 499, the bytes sent, the time and the tokens it got."""
    if ACCESS_LOG.isEnabledFor(logging.INFO):
        ACCESS_LOG.info(
            '%s "%s %s HTTP/%d.%d" %d %d %.3fs "%s" tokens=%d',
            request.remote,
            request.method,
            request.path_qs,
            request.version.major,
            request.version.minor,
            status,
            request.get(BYTES_SENT, 0),
            seconds,
            request.headers.get("User-Agent", "-"),
            request.get(OUTPUT_TOKENS, 0),
        )


class AccessLog(AbstractAccessLogger):
    """`127.0.0.1 "POST /v1/embeddings HTTP/1.1" 200 4973 0.012s "python-httpx/0.28"`: the
    client, request line, status, bytes sent, seconds taken and user agent.
    The log format adds the date, so the line carries no second timestamp;
    formatting is left to the handler (aiohttp's own format-string logger
    cost about a tenth of the event loop's time on short embeddings)."""

    def log(self, request: BaseRequest, response: web.StreamResponse, time: float) -> None:
        if request.get(ABANDONED):
            log_abandoned(request, CLIENT_CLOSED, time)
        elif self.logger.isEnabledFor(logging.INFO):
            self.logger.info(
                '%s "%s %s HTTP/%d.%d" %d %d %.3fs "%s"',
                request.remote,
                request.method,
                request.path_qs,
                request.version.major,
                request.version.minor,
                response.status,
                response.body_length,
                time,
                request.headers.get("User-Agent", "-"),
            )


class ApiRunner(web.AppRunner):
    """`web.AppRunner` serving through `ApiServer` and logging with
    `AccessLog`; same arguments."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("access_log_class", AccessLog)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return ApiServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **server._kwargs,
        )
