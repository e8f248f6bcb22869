"""Typed application state shared by the API's handlers and middlewares."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from localserve.api.leases import use_model
from localserve.backends.base import Tokenizer
from localserve.backends.chat_template import ChatTemplate
from localserve.config import ServerSettings
from localserve.engine.engine import Engine
from localserve.errors import ModelLoadingError
from localserve.models.names import validate_model_id
from localserve.models.policy import CHAT
from localserve.models.registry import ModelManager
from localserve.serving.prompts import TemplateCache


@dataclass(slots=True)
class ApiState:
    """What the API keeps beside the engine: start-up loading and caches."""

    loader: asyncio.Task[None] | None = None
    load_errors: dict[str, str] = field(default_factory=dict)  # model (as named in settings) -> reason
    templates: TemplateCache = field(default_factory=TemplateCache)  # compiled chat templates

    @property
    def loading(self) -> bool:
        return self.loader is not None and not self.loader.done()

    def chat_template(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate:
        """The model's own chat template, compiled once per loaded model."""
        return self.templates.get(model_id, tokenizer)


SETTINGS = web.AppKey("settings", ServerSettings)
MANAGER = web.AppKey("manager", ModelManager)
STATE = web.AppKey("api_state", ApiState)


def engine_of(request: web.Request) -> Engine:
    return request.app[MANAGER].engine


async def require_model(request: web.Request, model_id: str, *, load: bool = True, keep_alive: Any = None) -> str:
    """`model_id`, loaded and held until this request is over (api.leases):
    a known model that is not loaded is loaded now unless `load` is False
    (other requests keep flowing meanwhile); `keep_alive` (else the body's)
    says how long it stays loaded once idle. 400 for an invalid id, 503 while
    start-up loading runs, else 404."""
    manager = request.app[MANAGER]
    if model_id not in manager.loaded:
        validate_model_id(model_id)
        if request.app[STATE].loading:
            raise ModelLoadingError(f"model {model_id!r} is not ready yet: models are still loading; retry in a moment")
    if load or model_id in manager.loaded:
        model_id = await use_model(request, model_id, kind=CHAT, keep_alive=keep_alive)
    manager.get(model_id)  # raises ModelLoadingError / ModelNotFoundError / InvalidRequestError (wrong kind)
    return model_id
