"""`POST /v1/rerank` (also `/rerank` and `/v2/rerank`, the paths llama-server,
Jina and Cohere's v2 clients use), `/v1/score` and `/v1/classify`
(`serving.openai.rerank`)."""

from __future__ import annotations

from aiohttp import web

from localserve.api.doc_models import Classifications, RerankAnswer, Scores
from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.serving.openai.rerank import (
    ClassifyBody,
    RerankRequest,
    ScoreRequest,
    classify_texts,
    rerank,
    score,
    tei_answer,
)

#: Rerank's paths beside the prefixed ones: llama-server's `/rerank`, Cohere's `/v2/rerank`.
RERANK_ALIASES = ("/rerank", "/v2/rerank")


def register(app: web.Application) -> None:
    """Add the rerank, score and classify routes to `app`."""
    rerank_paths = [f"{prefix}/rerank" for prefix in API_PREFIXES] + list(RERANK_ALIASES)
    add_routes(app, *(Route("POST", path, rerank_documents, RerankRequest, RerankAnswer) for path in rerank_paths))
    for prefix in API_PREFIXES:
        add_routes(
            app,
            Route("POST", f"{prefix}/score", score_pairs, ScoreRequest, Scores),
            Route("POST", f"{prefix}/classify", classify, ClassifyBody, Classifications),
        )


async def rerank_documents(request: web.Request) -> web.Response:
    """Rank documents by relevance to a query (a cross-encoder, or an embeddings model's cosine)."""
    body = await parse_body(request, RerankRequest)
    answer = await rerank(RequestModels(request), body)
    return web.json_response(tei_answer(answer) if body.tei else answer)


async def score_pairs(request: web.Request) -> web.Response:
    """Score text pairs (text_1 against each text_2, or pairwise)."""
    body = await parse_body(request, ScoreRequest)
    return web.json_response(await score(RequestModels(request), body))


async def classify(request: web.Request) -> web.Response:
    """Classify texts with a sequence-classification model."""
    body = await parse_body(request, ClassifyBody)
    return web.json_response(await classify_texts(RequestModels(request), body))
