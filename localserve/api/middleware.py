"""Errors and authentication: every failure leaves as an error answer in the
route's dialect.

`error_middleware` is the outermost middleware but for the metrics'. It
maps, once for every dialect:

* `LocalServeError` -> its own status (503 `QueueFullError` adds `Retry-After`);
* pydantic `ValidationError` -> 400 with `param` set to the field's path;
* aiohttp's HTTP errors (unknown route 404, wrong method 405, body too large
  413, ...) -> the same status in the envelope;
* a malformed body that aiohttp finds while the handler reads it (multipart
  part headers, a `Content-Encoding` that does not decode, ...) -> 400, and
  the connection closes after the answer (the rest of the body is unread);
* a body that stops arriving (`body_timeout_middleware`) -> 408, same;
* a full or read-only disk (`ENOSPC`, SQLite's "disk is full", `EROFS`) -> 507;
* anything else -> 500, logged with its traceback; the server goes on.

The answer is OpenAI's envelope, or on a dialect's own routes the shape that
dialect declares (`ErrorShape`: Ollama's `{"error": "..."}`, Anthropic's
`{"type": "error", ...}`), always with the same status and headers.

`parse_body` reads and validates a JSON body; text that cannot be encoded
(a lone UTF-16 surrogate such as `"\\ud800"`, valid JSON but not Unicode)
is a 400 naming the field, for every route and every Batch API line.
Requests too malformed to reach the app at all are answered by
`api.http_edge`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, ValidationError

from localserve.api.state import SETTINGS
from localserve.disk import is_storage_error, storage_error
from localserve.errors import (
    AuthenticationError,
    BodyReadError,
    InvalidRequestError,
    LocalServeError,
    NotFoundError,
    PayloadTooLargeError,
    QueueFullError,
    RequestTimeoutError,
)
from localserve.serving.validation import SURROGATE_ESCAPE, check_unicode, from_validation_error

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Routes that answer without an API key: the liveness probe only.
PUBLIC_PATHS = frozenset({"/health"})


def error_response(exc: LocalServeError) -> web.Response:
    """The OpenAI error envelope for `exc`, with its status."""
    response = web.json_response(exc.envelope(), status=exc.status)
    if exc.close_connection:  # the rest of the body is unread: the connection cannot carry another request
        response.force_close()
    if isinstance(exc, QueueFullError):
        response.headers["Retry-After"] = str(exc.retry_after_s)
    elif exc.status == 503:  # loading or restarting: worth a retry soon
        response.headers["Retry-After"] = "1"
    return response


def from_http_error(exc: web.HTTPException, request: web.Request) -> LocalServeError:
    """aiohttp's own HTTP errors, in our error types."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        limit = request.app[SETTINGS].max_body_bytes
        return PayloadTooLargeError(f"The request body is larger than the limit of {limit} bytes.")
    if isinstance(exc, web.HTTPNotFound):
        return NotFoundError(f"Unknown route: {request.method} {request.path}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        error = LocalServeError(f"Method {request.method} is not allowed on {request.path}; use {allowed}.")
        error.status, error.type, error.code = 405, "invalid_request_error", "method_not_allowed"
        return error
    error = LocalServeError(exc.text or exc.reason)
    error.status = exc.status
    error.type = "invalid_request_error" if exc.status < 500 else "server_error"
    return error


@dataclass(frozen=True, slots=True)
class ErrorShape:
    """How a dialect answers errors on its own routes."""

    on_route: Callable[[str], bool]  # is this request path one of the dialect's routes?
    answer: Callable[[LocalServeError], web.Response]  # built on `error_response`: same status and headers


def error_middleware(*dialects: ErrorShape) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Turn every failure into an error answer; never let one escape. The
    answer has the shape of the first of `dialects` whose routes the path is
    on, else OpenAI's envelope."""

    def answer(request: web.Request, error: LocalServeError) -> web.Response:
        shape = next((d for d in dialects if d.on_route(request.path)), None)
        return error_response(error) if shape is None else shape.answer(error)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise  # redirects and the like are answers, not errors
            response = answer(request, from_http_error(exc, request))
            if isinstance(exc, web.HTTPMethodNotAllowed):
                response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            raise  # the client went away: nobody to answer
        except Exception as exc:
            return answer(request, as_error(exc, request))

    return middleware


def as_error(exc: Exception, request: web.Request) -> LocalServeError:
    """Any failure of a handler as one of our errors (an unexpected one is logged)."""
    if isinstance(exc, LocalServeError):
        return exc
    if isinstance(exc, ValidationError):
        return from_validation_error(exc)
    if isinstance(exc, HttpProcessingError):  # a malformed body read late, e.g. a multipart part's headers
        return InvalidRequestError(f"The request body is malformed: {exc.message}")
    if isinstance(exc, web.RequestPayloadError):  # the body itself did not decode (gzip that is not gzip, ...)
        return body_read_error(exc)
    if is_storage_error(exc):  # a full or read-only disk under a write no handler named: 507, not a bug
        log.warning("%s %s: %s", request.method, request.path, exc)
        return storage_error(exc, request.app[SETTINGS].data_path(), "handling the request")
    log.error("unexpected error in %s %s", request.method, request.path, exc_info=exc)
    return LocalServeError("The server had an unexpected error while processing your request.")


def auth_middleware(
    api_key: str | None, public: Callable[[web.Request], bool] | None = None
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Require `Authorization: Bearer <api_key>` (or `x-api-key: <api_key>`,
    as Anthropic's clients send it) on every route but /health and those
    `public` says need none (the browser UI's page and files)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not api_key or request.path in PUBLIC_PATHS:  # an empty key (unset env var) means none
            return await handler(request)
        if public is not None and public(request):
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if not header and "x-api-key" in request.headers:
            scheme, token = "bearer", request.headers["x-api-key"]
        elif not header:
            raise AuthenticationError(
                "You didn't provide an API key. Send it in the Authorization header: 'Authorization: Bearer YOUR_KEY' "
                "(or as 'x-api-key: YOUR_KEY')."
            )
        # Constant-time comparison: the key must not leak through timing.
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise AuthenticationError("Incorrect API key provided.")
        return await handler(request)

    return middleware


def body_read_error(exc: web.RequestPayloadError) -> BodyReadError:
    """aiohttp's "400, message: ..." of a body that did not decode, as our 400."""
    detail = (str(exc).removeprefix("400, message:").strip().splitlines() or ["undecodable bytes"])[0]
    return BodyReadError(f"The request body could not be read: {detail}")


def body_timeout_middleware(timeout_s: float) -> Callable[..., Awaitable[web.StreamResponse]]:
    """408 for a request body that stops arriving: no byte for `timeout_s`
    seconds while the handler waits for it (a client that declared a longer
    Content-Length than it sends would otherwise hold its connection, and
    the memory of what it sent, for good). 0 turns the limit off."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if not timeout_s or not request.body_exists or request.content.is_eof():
            return await handler(request)
        watchdog = _BodyWatchdog(request.content, timeout_s)
        try:
            return await handler(request)
        finally:
            watchdog.cancel()

    return middleware


class _BodyWatchdog:
    """Checks a body's progress every `timeout_s / 4` seconds; when nothing
    arrived for `timeout_s`, the reader's pending and later reads raise
    `RequestTimeoutError` (the handler answers 408 and the connection closes)."""

    def __init__(self, reader: Any, timeout_s: float) -> None:
        self.reader, self.timeout_s = reader, timeout_s
        self.loop = asyncio.get_running_loop()
        self.num_bytes, self.last_progress = reader.total_raw_bytes, self.loop.time()
        self.handle = self.loop.call_later(timeout_s / 4, self.check)

    def check(self) -> None:
        if self.reader.is_eof() or self.reader.exception() is not None:
            return  # all there, or failed for another reason: nothing to watch
        now = self.loop.time()
        if self.reader.total_raw_bytes != self.num_bytes:
            self.num_bytes, self.last_progress = self.reader.total_raw_bytes, now
        elif now - self.last_progress >= self.timeout_s:
            self.reader.set_exception(
                RequestTimeoutError(
                    f"The request body stopped arriving: no data for {self.timeout_s:g} s after "
                    f"{self.num_bytes} bytes. Send the whole body, as many bytes as Content-Length says."
                )
            )
            return
        self.handle = self.loop.call_later(self.timeout_s / 4, self.check)

    def cancel(self) -> None:
        self.handle.cancel()


async def parse_body(request: web.Request, model: type[M]) -> M:
    """Read and validate a JSON body (400 for bad JSON or text that is not
    Unicode, 413 for too big, 408 for a body that stops arriving)."""
    try:
        raw = await request.read()
    except web.RequestPayloadError as exc:
        raise body_read_error(exc) from None
    if not raw.strip():
        raise InvalidRequestError("The request body is empty; send a JSON object.")
    try:
        data: Any = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, nesting too deep
        raise InvalidRequestError(
            f"We could not parse the JSON body of your request ({exc}). Send valid JSON with Content-Type: application/json."
        ) from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    if SURROGATE_ESCAPE.search(raw) or b"\0" in raw:  # only an escape (or UTF-16/32 JSON) can hold one
        check_unicode(data)
    return model.model_validate(data)
