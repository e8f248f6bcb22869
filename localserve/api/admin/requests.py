"""`POST /api/v1/requests/{id}/cancel`: stop a running request (the id is
the answer's `id`, also sent as the `X-Request-Id` header)."""

from __future__ import annotations

from aiohttp import web

from localserve.api.state import engine_of
from localserve.errors import NotFoundError
from localserve.serving.generation import request_ids
from localserve.serving.openai.schemas import MAX_CHOICES, MAX_PROMPTS


async def cancel_request(request: web.Request) -> web.Response:
    """Stop an answer: its single request, or every choice `ID-i` of it."""
    answer_id = request.match_info["request_id"]
    engine = engine_of(request)
    candidates = [answer_id, *request_ids(answer_id, MAX_CHOICES * MAX_PROMPTS)]
    num_cancelled = sum(engine.abort(request_id) for request_id in candidates)
    if not num_cancelled:
        raise NotFoundError(f"no running request with id {answer_id!r}", param="id")
    return web.json_response({"id": answer_id, "object": "request.cancelled", "num_cancelled": num_cancelled})
