"""Batch lines answered through the serving layer, exactly as their endpoint
answers an HTTP request: the same validation, the same OpenAI body (the
endpoint's own `serving.openai` functions), the same error envelope and
status. Only `stream` is forced off and `priority` raised to at least
`batch`. No HTTP here.

`ServingLineExecutor` is the runner's `LineExecutor` for the server's
batches (`api/openai/batch_service.py`) and for `localserve batch run`
(`local_model`, a model loaded in the process), whose Ray replicas use it
too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from localserve.config import ServerSettings
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.types import PRIORITY_ALIASES, parse_priority
from localserve.errors import LocalServeError, QueueFullError
from localserve.jobs.types import LineResult, new_id
from localserve.models.registry import ModelRegistry, resolve
from localserve.serving.models import LocalModels, ModelHost
from localserve.serving.openai import chat, completions, embeddings, rerank, responses
from localserve.serving.openai.request import ChatCompletionRequest, ResponsesRequest, TextCompletionRequest
from localserve.serving.validation import from_validation_error

log = logging.getLogger(__name__)

#: A line's answer: its request id (the answer's id, as `X-Request-Id` says) and its OpenAI body.
LineAnswer = tuple[str, dict[str, Any]]
LineHandler = Callable[[ModelHost, dict[str, Any]], Awaitable[LineAnswer]]

BATCH_PRIORITY = PRIORITY_ALIASES["batch"]
RETRY_CODES = frozenset({"model_loading", "queue_full"})  # "not now": the line is sent again
EMBEDDING_IN_FLIGHT = 8  # embedding lines at a time (the model's queue groups them)


async def _chat(host: ModelHost, data: dict[str, Any]) -> LineAnswer:
    body = ChatCompletionRequest.model_validate(data)
    meta, answer = await chat.start(host, body)
    return meta.id, await chat.whole(meta, answer, body)


async def _completion(host: ModelHost, data: dict[str, Any]) -> LineAnswer:
    body = TextCompletionRequest.model_validate(data)
    meta, answer = await completions.start(host, body)
    return meta.id, await completions.whole(meta, answer, body)


async def _responses(host: ModelHost, data: dict[str, Any]) -> LineAnswer:
    response, answer = await responses.start(host, ResponsesRequest.model_validate(data))
    return response.id, await responses.whole(response, answer)


async def _embeddings(host: ModelHost, data: dict[str, Any]) -> LineAnswer:
    return new_id("req_"), await embeddings.answer(host, embeddings.EmbeddingRequest.model_validate(data))


async def _rerank(host: ModelHost, data: dict[str, Any]) -> LineAnswer:
    answer = await rerank.rerank(host, rerank.RerankRequest.model_validate(data))
    return answer["id"], answer


async def _score(host: ModelHost, data: dict[str, Any]) -> LineAnswer:
    answer = await rerank.score(host, rerank.ScoreRequest.model_validate(data))
    return answer["id"], answer


async def _classify(host: ModelHost, data: dict[str, Any]) -> LineAnswer:
    answer = await rerank.classify_texts(host, rerank.ClassifyBody.model_validate(data))
    return answer["id"], answer


LINE_HANDLERS: dict[str, LineHandler] = {
    "/v1/chat/completions": _chat,
    "/v1/completions": _completion,
    "/v1/embeddings": _embeddings,
    "/v1/responses": _responses,
    "/v1/rerank": _rerank,
    "/v1/score": _score,
    "/v1/classify": _classify,
}
#: One-shot endpoints: their lines go to a model's one-shot queue, which groups them.
ONESHOT_ENDPOINTS = frozenset({"/v1/embeddings", "/v1/rerank", "/v1/score", "/v1/classify"})


def batch_priority(value: Any) -> Any:
    """A line's priority: at least as patient as `batch`. A bad value is left
    for the validation to refuse, as it would for any request."""
    if value is None:
        return BATCH_PRIORITY
    try:
        return max(parse_priority(value), BATCH_PRIORITY)
    except (TypeError, ValueError):
        return value


class ServingLineExecutor:
    """Runs batch lines through the serving layer (the runner's `LineExecutor`)."""

    def __init__(self, models: LocalModels, concurrency: int = 0) -> None:
        self.models = models
        self.concurrency = concurrency  # lines in flight; 0 = the model's slots

    async def execute(self, endpoint: str, body: dict[str, Any]) -> LineResult:
        data = {**body, "stream": False, "priority": batch_priority(body.get("priority"))}
        data.pop("stream_options", None)
        try:
            async with self.models.call(keep_alive=data.get("keep_alive")) as host:
                request_id, payload = await LINE_HANDLERS[endpoint](host, data)
        except LocalServeError as exc:
            return _error_result(exc)
        except ValidationError as exc:
            return _error_result(from_validation_error(exc))
        except Exception:
            log.exception("unexpected error in a batch line for %s", endpoint)
            return _error_result(LocalServeError("The server had an unexpected error while processing your request."))
        return LineResult(200, payload, request_id)

    def max_in_flight(self, endpoint: str, model: str | None) -> int:
        """The model's slots. How many of them compute in each step beside
        other requests is the scheduler's call (the batch policy admits batch
        work while the predicted step stays within the interactive latency
        targets, `engine/step/batch_policy.py`)."""
        if self.concurrency:
            return self.concurrency
        if endpoint in ONESHOT_ENDPOINTS:
            return EMBEDDING_IN_FLIGHT
        engine = self.models.registry.engine
        if not model or not engine.has_model(model):
            return 1  # not loaded (yet): one line finds out, and waits or fails
        return engine.capacity(model).num_slots


def _error_result(exc: LocalServeError) -> LineResult:
    """The error envelope with its status; "not now" (503 loading, queue
    full) says when to send the line again."""
    retry_after = None
    if exc.status == 503 and exc.code in RETRY_CODES:
        retry_after = float(exc.retry_after_s) if isinstance(exc, QueueFullError) else 1.0
    return LineResult(exc.status, exc.envelope(), new_id("req_"), retry_after)


@contextlib.asynccontextmanager
async def local_model(
    settings: ServerSettings, name: str, concurrency: int = 0
) -> AsyncIterator[tuple[ServingLineExecutor, str]]:
    """Load model `name` with a fresh engine for `localserve batch run`;
    yields the executor and the model's id, and closes the model after."""
    registry = ModelRegistry(Engine(EngineConfig(max_queue=settings.max_queue)), settings)
    try:
        loaded = await registry.load(await asyncio.to_thread(resolve, name))
        yield ServingLineExecutor(LocalModels(registry), concurrency), loaded.spec.model_id
    finally:
        await registry.close()
