"""How the serving layer reaches its models.

The caller hands each call a `ModelHost`: the models it may use, how to hold
one loaded until the call is over (the server's lifecycle leases), whether
start-up loading still runs, and the compiled chat templates. The server
gives one per HTTP request (`api.hosting.RequestModels`); the batch runner,
`localserve batch run` and `localserve run` use `LocalModels`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from localserve.backends.base import Tokenizer
from localserve.backends.chat_template import ChatTemplate
from localserve.engine.engine import Engine
from localserve.errors import ModelLoadingError
from localserve.models.lifecycle import Lease, ModelLifecycle
from localserve.models.names import validate_model_id
from localserve.models.oneshot import EMBEDDINGS
from localserve.models.policy import ASR, CHAT
from localserve.models.policy import EMBEDDINGS as EMBEDDINGS_KIND
from localserve.models.registry import LoadedOneShot, ModelManager
from localserve.serving.prompts import TemplateCache


class ModelHost(Protocol):
    """The models one call may use."""

    @property
    def manager(self) -> ModelManager: ...

    async def hold(self, model_id: str, kind: str) -> str:
        """Load `model_id` if needed and keep it loaded until the call is
        over; the id it is served under (`llama3.2` is `llama3.2:latest`).
        400 bad id or kind, 404 unknown, 503 no room."""

    def loading(self) -> bool:
        """Start-up loading still runs (a model not loaded yet may come)."""

    def chat_template(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate: ...

    def found(self, model_id: str) -> None:
        """The call uses `model_id`, a model that exists (the server labels
        the request's metrics with it; made-up ids never get that far)."""


async def hold_chat_model(host: ModelHost, model_id: str, *, load: bool = True) -> str:
    """`model_id`, a loaded chat model held for this call: loaded now if
    known and not loaded, unless `load` is False. 400 for an invalid id or a
    model of another kind, 503 while start-up loading runs, else 404."""
    manager = host.manager
    if model_id not in manager.loaded:
        validate_model_id(model_id)
        if host.loading():
            raise ModelLoadingError(f"model {model_id!r} is not ready yet: models are still loading; retry in a moment")
    if load or model_id in manager.loaded:
        model_id = await host.hold(model_id, CHAT)
    manager.get(model_id)  # raises ModelLoadingError / ModelNotFoundError / InvalidRequestError (wrong kind)
    host.found(model_id)
    return model_id


async def hold_oneshot_model(host: ModelHost, model_id: str, kind: str) -> LoadedOneShot:
    """A one-shot model (`kind` embeddings or transcription), loaded on demand
    and held for this call; 503 while start-up loading may still bring it."""
    manager = host.manager
    if model_id not in manager.oneshot:
        validate_model_id(model_id)
        if host.loading():
            raise ModelLoadingError(f"model {model_id!r} is not ready yet: models are still loading; retry in a moment")
    model_id = await host.hold(model_id, EMBEDDINGS_KIND if kind == EMBEDDINGS else ASR)
    model = manager.get_oneshot(model_id, kind)
    host.found(model_id)
    return model


@dataclass(frozen=True, slots=True)
class ChatModel:
    """A loaded generative model, held for the call that opened it."""

    model_id: str
    engine: Engine
    tokenizer: Tokenizer
    n_ctx: int
    host: ModelHost

    @property
    def template(self) -> ChatTemplate:
        return self.host.chat_template(self.model_id, self.tokenizer)


async def open_chat_model(host: ModelHost, name: str) -> ChatModel:
    """The chat model `name`, loaded (on demand) and held for this call."""
    model_id = await hold_chat_model(host, name)
    engine = host.manager.engine
    return ChatModel(model_id, engine, engine.tokenizer(model_id), engine.capacity(model_id).n_ctx, host)


@dataclass(slots=True)
class LocalModels:
    """The models of a `ModelManager` reached without HTTP: the batch runner
    of the server, `localserve batch run`, Ray replicas, `localserve run`.
    `call()` gives one call its host; the models it held are given back
    when the call ends."""

    manager: ModelManager
    lifecycle: ModelLifecycle | None = None
    loading: Callable[[], bool] = lambda: False
    templates: TemplateCache = field(default_factory=TemplateCache)

    @contextlib.asynccontextmanager
    async def call(self, *, keep_alive: object = None) -> AsyncIterator[ModelHost]:
        """A host for one call; `keep_alive` as a request's own (Ollama's semantics)."""
        host = _CallModels(self, keep_alive)
        try:
            yield host
        finally:
            host.release()


class _CallModels:
    """`LocalModels` for one call, with the leases it holds."""

    def __init__(self, models: LocalModels, keep_alive: object) -> None:
        self._models = models
        self._keep_alive = keep_alive
        self._leases: list[Lease] = []

    @property
    def manager(self) -> ModelManager:
        return self._models.manager

    async def hold(self, model_id: str, kind: str) -> str:
        lifecycle = self._models.lifecycle
        if lifecycle is None:
            return model_id
        lease = await lifecycle.acquire(model_id, kind=kind, keep_alive=self._keep_alive)
        self._leases.append(lease)
        return lease.model_id

    def loading(self) -> bool:
        return self._models.loading()

    def chat_template(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate:
        return self._models.templates.get(model_id, tokenizer)

    def found(self, model_id: str) -> None:
        pass

    def release(self) -> None:
        lifecycle = self._models.lifecycle
        while self._leases and lifecycle is not None:
            lifecycle.release(self._leases.pop())
