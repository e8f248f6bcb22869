"""`POST /v1/embeddings`: text or token ids in, vectors out, batched across
requests by the model's batcher."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from localserve.api.middleware import parse_body
from localserve.api.oneshot import PREFIXES, oneshot_model, setup_oneshot, usage_tokens
from localserve.engine.types import parse_priority
from localserve.errors import InvalidRequestError
from localserve.models.oneshot import EMBEDDINGS

MAX_INPUTS = 2048  # as OpenAI


class Embedder(Protocol):
    """What this route needs of an embeddings backend (llama.cpp or ONNX Runtime)."""

    n_embd: int

    def tokenize(self, text: str) -> tuple[int, ...]: ...

    def check(self, token_ids: Sequence[int], param: str) -> tuple[int, ...]: ...


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    priority: float | str | None = None

    @field_validator("input")
    @classmethod
    def _check_input(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("input must not be an empty list")
            if len(value) > MAX_INPUTS and not isinstance(value[0], int):
                raise ValueError(f"at most {MAX_INPUTS} inputs per request; got {len(value)}")
        return value

    @field_validator("priority")
    @classmethod
    def _check_priority(cls, value: float | str | None) -> float | str | None:
        parse_priority(value)
        return value

    def inputs(self) -> list[str | list[int]]:
        """One entry per vector asked for: a text or a token list."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if value and isinstance(value[0], int):
            return [value]  # type: ignore[list-item]  # one token list
        return list(value)  # type: ignore[arg-type]


def register(app: web.Application) -> None:
    """Add the embeddings routes to `app`."""
    for prefix in PREFIXES:
        app.router.add_post(f"{prefix}/embeddings", create_embeddings)
    setup_oneshot(app)


async def create_embeddings(request: web.Request) -> web.Response:
    body = await parse_body(request, EmbeddingRequest)
    model = await oneshot_model(request, body.model, EMBEDDINGS)
    backend: Embedder = model.backend  # type: ignore[assignment]
    if body.dimensions is not None and body.dimensions != backend.n_embd:
        raise InvalidRequestError(
            f"model {body.model!r} does not support 'dimensions' other than its own {backend.n_embd}",
            param="dimensions",
        )
    items = await asyncio.to_thread(_token_lists, backend, body.inputs())
    vectors = await model.batcher.submit(items, priority=parse_priority(body.priority))
    encode = _base64 if body.encoding_format == "base64" else _floats
    data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)]
    num_tokens = sum(len(item) for item in items)
    return web.json_response({"object": "list", "data": data, "model": body.model, "usage": usage_tokens(num_tokens)})


def _token_lists(backend: Embedder, inputs: list[str | list[int]]) -> list[tuple[int, ...]]:
    """Tokenize texts, check token lists; 400 naming the bad input."""
    items = []
    for i, entry in enumerate(inputs):
        param = "input" if len(inputs) == 1 else f"input[{i}]"
        if isinstance(entry, str):
            if not entry:
                raise InvalidRequestError(f"'{param}' is an empty string; send some text", param=param)
            items.append(backend.check(backend.tokenize(entry), param))
        else:
            items.append(backend.check(entry, param))
    return items


def _floats(vector: np.ndarray) -> list[float]:
    return vector.astype(np.float32).tolist()  # type: ignore[no-any-return]


def _base64(vector: np.ndarray) -> str:
    """Little-endian float32, as the openai SDK decodes it."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
