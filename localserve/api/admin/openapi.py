"""`GET /openapi.json`: an OpenAPI 3.1 document of every route of this server.

Nothing in it is kept by hand where the code already knows the answer:

* the operations are the app's router table, so no route can be missing
  (a `HEAD` that aiohttp adds beside each `GET` is left out);
* a JSON request body's schema is the pydantic model its handler validates
  with: the `parse_body(request, Model)` call in the handler's source names
  it, and pydantic writes its JSON schema (`ref_template` into
  `#/components/schemas/`);
* query parameters are the names a handler reads from `request.query`.

What the code cannot tell is in the tables below: multipart bodies (audio,
file uploads), content types other than JSON, and a few response shapes.
Every error status is documented with the error envelope: OpenAI's
`{"error": {"message", "type", "param", "code"}}`, Ollama's `{"error": "..."}`
on Ollama's routes, Anthropic's `{"type": "error", "error": {"type",
"message"}}` on the Messages routes; a 503 always carries `Retry-After`.

With `--api-key`, the document needs the key like every route but
`/health` (it lists the server's routes and models' schemas); the Host and
CORS checks apply as everywhere.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema

from localserve import __version__
from localserve.api.anthropic.messages import is_messages_path
from localserve.api.middleware import PUBLIC_PATHS
from localserve.api.ollama.routes import is_ollama_path
from localserve.api.state import SETTINGS

OPENAPI_PATH = "/openapi.json"
REF_TEMPLATE = "#/components/schemas/{model}"
ERROR_STATUSES = ("400", "401", "403", "404", "408", "413", "500", "503")
SKIPPED_METHODS = frozenset({"HEAD", "OPTIONS", "*"})

_PARSE_BODY = re.compile(r"parse_body\(\s*request\s*,\s*([A-Za-z_][\w.]*)\s*\)")
_QUERY_NAME = re.compile(r"""(?:query\.get\(|query\[|query_int\(\s*request\s*,\s*)\s*["'](\w+)["']""")


# ---- documented shapes (responses and multipart forms) -------------------------------


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")  # answers may carry more fields


class ErrorDetail(_Doc):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(_Doc):
    """OpenAI's error object, on every route but Ollama's."""

    error: ErrorDetail


class OllamaError(_Doc):
    """Ollama's error object, on Ollama's routes."""

    error: str


class Health(_Doc):
    status: Literal["ok", "loading", "error"]
    not_loaded: dict[str, str] | None = None  # start-up models beyond --max-loaded-models -> why


class ModelObject(_Doc):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(_Doc):
    object: Literal["list"]
    data: list[ModelObject]


class Usage(_Doc):
    prompt_tokens: int
    total_tokens: int


class ChatChoice(_Doc):
    index: int
    message: dict[str, Any]
    finish_reason: str | None


class ChatCompletion(_Doc):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class TextChoice(_Doc):
    index: int
    text: str
    finish_reason: str | None


class TextCompletion(_Doc):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class Embedding(_Doc):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingList(_Doc):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: Usage


class ResponseObject(_Doc):
    """OpenAI's Responses API `response` (`/v1/responses`)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    model: str
    output: list[dict[str, Any]]
    output_text: str
    usage: dict[str, Any] | None


class AnthropicMessage(_Doc):
    """Anthropic's `message` (`/v1/messages`)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: dict[str, Any]


class TokenCount(_Doc):
    input_tokens: int


class AnthropicErrorDetail(_Doc):
    type: str
    message: str


class AnthropicError(_Doc):
    """Anthropic's error object, on the Messages routes."""

    type: Literal["error"]
    error: AnthropicErrorDetail


SPEECH_FORM = {
    "type": "object",
    "required": ["file", "model"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "the audio (wav, mp3, flac, ogg, ...)"},
        "model": {"type": "string"},
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string", "enum": ["json", "text", "srt", "verbose_json", "vtt"]},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["segment", "word"]}},
        "priority": {"type": "string"},
    },
}
UPLOAD_FORM = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": ["batch", "batch_output", "fine-tune", "assistants", "user_data"]},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer"},
    },
}
SPEECH_TYPES = ("application/json", "text/plain", "application/x-subrip", "text/vtt")

#: Handlers whose body is a multipart form (they read it without pydantic).
MULTIPART_FORMS: dict[str, dict[str, Any]] = {
    "localserve.api.openai.audio.transcriptions": SPEECH_FORM,
    "localserve.api.openai.audio.translations": SPEECH_FORM,
    "localserve.api.openai.files.upload_file": UPLOAD_FORM,
}
#: Handlers that answer something other than JSON (or more than JSON).
MEDIA_TYPES: dict[str, tuple[str, ...]] = {
    "localserve.api.openai.audio.transcriptions": SPEECH_TYPES,
    "localserve.api.openai.audio.translations": SPEECH_TYPES,
    "localserve.api.openai.files.file_content": ("application/octet-stream",),
    "localserve.api.admin.metrics.scrape": ("text/plain",),
    "localserve.api.admin.models.pull_model": ("application/json", "application/x-ndjson"),
    "localserve.api.ollama.routes.root": ("text/plain",),
    "localserve.api.admin.stats.stream_stats": ("text/event-stream",),
}
#: Typed 200 answers (others are documented as any JSON object).
RESPONSES: dict[str, type[BaseModel]] = {
    "localserve.api.app.health": Health,
    "localserve.api.app.list_models": ModelList,
    "localserve.api.app.get_model": ModelObject,
    "localserve.api.openai.chat.chat_completions": ChatCompletion,
    "localserve.api.openai.completions.completions": TextCompletion,
    "localserve.api.openai.embeddings.create_embeddings": EmbeddingList,
    "localserve.api.openai.responses.create_response": ResponseObject,
    "localserve.api.anthropic.messages.create_message": AnthropicMessage,
    "localserve.api.anthropic.messages.count_tokens": TokenCount,
}
ERROR_MODELS: tuple[type[BaseModel], ...] = (ErrorEnvelope, OllamaError, AnthropicError)


# ---- what the code says -----------------------------------------------------------------


def handler_name(handler: Callable[..., Any]) -> str:
    return f"{getattr(handler, '__module__', '')}.{getattr(handler, '__qualname__', repr(handler))}"


@lru_cache(maxsize=256)
def _source(handler: Callable[..., Any]) -> str:
    try:
        return inspect.getsource(handler)
    except (OSError, TypeError):
        return ""


def request_model(handler: Callable[..., Any]) -> type[BaseModel] | None:
    """The pydantic model the handler validates its body with, if any."""
    match = _PARSE_BODY.search(_source(handler))
    if match is None:
        return None
    value: Any = getattr(handler, "__globals__", {})
    for index, part in enumerate(match.group(1).split(".")):
        value = value.get(part) if index == 0 else getattr(value, part, None)
    return value if isinstance(value, type) and issubclass(value, BaseModel) else None


def query_names(handler: Callable[..., Any]) -> list[str]:
    """Query parameters the handler reads, in order of first use."""
    return list(dict.fromkeys(_QUERY_NAME.findall(_source(handler))))


def app_routes(app: web.Application) -> list[tuple[str, str, Callable[..., Any]]]:
    """`(method, path, handler)` of every documented route of `app`."""
    out = []
    for route in app.router.routes():
        if route.method in SKIPPED_METHODS or route.resource is None:
            continue
        out.append((route.method, route.resource.canonical, route.handler))
    return out


# ---- the document -----------------------------------------------------------------------


def build_document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`'s routes."""
    routes = app_routes(app)
    bodies = {handler: request_model(handler) for _, _, handler in routes}
    models = {m for m in bodies.values() if m is not None} | set(RESPONSES.values()) | set(ERROR_MODELS)
    key_map, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=REF_TEMPLATE
    )
    refs = {
        model: schema
        for (model, _), schema in key_map.items()
        if isinstance(model, type) and issubclass(model, BaseModel)
    }
    paths: dict[str, dict[str, Any]] = {}
    for method, path, handler in routes:
        paths.setdefault(path, {})[method.lower()] = _operation(method, path, handler, bodies[handler], refs)
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "localserve", "version": __version__, "description": "A local LLM and speech server."},
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {})},
    }
    if app[SETTINGS].api_key:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},  # as Anthropic's clients send it
        }
        document["security"] = [{"bearer": []}, {"x-api-key": []}]
    return document


def _operation(
    method: str,
    path: str,
    handler: Callable[..., Any],
    body: type[BaseModel] | None,
    refs: dict[type[BaseModel], dict[str, Any]],
) -> dict[str, Any]:
    name = handler_name(handler)
    operation: dict[str, Any] = {
        "operationId": f"{method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_') or 'root'}",
        "summary": (inspect.getdoc(handler) or name).splitlines()[0],
        "responses": _responses(path, handler, body, refs),
    }
    parameters = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in re.findall(r"{(\w+)", path)
    ]
    parameters += [
        {"name": q, "in": "query", "required": False, "schema": {"type": "string"}} for q in query_names(handler)
    ]
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": refs[body]}}}
    elif name in MULTIPART_FORMS:
        operation["requestBody"] = {
            "required": True,
            "content": {"multipart/form-data": {"schema": MULTIPART_FORMS[name]}},
        }
    if path in PUBLIC_PATHS:
        operation["security"] = []
    return operation


def _responses(
    path: str, handler: Callable[..., Any], body: type[BaseModel] | None, refs: dict[type[BaseModel], dict[str, Any]]
) -> dict[str, Any]:
    name = handler_name(handler)
    typed = RESPONSES.get(name)
    success: dict[str, Any] = {}
    for media_type in MEDIA_TYPES.get(name, ("application/json",)):
        schema: dict[str, Any] = {"type": "object"} if media_type == "application/json" else {"type": "string"}
        success[media_type] = {
            "schema": refs[typed] if typed is not None and media_type == "application/json" else schema
        }
    if body is not None and "stream" in body.model_fields and name not in MEDIA_TYPES:
        stream_type = "application/x-ndjson" if is_ollama_path(path) else "text/event-stream"
        success[stream_type] = {"schema": {"type": "string"}}
    error = refs[OllamaError if is_ollama_path(path) else AnthropicError if is_messages_path(path) else ErrorEnvelope]
    responses: dict[str, Any] = {"200": {"description": "OK", "content": success}}
    for status in ERROR_STATUSES:
        responses[status] = {"description": "error", "content": {"application/json": {"schema": error}}}
    responses["503"]["headers"] = {"Retry-After": {"required": True, "schema": {"type": "string"}}}
    if is_messages_path(path):  # Anthropic's status for a full queue
        responses["529"] = {**responses["503"], "description": "overloaded: the queue is full"}
    if name == "localserve.api.app.health":  # /health answers 503 with its own body
        responses["503"] = {
            "description": "loading or failed",
            "content": {"application/json": {"schema": refs[Health]}},
        }
    return responses


# ---- the route ---------------------------------------------------------------------------


def register(app: web.Application) -> None:
    """Add `GET /openapi.json`; the document is built once, on first request."""
    cache: dict[str, dict[str, Any]] = {}

    async def openapi_document(request: web.Request) -> web.Response:
        """This document: every route of the server."""
        if "document" not in cache:
            cache["document"] = build_document(request.app)
        return web.json_response(cache["document"])

    app.router.add_get(OPENAPI_PATH, openapi_document)
