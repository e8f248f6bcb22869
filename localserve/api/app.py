"""The aiohttp application's factory: middlewares, the routes of every
dialect (each handler lives with its dialect or in `api.admin`), and the
models' lifecycle.

Routes (every OpenAI route under both `/v1` and `/api/v1`):

* `GET  models`, `GET models/{id}` (`api.openai.models`), `POST chat/completions`, `POST completions`
* `GET  /health` (`api.admin.health`) - 503 `{"status": "loading"}` until the start-up models are
  loaded, then 200 `{"status": "ok"}` (with `"not_loaded": {name: why}` for
  start-up models beyond `--max-loaded-models`, which load on first request,
  and `"disk": {"writable": false, ...}` when the data directory is read-only);
  503 `{"status": "error"}` if one failed (`localserve serve` exits instead:
  see `server.py`)
* `POST /api/v1/requests/{id}/cancel` (`api.admin.requests`) - stop a running request (the id is the
  answer's `id`, also sent as the `X-Request-Id` header)
* `GET  /openapi.json` - the OpenAPI 3.1 document of every route (`api.admin.openapi`;
  behind the API key like every route but /health)
* OpenAI's Responses API (`api.openai.responses`), Anthropic's Messages API
  (`api.anthropic.messages`), Ollama's dialect (`api.ollama.routes`), llama.cpp's `/infill`
  (`api.llamacpp.infill`), Prometheus `/metrics` (`api.admin.metrics`); every dialect is
  an adapter over `localserve.serving`
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from localserve.api import webui
from localserve.api.admin import debug, disk_watch, metrics, openapi
from localserve.api.admin import models as models_admin
from localserve.api.admin.health import health
from localserve.api.admin.requests import cancel_request
from localserve.api.admin.stats import register_stats_routes
from localserve.api.anthropic import messages
from localserve.api.doc_models import ChatCompletion, Health, ModelList, ModelObject, TextCompletion
from localserve.api.holds import release_holds_middleware
from localserve.api.llamacpp import completion as native_completion
from localserve.api.llamacpp import infill, native
from localserve.api.middleware import auth_middleware, body_timeout_middleware, error_middleware
from localserve.api.ollama import routes as ollama
from localserve.api.openai import audio, batches, embeddings, rerank, responses
from localserve.api.openai.batch_service import JOBS
from localserve.api.openai.chat import chat_completions, chat_input_tokens
from localserve.api.openai.completions import completions
from localserve.api.openai.models import get_model, list_models
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.api.security import cors_middleware, cors_response_headers, host_middleware
from localserve.api.state import REGISTRY, SETTINGS, STATE, ApiState
from localserve.config import ServerSettings
from localserve.models.registry import ModelRegistry
from localserve.serving.builtin_templates import chat_template_source
from localserve.serving.openai.request import ChatCompletionRequest, TextCompletionRequest
from localserve.serving.prompts import TemplateCache

log = logging.getLogger(__name__)

#: Set by `localserve serve`: a start-up model that fails to load stops the
#: loading (the server then exits with that one line); unset, the server
#: goes on without it and /health says why.
STARTUP_MODELS_REQUIRED = web.AppKey("startup_models_required", bool)


def create_app(settings: ServerSettings, registry: ModelRegistry) -> web.Application:
    """The API server for `registry`'s models and engine; the registry loads
    `settings.models` in the background once the server runs, and closes the
    models and the engine on shutdown."""
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[
            metrics.metrics_middleware,  # outermost: counts every answer with its final status
            # Whatever fails below becomes an error answer: OpenAI's envelope, Ollama's
            # {"error": "..."} on its routes, Anthropic's {"type": "error", ...} on /v1/messages.
            error_middleware(ollama.ERROR_SHAPE, messages.ERROR_SHAPE),
            body_timeout_middleware(settings.body_timeout_s),  # 408 for a body that stops arriving
            host_middleware(settings),
            cors_middleware(settings),  # before auth: preflights carry no key
            auth_middleware(settings.api_key, public=webui.is_public),  # the UI's page asks for the key itself
            release_holds_middleware,  # innermost: gives back the models a request held once it is done
        ],
    )
    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[STATE] = ApiState(TemplateCache(_template_override(settings)))
    app.on_response_prepare.append(cors_response_headers(settings))
    app.cleanup_ctx.append(_models_lifecycle)
    app.on_shutdown.append(_drain)  # graceful shutdown (SIGTERM, Ctrl-C): see `_drain`
    for prefix in (*API_PREFIXES, ""):  # "": llama-server's unprefixed routes
        add_routes(
            app,
            Route("GET", f"{prefix}/models", list_models, response=ModelList, query=("all",)),
            # Any id: a bad one is a 400, not a 405.
            Route("GET", prefix + r"/models/{model_id:[\s\S]+}", get_model, response=ModelObject),
            Route("POST", f"{prefix}/chat/completions", chat_completions, ChatCompletionRequest, ChatCompletion),
            Route("POST", f"{prefix}/chat/completions/input_tokens", chat_input_tokens, ChatCompletionRequest),
        )
        if prefix:  # llama-server's unprefixed /completions is its native one (api.llamacpp.completion)
            add_routes(app, Route("POST", f"{prefix}/completions", completions, TextCompletionRequest, TextCompletion))
    add_routes(
        app,
        Route("POST", "/api/v1/requests/{request_id}/cancel", cancel_request),
        Route("GET", "/health", health, response=Health),
    )
    disk_watch.register(app)  # the data directory's free space and writability (/health, /metrics, stats)
    register_stats_routes(app)  # /api/v1/stats, /api/v1/stats/stream
    models_admin.register(app)  # /api/v1/pull, load, unload, loaded, DELETE models/{id}, Ollama's pull/rm/cp
    embeddings.register(app)  # /v1/embeddings
    rerank.register(app)  # /v1/rerank (+ /rerank, /v2/rerank), /v1/score, /v1/classify
    audio.register(app)  # /v1/audio/transcriptions, /v1/audio/translations
    batches.register(app)  # /v1/files, /v1/batches, and the batch runner (after the models' lifecycle)
    responses.register(app)  # /v1/responses (OpenAI's Responses API, stateless)
    messages.register(app)  # /v1/messages, /v1/messages/count_tokens (Anthropic's Messages API)
    ollama.register(app)  # /, /api/tags, /api/chat, /api/generate, /api/embed, ... (Ollama's dialect)
    infill.register(app)  # /infill (llama.cpp's fill-in-the-middle)
    native_completion.register(app)  # /completion, /completions (llama.cpp's native completion)
    native.register(app)  # /tokenize, /detokenize, /apply-template, /props, /slots, /embedding(s)
    metrics.register(app)  # /metrics (Prometheus)
    debug.register(app)  # /api/v1/debug/fault, only with LOCALSERVE_ENABLE_FAULTS=1 (tests)
    webui.register(app)  # /ui/{name}: the browser UI's files (its page is Ollama's `/` for a browser)
    openapi.register(app)  # /openapi.json: every route of the router
    return app


def _template_override(settings: ServerSettings) -> str | None:
    """The text of `--chat-template-file` (read once, at start), else `--chat-template`'s, if given."""
    if settings.chat_template_file:
        return Path(settings.chat_template_file).expanduser().read_text(encoding="utf-8")
    return chat_template_source(settings.chat_template) if settings.chat_template else None


# ---- lifecycle ---------------------------------------------------------------------


async def _models_lifecycle(app: web.Application) -> AsyncIterator[None]:
    # In the background, so the server answers (/health: loading) at once.
    app[REGISTRY].start(stop_on_error=app.get(STARTUP_MODELS_REQUIRED, False))
    yield
    await app[REGISTRY].close()


async def _drain(app: web.Application) -> None:
    """Once the server has stopped accepting connections: stop the batch
    runner (its lines in flight are aborted and redone after a restart, so no
    batch line fails for the shutdown), then let the requests in flight finish
    for up to `--shutdown-timeout` seconds; the rest end with a 503
    `engine_stopped` ("the server is shutting down; retry ..."), streams with
    `finish_reason: "error"` and the error event. New requests on open
    connections get the same 503."""
    runner = app[JOBS].runner
    if runner is not None:
        await runner.stop()
    num_ended = await app[REGISTRY].engine.drain(app[SETTINGS].shutdown_timeout_s)
    if num_ended:
        log.warning(
            "shutdown: ended %d requests still running after %.0f s", num_ended, app[SETTINGS].shutdown_timeout_s
        )
