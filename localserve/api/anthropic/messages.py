"""Anthropic's Messages API: `POST /v1/messages` and
`POST /v1/messages/count_tokens`, over `serving.chat` (tools enforced by
the same grammar as chat completions' tool calls).

Whole, the answer is a `message` object: `content` blocks (`text`, then a
`tool_use` block per call), `stop_reason` (`end_turn`, `max_tokens`,
`stop_sequence` with `stop_sequence`, or `tool_use`) and `usage`. Streamed,
it is Anthropic's events: `message_start`, `ping`, per block
`content_block_start`, `content_block_delta` (`text_delta` or
`input_json_delta`)..., `content_block_stop`, then `message_delta`
(`stop_reason`, `usage`) and `message_stop`; a failure after the first
event is an `error` event.

Errors on these routes have Anthropic's shape,
`{"type": "error", "error": {"type", "message"}}`, with the HTTP status
(`ERROR_SHAPE`): 400 `invalid_request_error`, 401
`authentication_error`, 404 `not_found_error` (an unknown model), 529
`overloaded_error` for a full queue (503 while loading or shutting down),
500 `api_error`. The key may come as `x-api-key` (see `api.middleware`);
`anthropic-version` and `anthropic-beta` are accepted.
"""

from __future__ import annotations

import json

from aiohttp import web

from localserve.api.doc_models import AnthropicMessage, TokenCount
from localserve.api.hosting import RequestModels
from localserve.api.middleware import ErrorShape, error_response, parse_body
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.api.sse import stream_events
from localserve.errors import LocalServeError, QueueFullError
from localserve.serving.anthropic.answer import MessageEvents, error_body, whole_message
from localserve.serving.anthropic.request import CountTokensRequest, MessagesRequest, chat_request
from localserve.serving.chat import count_chat_tokens, start_chat
from localserve.serving.openai.responses import item_id

OVERLOADED = 529  # Anthropic's status for "overloaded, retry later"


def register(app: web.Application) -> None:
    """Add the Messages routes (give the app's error middleware `ERROR_SHAPE` too)."""
    for prefix in API_PREFIXES:
        add_routes(
            app,
            Route("POST", f"{prefix}/messages", create_message, MessagesRequest, AnthropicMessage),
            Route("POST", f"{prefix}/messages/count_tokens", count_tokens, CountTokensRequest, TokenCount),
        )


def is_messages_path(path: str) -> bool:
    return any(path == f"{p}/messages" or path.startswith(f"{p}/messages/") for p in API_PREFIXES)


def anthropic_error(exc: LocalServeError) -> web.Response:
    """Anthropic's error object; Retry-After and the connection rules as everywhere."""
    response = error_response(exc)
    response.body = json.dumps(error_body(exc)).encode()
    if isinstance(exc, QueueFullError):
        response.set_status(OVERLOADED)
    return response


#: Errors on the Messages routes, the key's included (`api.middleware.error_middleware`).
ERROR_SHAPE = ErrorShape(is_messages_path, anthropic_error)


async def create_message(request: web.Request) -> web.StreamResponse:
    """A message (Anthropic's Messages API): whole, or streamed as events."""
    body = await parse_body(request, MessagesRequest)
    answer = await start_chat(RequestModels(request), chat_request(body), answer_id=item_id("msg"))
    headers = {"X-Request-Id": answer.id, "request-id": answer.id}
    if body.stream:
        return await stream_events(request, answer, MessageEvents(answer), headers=headers)
    async with answer:
        (result,) = await answer.collect()
    return web.json_response(whole_message(answer, result), headers=headers)


async def count_tokens(request: web.Request) -> web.Response:
    """The prompt's token count, tools and system included (nothing is generated)."""
    body = await parse_body(request, CountTokensRequest)
    return web.json_response({"input_tokens": await count_chat_tokens(RequestModels(request), chat_request(body))})
