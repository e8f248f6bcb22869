"""Typed application state shared by the API's handlers and middlewares."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from localserve.backends.base import Tokenizer
from localserve.backends.chat_template import ChatTemplate
from localserve.config import ServerSettings
from localserve.engine.engine import Engine
from localserve.errors import ModelLoadingError
from localserve.models.registry import ModelManager


@dataclass(slots=True)
class ApiState:
    """What the API keeps beside the engine: start-up loading and caches."""

    loader: asyncio.Task[None] | None = None
    load_errors: dict[str, str] = field(default_factory=dict)  # model (as named in settings) -> reason
    # One compiled template per model; the tokenizer is kept to notice a reload.
    templates: dict[str, tuple[Tokenizer, ChatTemplate]] = field(default_factory=dict)

    @property
    def loading(self) -> bool:
        return self.loader is not None and not self.loader.done()

    def chat_template(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate:
        """The model's own chat template, compiled once per loaded model."""
        cached = self.templates.get(model_id)
        if cached is not None and cached[0] is tokenizer:
            return cached[1]
        template = ChatTemplate(tokenizer.chat_template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
        self.templates[model_id] = (tokenizer, template)
        return template


SETTINGS = web.AppKey("settings", ServerSettings)
MANAGER = web.AppKey("manager", ModelManager)
STATE = web.AppKey("api_state", ApiState)


def engine_of(request: web.Request) -> Engine:
    return request.app[MANAGER].engine


def require_model(request: web.Request, model_id: str) -> str:
    """`model_id` if it is loaded; 503 while start-up loading runs, else 404."""
    manager = request.app[MANAGER]
    if model_id not in manager.loaded and request.app[STATE].loading:
        raise ModelLoadingError(f"model {model_id!r} is not ready yet: models are still loading; retry in a moment")
    manager.get(model_id)  # raises ModelLoadingError / ModelNotFoundError
    return model_id
