"""`POST /v1/embeddings`: text or token ids in, vectors out
(`serving.openai.embeddings`)."""

from __future__ import annotations

import orjson
from aiohttp import web

from localserve.api.doc_models import EmbeddingList
from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.serving.openai.embeddings import EmbeddingRequest, answer


def register(app: web.Application) -> None:
    """Add the embeddings routes to `app`."""
    for prefix in API_PREFIXES:
        add_routes(app, Route("POST", f"{prefix}/embeddings", create_embeddings, EmbeddingRequest, EmbeddingList))


async def create_embeddings(request: web.Request) -> web.Response:
    body = await parse_body(request, EmbeddingRequest)
    result = await answer(RequestModels(request), body, arrays=True)
    return web.Response(body=orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY), content_type="application/json")
