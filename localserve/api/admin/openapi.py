"""`GET /openapi.json`: an OpenAPI 3.1 document of every route of this server.

Every route is declared once, as a `routes.Route`, by the module that
handles it; `add_routes` registers it with the router and records it, and
the document is built from that record (nothing is read from handler
source):

* the operations are the declared routes (the router holds the same
  ones, and a `HEAD` twin of each `GET`, left out here);
* a JSON request body's schema is the pydantic model the route names
  (`Route.body`, the one its handler validates with), written by pydantic
  (`ref_template` into `#/components/schemas/`);
* query parameters, multipart forms, media types other than JSON and typed
  answers are the route's own fields (shapes in `api/doc_models.py`).

Every error status is documented with the error envelope: OpenAI's
`{"error": {"message", "type", "param", "code"}}`, Ollama's `{"error": "..."}`
on Ollama's routes, Anthropic's `{"type": "error", "error": {"type",
"message"}}` on the Messages routes; a 503 always carries `Retry-After`.

With `--api-key`, the document needs the key like every route but
`/health` (it lists the server's routes and models' schemas); the Host and
CORS checks apply as everywhere.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from localserve import __version__
from localserve.api.anthropic.messages import is_messages_path
from localserve.api.doc_models import AnthropicError, ErrorEnvelope, Health, OllamaError
from localserve.api.middleware import PUBLIC_PATHS
from localserve.api.ollama.routes import is_ollama_path
from localserve.api.routes import Handler, Route, add_routes, declared_routes
from localserve.api.state import SETTINGS

OPENAPI_PATH = "/openapi.json"
REF_TEMPLATE = "#/components/schemas/{model}"
ERROR_STATUSES = ("400", "401", "403", "404", "408", "413", "500", "503")

ERROR_MODELS: tuple[type[BaseModel], ...] = (ErrorEnvelope, OllamaError, AnthropicError)


# ---- the document -----------------------------------------------------------------------


def app_routes(app: web.Application) -> list[tuple[str, str, Handler]]:
    """`(method, path, handler)` of every documented route of `app`."""
    return [(r.method, r.canonical, r.handler) for r in declared_routes(app)]


def build_document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `app`'s declared routes."""
    routes = declared_routes(app)
    models = {r.body for r in routes if r.body is not None}
    models |= {r.response for r in routes if r.response is not None} | set(ERROR_MODELS) | {Health}
    key_map, defs = models_json_schema(
        [(m, "validation") for m in sorted(models, key=lambda m: m.__name__)], ref_template=REF_TEMPLATE
    )
    refs = {
        model: schema
        for (model, _), schema in key_map.items()
        if isinstance(model, type) and issubclass(model, BaseModel)
    }
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        paths.setdefault(route.canonical, {})[route.method.lower()] = _operation(route, refs)
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


def _operation(route: Route, refs: dict[type[BaseModel], dict[str, Any]]) -> dict[str, Any]:
    method, path = route.method, route.canonical
    operation: dict[str, Any] = {
        "operationId": f"{method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_') or 'root'}",
        "summary": route.title,
        "responses": _responses(route, refs),
    }
    parameters = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in re.findall(r"{(\w+)", path)
    ]
    parameters += [{"name": q, "in": "query", "required": False, "schema": {"type": "string"}} for q in route.query]
    if parameters:
        operation["parameters"] = parameters
    if route.body is not None:
        operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": refs[route.body]}}}
    elif route.form is not None:
        operation["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": route.form}}}
    if path in PUBLIC_PATHS or path.startswith("/ui/"):  # the browser UI's files: no key (api/webui.py)
        operation["security"] = []
    return operation


def _responses(route: Route, refs: dict[type[BaseModel], dict[str, Any]]) -> dict[str, Any]:
    path, body, typed = route.canonical, route.body, route.response
    success: dict[str, Any] = {}
    for media_type in route.media_types or ("application/json",):
        schema: dict[str, Any] = dict(route.answer_schema) if media_type == "application/json" else {"type": "string"}
        success[media_type] = {
            "schema": refs[typed] if typed is not None and media_type == "application/json" else schema
        }
    if body is not None and "stream" in body.model_fields and route.media_types is None:
        stream_type = "application/x-ndjson" if is_ollama_path(path) else "text/event-stream"
        success[stream_type] = {"schema": {"type": "string"}}
    error = refs[OllamaError if is_ollama_path(path) else AnthropicError if is_messages_path(path) else ErrorEnvelope]
    responses: dict[str, Any] = {"200": {"description": "OK", "content": success}}
    for status in ERROR_STATUSES:
        responses[status] = {"description": "error", "content": {"application/json": {"schema": error}}}
    responses["503"]["headers"] = {"Retry-After": {"required": True, "schema": {"type": "string"}}}
    if is_messages_path(path):  # Anthropic's status for a full queue
        responses["529"] = {**responses["503"], "description": "overloaded: the queue is full"}
    if typed is Health:  # /health answers 503 with its own body
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

    add_routes(app, Route("GET", OPENAPI_PATH, openapi_document))
