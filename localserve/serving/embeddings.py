"""Embeddings: texts or token lists in, one vector each out, batched across
callers by the model's one-shot queue."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeGuard, runtime_checkable

import numpy as np

from localserve.engine.types import PRIORITY_ALIASES
from localserve.errors import BackendError, ContextLengthError, InvalidRequestError
from localserve.models.kinds import ModelKind
from localserve.models.matryoshka import dimensions_resize
from localserve.serving.models import ModelHost, hold_oneshot_model

#: Inputs this short (in characters or token ids, all together) are tokenized
#: on the event loop: a hop to a worker thread costs more than tokenizing a
#: few sentences (in a py-spy trace of 32 clients sending one ~15-token query
#: each, the hop was about 15% of the event loop's samples); longer ones go
#: off the loop.
INLINE_TOKENIZE_CHARS = 2000
_EMBEDDERS: weakref.WeakKeyDictionary[object, bool] = weakref.WeakKeyDictionary()  # backend -> is an Embedder


@runtime_checkable
class Embedder(Protocol):
    """What embeddings need of a backend (llama.cpp, ONNX Runtime, OpenVINO),
    besides `OneShotBackend.run` on the queue's thread. `tokenize` and
    `check` may be called from any thread (here: a worker thread)."""

    n_embd: int

    def tokenize(self, text: str) -> tuple[int, ...]: ...

    def check(self, token_ids: Sequence[int], param: str) -> tuple[int, ...]:
        """`token_ids` as the queue's item; 400 naming `param` for an input
        the model cannot embed (too long, a token id out of range)."""
        ...


# Optional on an Embedder: `max_input_tokens`, the longest input `check` lets
# through. Only `truncate` needs it; a backend without it (a plugin written
# against the interface above) embeds everything else alike.


@dataclass(frozen=True, slots=True)
class EmbeddingsRequest:
    """One vector per input; `dimensions` shortens them (Matryoshka-trained
    models only). A text longer than the model takes is a 400, or with
    `truncate` cut to fit (Ollama's default), keeping its closing special
    token. No inputs: the model is held (loaded) and no vector made.
    `per_token`: the caller also takes a model loaded with `--pooling none`,
    whose vectors are [n_tokens, n_embd] (llama-server's native routes);
    any other caller gets a 400 from such a model, as from llama-server."""

    model: str
    inputs: tuple[str | tuple[int | str, ...], ...]  # texts, token ids (text pieces among them are tokenized)
    dimensions: int | None = None
    priority: float = PRIORITY_ALIASES["default"]
    param: str = "input"
    truncate: bool = False
    per_token: bool = False


@dataclass(frozen=True, slots=True)
class Embeddings:
    """The vectors, in input order, and the tokens they read."""

    model_id: str
    vectors: list[np.ndarray] = field(default_factory=list)
    num_tokens: int = 0


async def embed(host: ModelHost, request: EmbeddingsRequest) -> Embeddings:
    """Tokenize (off the event loop), check, and run on the model's queue."""
    model = await hold_oneshot_model(host, request.model, ModelKind.EMBEDDINGS)
    backend = model.backend
    if not _is_embedder(backend):  # a backend registered for embeddings without the interface
        raise BackendError(f"model {request.model!r}: its backend does not make embeddings")
    if getattr(backend, "pooling", None) == "none" and not (request.per_token and request.dimensions is None):
        raise InvalidRequestError(
            f"model {model.spec.model_id!r} runs with --pooling none: it gives a vector per token, not one per "
            "input, which only llama.cpp's /embedding and /embeddings (no /v1) return; serve it without --pooling "
            "none for pooled vectors",
            param=request.param,
        )
    # Shorter vectors only from Matryoshka-trained models (models/matryoshka.py); 400 otherwise.
    resize = dimensions_resize(request.model, model.spec.path, backend.n_embd, request.dimensions)
    limit = getattr(backend, "max_input_tokens", None)
    args = (backend, request.inputs, request.param, limit, request.truncate)
    if sum(len(x) for x in request.inputs) <= INLINE_TOKENIZE_CHARS:
        items = _token_lists(*args)
    else:
        items = await asyncio.to_thread(_token_lists, *args)
    vectors = await model.queue.submit(items, priority=request.priority)
    if resize is not None:
        vectors = [resize(vector) for vector in vectors]
    return Embeddings(model.spec.model_id, list(vectors), sum(len(item) for item in items))


def _is_embedder(backend: object) -> TypeGuard[Embedder]:
    """isinstance against the runtime-checkable protocol, once per backend
    object: that check walks the protocol's members on every call, which
    was about 5% of the event loop's samples serving short queries to 32
    clients (a py-spy trace). The backend is remembered weakly, so an
    unloaded model's backend is not kept alive by this."""
    try:
        return _EMBEDDERS[backend]
    except KeyError:
        pass
    except TypeError:  # not weakly referable
        return isinstance(backend, Embedder)
    verdict = _EMBEDDERS[backend] = isinstance(backend, Embedder)
    return verdict


def _token_lists(
    backend: Embedder,
    inputs: Sequence[str | tuple[int | str, ...]],
    name: str,
    limit: int | None,
    truncate: bool,
) -> list[tuple[int, ...]]:
    """Tokenize texts (with `truncate`, cut to the model's `limit`), check
    token lists; 400 naming the bad input. An empty text is the model's
    special tokens alone, as llama-server embeds it."""
    items = []
    for i, entry in enumerate(inputs):
        param = name if len(inputs) == 1 else f"{name}[{i}]"
        if isinstance(entry, str):
            ids = backend.tokenize(entry)
            if not ids:
                raise InvalidRequestError(f"'{param}' is an empty string; send some text", param=param)
            if truncate and limit and len(ids) > limit:
                ids = (*ids[: limit - 1], ids[-1])  # keep the closing special token ([SEP], EOS)
        elif any(isinstance(part, str) for part in entry):
            ids = _mixed_ids(backend, entry)
        else:
            ids = entry  # type: ignore[assignment]  # token ids only
        if limit and len(ids) > limit:
            raise ContextLengthError(
                f"input ({len(ids)} tokens) is too large to process: this model embeds at most {limit} tokens "
                f"per input ('{param}'). Shorten or split it.",
                param=param,
                n_prompt_tokens=len(ids),
                n_ctx=limit,
            )
        items.append(backend.check(ids, param))
    return items


def _mixed_ids(backend: Embedder, parts: Sequence[int | str]) -> tuple[int, ...]:
    """Token ids with text pieces among them: each piece's tokens without the
    special tokens the model puts around a whole input (llama-server's mixed prompts)."""
    around = backend.tokenize("")  # the special tokens alone, e.g. [CLS] [SEP]
    ids: list[int] = []
    for part in parts:
        ids.extend((part,) if isinstance(part, int) else _bare(backend.tokenize(part), around))
    return tuple(ids)


def _bare(ids: tuple[int, ...], around: tuple[int, ...]) -> tuple[int, ...]:
    """`ids` less the leading and trailing special tokens of `around`."""
    for lead in range(len(around), -1, -1):
        trail = len(around) - lead
        if ids[:lead] == around[:lead] and ids[len(ids) - trail :] == around[lead:] and len(ids) > len(around):
            return ids[lead : len(ids) - trail]
    return ids
