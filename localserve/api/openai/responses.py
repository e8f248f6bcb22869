"""`POST /v1/responses`: OpenAI's Responses API, stateless, over
`serving.chat` (tools and `text.format` enforced by the same grammars as
chat completions).

Whole, the answer is a `response` object: `output` holds a `message` item
with the text (`output_text`), then a `function_call` item per call;
`status` is `completed`, or `incomplete` with `incomplete_details.reason:
"max_output_tokens"` when the token limit cut it. Streamed (`stream: true`)
it is OpenAI's event sequence, each event numbered by `sequence_number`:
`response.created`, `response.in_progress`, then per item
`response.output_item.added`, (`response.content_part.added`,
`response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done`) or (`response.function_call_arguments.delta`...,
`response.function_call_arguments.done`), `response.output_item.done`, and
last `response.completed` or `response.incomplete`. A failure after the
first event is an `error` event followed by `response.failed`. The
`response` object, the whole answer (a batch line's too) and the events are
`serving.openai.responses`'s.
"""

from __future__ import annotations

from aiohttp import web

from localserve.api.doc_models import ResponseObject
from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.api.sse import stream_events
from localserve.serving.openai.request import ResponsesRequest
from localserve.serving.openai.responses import ResponseEvents, start, whole


def register(app: web.Application) -> None:
    for prefix in (*API_PREFIXES, ""):  # "": llama-server's unprefixed route
        add_routes(app, Route("POST", f"{prefix}/responses", create_response, ResponsesRequest, ResponseObject))


async def create_response(request: web.Request) -> web.StreamResponse:
    """A model response (stateless): whole, or streamed as events."""
    body = await parse_body(request, ResponsesRequest)
    response, answer = await start(RequestModels(request), body)
    headers = {"X-Request-Id": response.id}
    if not body.stream:
        return web.json_response(await whole(response, answer), headers=headers)
    return await stream_events(request, answer, ResponseEvents(response, answer, body), headers=headers)
