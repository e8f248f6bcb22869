"""How the serving layer reaches its models.

The caller hands each call a `ModelHost`: the model registry, how to hold a
model loaded until the call is over (a registry `ModelHold`), and the compiled
chat templates. The server gives one per HTTP request
(`api.hosting.RequestModels`); the batch runner, `localserve batch run` and
`localserve run` use `LocalModels`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from localserve.backends.chat_template import ChatTemplate
from localserve.engine.backend import Tokenizer
from localserve.engine.engine import Engine
from localserve.errors import InvalidRequestError, ModelLoadingError, ModelNotDownloadedError, ModelNotFoundError
from localserve.models.kinds import Kinds, ModelKind
from localserve.models.registry import LoadedOneShot, ModelHold, ModelRegistry
from localserve.serving.prompts import TemplateCache


class ModelHost(Protocol):
    """The models one call may use."""

    @property
    def registry(self) -> ModelRegistry: ...

    async def hold(self, model_id: str, kind: Kinds) -> str:
        """Load `model_id` if needed and keep it loaded until the call is
        over; the id it is served under (`llama3.2` is `llama3.2:latest`).
        400 bad id or kind, 404 unknown, 503 no room."""

    def chat_template(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate: ...

    @property
    def name_fallback(self) -> bool:
        """May no model name, or one not served, mean the only model of its kind (llama-server's rule)?"""

    def found(self, model_id: str) -> None:
        """The call uses `model_id`, a model that exists (the server labels
        the request's metrics with it; made-up ids never get that far)."""

    def note_output(self, num_tokens: int) -> None:
        """The call's answer has generated `num_tokens` so far (the server's
        log line of a request the client abandoned gives it)."""


async def hold_chat_model(host: ModelHost, model_id: str, *, load: bool = True) -> str:
    """`model_id`, a loaded chat model held for this call: loaded now if
    known and not loaded, unless `load` is False. 400 for an invalid id or a
    model of another kind, 503 while start-up loading runs, else 404 (but
    see `_hold`: no name or an unknown one may mean the only chat model)."""
    registry = host.registry
    if not load:
        registry.check_ready(model_id)
        if registry.is_loaded(model_id):
            model_id = await host.hold(model_id, ModelKind.CHAT)
    else:
        model_id = await _hold(host, model_id, ModelKind.CHAT)
    registry.get(model_id)  # raises ModelNotFoundError when not loaded and `load` is False
    host.found(model_id)
    return model_id


async def hold_oneshot_model(host: ModelHost, model_id: str, kind: Kinds) -> LoadedOneShot:
    """A one-shot model of `kind` (or of one of several kinds), loaded on
    demand and held for this call; 503 while start-up loading may still bring it."""
    model_id = await _hold(host, model_id, kind)
    model = host.registry.get_oneshot(model_id, kind)
    host.found(model_id)
    return model


async def _hold(host: ModelHost, name: str, kind: Kinds) -> str:
    """Hold model `name` of `kind`; its id. As llama-server with one model: no
    name, or a name this server does not know (`gpt-4o-mini`), means the only
    model of that kind loaded, unless `--strict-model-names`."""
    registry = host.registry
    sole = None if registry.settings.strict_model_names or not host.name_fallback else registry.sole_model(kind)
    if not name:
        if sole is None:
            if registry.starting:
                raise ModelLoadingError("models are still loading; retry in a moment")
            raise InvalidRequestError(
                f"'model' is required: no single {kind} model to default to (GET /v1/models lists them)",
                param="model",
            )
        name = sole
    try:
        registry.check_ready(name)
    except InvalidRequestError:
        if sole is None:
            raise
        name = sole  # not even a name we could serve (`gpt-4o mini`): the one model, as llama-server
    try:
        return await host.hold(name, kind)
    except ModelNotDownloadedError:
        raise  # a model the catalog knows: the client means it, and the message says how to get it
    except ModelNotFoundError:
        if sole is None or sole == name:
            raise
    return await host.hold(sole, kind)


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


async def held_chat_model(host: ModelHost, name: str) -> ChatModel:
    """The chat model `name`, loaded (on demand) and held for this call."""
    model_id = await hold_chat_model(host, name)
    engine = host.registry.engine
    return ChatModel(model_id, engine, engine.tokenizer(model_id), engine.capacity(model_id).n_ctx, host)


@dataclass(slots=True)
class LocalModels:
    """The models of a `ModelRegistry` reached without HTTP: the batch runner
    of the server, `localserve batch run`, Ray replicas, `localserve run`.
    `call()` gives one call its host; the models it held are given back
    when the call ends."""

    registry: ModelRegistry
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
    """`LocalModels` for one call, with the holds it has."""

    def __init__(self, models: LocalModels, keep_alive: object) -> None:
        self._models = models
        self._keep_alive = keep_alive
        self._holds: list[ModelHold] = []

    @property
    def registry(self) -> ModelRegistry:
        return self._models.registry

    async def hold(self, model_id: str, kind: Kinds) -> str:
        hold = await self.registry.hold(model_id, kind=kind, keep_alive=self._keep_alive)
        self._holds.append(hold)
        return hold.model_id

    @property
    def name_fallback(self) -> bool:
        return False  # in-process callers (`run`, `batch run`, the batch runner) name their models exactly

    def chat_template(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate:
        return self._models.templates.get(model_id, tokenizer)

    def found(self, model_id: str) -> None:
        pass

    def note_output(self, num_tokens: int) -> None:
        pass

    def release(self) -> None:
        while self._holds:
            self.registry.release(self._holds.pop())
