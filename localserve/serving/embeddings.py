"""Embeddings: texts or token lists in, one vector each out, batched across
callers by the model's micro-batcher."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from localserve.engine.types import PRIORITY_ALIASES
from localserve.errors import InvalidRequestError
from localserve.models.matryoshka import dimensions_resize
from localserve.models.oneshot import EMBEDDINGS
from localserve.serving.models import ModelHost, hold_oneshot_model


class Embedder(Protocol):
    """What embeddings need of a backend (llama.cpp or ONNX Runtime)."""

    n_embd: int

    def tokenize(self, text: str) -> tuple[int, ...]: ...

    def check(self, token_ids: Sequence[int], param: str) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """One vector per input; `dimensions` shortens them (Matryoshka-trained models only)."""

    model: str
    inputs: tuple[str | tuple[int, ...], ...]
    dimensions: int | None = None
    priority: float = PRIORITY_ALIASES["default"]
    param: str = "input"


@dataclass(frozen=True, slots=True)
class Embeddings:
    """The vectors, in input order, and the tokens they read."""

    model_id: str
    vectors: list[np.ndarray] = field(default_factory=list)
    num_tokens: int = 0


async def embed(host: ModelHost, request: EmbeddingsRequest) -> Embeddings:
    """Tokenize (off the event loop), check, and run on the model's batcher."""
    model = await hold_oneshot_model(host, request.model, EMBEDDINGS)
    backend: Embedder = model.backend  # type: ignore[assignment]
    # Shorter vectors only from Matryoshka-trained models (models/matryoshka.py); 400 otherwise.
    resize = dimensions_resize(request.model, model.spec.path, backend.n_embd, request.dimensions)
    items = await asyncio.to_thread(_token_lists, backend, request.inputs, request.param)
    vectors = await model.batcher.submit(items, priority=request.priority)
    if resize is not None:
        vectors = [resize(vector) for vector in vectors]
    return Embeddings(request.model, list(vectors), sum(len(item) for item in items))


def _token_lists(backend: Embedder, inputs: Sequence[str | tuple[int, ...]], name: str) -> list[tuple[int, ...]]:
    """Tokenize texts, check token lists; 400 naming the bad input."""
    items = []
    for i, entry in enumerate(inputs):
        param = name if len(inputs) == 1 else f"{name}[{i}]"
        if isinstance(entry, str):
            if not entry:
                raise InvalidRequestError(f"'{param}' is an empty string; send some text", param=param)
            items.append(backend.check(backend.tokenize(entry), param))
        else:
            items.append(backend.check(entry, param))
    return items
