"""Typed application state shared by the API's handlers and middlewares:
the settings, the model registry (the one owner of the models, their
start-up loads and load errors) and the compiled chat templates."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from localserve.backends.chat_template import ChatTemplate
from localserve.config import ServerSettings
from localserve.engine.backend import Tokenizer
from localserve.engine.engine import Engine
from localserve.models.registry import ModelRegistry
from localserve.serving.prompts import TemplateCache


@dataclass(slots=True)
class ApiState:
    """What the API keeps beside the registry: caches."""

    templates: TemplateCache = field(default_factory=TemplateCache)  # compiled chat templates

    def chat_template(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate:
        """The model's own chat template, compiled once per loaded model."""
        return self.templates.get(model_id, tokenizer)


SETTINGS = web.AppKey("settings", ServerSettings)
REGISTRY = web.AppKey("registry", ModelRegistry)
STATE = web.AppKey("api_state", ApiState)


def engine_of(request: web.Request) -> Engine:
    return request.app[REGISTRY].engine
