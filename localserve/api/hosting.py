"""The serving layer's models as one HTTP request sees them, and the batch
runner's, from the same app."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from localserve.api.admin.metrics import note_model
from localserve.api.holds import hold_model
from localserve.api.http_edge import OUTPUT_TOKENS
from localserve.api.state import REGISTRY, STATE
from localserve.backends.chat_template import ChatTemplate
from localserve.engine.backend import Tokenizer
from localserve.models.kinds import Kinds
from localserve.models.registry import ModelRegistry
from localserve.serving.models import LocalModels


class RequestModels:
    """A `serving.models.ModelHost` for one HTTP request: models are held
    (api.holds) until its answer is written, loaded on demand; `keep_alive`
    is the caller's, else the JSON body's; the request's metrics carry the
    model it used."""

    def __init__(self, request: web.Request, *, keep_alive: Any = None, name_fallback: bool | None = None) -> None:
        self.request = request
        self.keep_alive = keep_alive
        # llama-server's rule (serving/models.py) on its routes, OpenAI's and Anthropic's; not on
        # Ollama's (`/api/...` but `/api/v1/...`): its clients pull a model they get a 404 for.
        path = request.path
        self.name_fallback = (
            name_fallback if name_fallback is not None else not path.startswith("/api/") or path.startswith("/api/v1/")
        )

    @property
    def registry(self) -> ModelRegistry:
        return self.request.app[REGISTRY]

    async def hold(self, model_id: str, kind: Kinds) -> str:
        return await hold_model(self.request, model_id, kind=kind, keep_alive=self.keep_alive)

    def chat_template(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate:
        return self.request.app[STATE].chat_template(model_id, tokenizer)

    def found(self, model_id: str) -> None:
        note_model(self.request, model_id)

    def note_output(self, num_tokens: int) -> None:
        self.request[OUTPUT_TOKENS] = num_tokens


def app_models(app: web.Application) -> LocalModels:
    """The app's models for work that is not an HTTP request (batch lines):
    the same registry and chat templates."""
    return LocalModels(app[REGISTRY], templates=app[STATE].templates)
