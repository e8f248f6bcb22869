"""The aiohttp application: routes, middlewares and the models' lifecycle.

Routes (every OpenAI route under both `/v1` and `/api/v1`):

* `GET  models`, `GET models/{id}`, `POST chat/completions`, `POST completions`
* `GET  /health` - 503 `{"status": "loading"}` until the start-up models are
  loaded, then 200 `{"status": "ok"}` (with `"not_loaded": {name: why}` for
  start-up models beyond `--max-loaded-models`, which load on first request,
  and `"disk": {"writable": false, ...}` when the data directory is read-only);
  503 `{"status": "error"}` if one failed (`localserve serve` exits instead:
  see `server.py`)
* `POST /api/v1/requests/{id}/cancel` - stop a running request (the id is the
  answer's `id`, also sent as the `X-Request-Id` header)
* `GET  /openapi.json` - the OpenAPI 3.1 document of every route (`api.admin.openapi`;
  behind the API key like every route but /health)
* OpenAI's Responses API (`api.openai.responses`), Anthropic's Messages API
  (`api.anthropic.messages`), Ollama's dialect (`api.ollama.routes`), llama.cpp's `/infill`
  (`api.llamacpp.infill`), Prometheus `/metrics` (`api.admin.metrics`); every dialect is
  an adapter over `localserve.serving`
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from localserve.api import webui
from localserve.api.admin import debug, disk_watch, metrics, openapi
from localserve.api.admin import models as models_admin
from localserve.api.admin.stats import register_stats_routes
from localserve.api.anthropic import messages
from localserve.api.doc_models import ChatCompletion, Health, ModelList, ModelObject, TextCompletion
from localserve.api.hosting import RequestModels
from localserve.api.leases import release_leases_middleware
from localserve.api.llamacpp import completion as native_completion
from localserve.api.llamacpp import infill, native
from localserve.api.middleware import auth_middleware, body_timeout_middleware, error_middleware
from localserve.api.ollama import routes as ollama
from localserve.api.openai import audio, batches, embeddings, rerank, responses
from localserve.api.openai.batch_service import JOBS
from localserve.api.openai.chat import chat_completions
from localserve.api.openai.completions import completions
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.api.security import cors_middleware, cors_response_headers, host_middleware
from localserve.api.state import REGISTRY, SETTINGS, STATE, ApiState, engine_of
from localserve.config import ServerSettings
from localserve.errors import NotFoundError
from localserve.models.catalog import variant_of
from localserve.models.kinds import ModelKind
from localserve.models.registry import LoadedModel, LoadedOneShot, ModelRegistry
from localserve.serving.generation import request_ids
from localserve.serving.models import hold_chat_model
from localserve.serving.openai.schemas import MAX_CHOICES, MAX_PROMPTS, ChatCompletionRequest, CompletionRequest
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
            release_leases_middleware,  # innermost: gives back the models a request held once it is done
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
        )
        if prefix:  # llama-server's unprefixed /completions is its native one (api.llamacpp.completion)
            add_routes(app, Route("POST", f"{prefix}/completions", completions, CompletionRequest, TextCompletion))
    add_routes(
        app,
        Route("POST", "/api/v1/requests/{request_id}/cancel", cancel_request),
        Route("GET", "/health", health, response=Health),
    )
    disk_watch.register(app)  # the data directory's free space and writability (/health, /metrics, stats)
    register_stats_routes(app)  # /api/v1/stats, /api/v1/stats/stream, /api/v1/unload
    models_admin.register(app)  # /api/v1/pull, /api/v1/load, /api/v1/loaded, DELETE models/{id}, Ollama's pull/rm/cp
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
    """The text of `--chat-template-file`, if given (read once, at start)."""
    if not settings.chat_template_file:
        return None
    return Path(settings.chat_template_file).expanduser().read_text(encoding="utf-8")


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


# ---- handlers ----------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """Liveness and readiness (no API key needed)."""
    registry = request.app[REGISTRY]
    if registry.starting:
        return web.json_response({"status": "loading"}, status=503)
    if registry.load_errors:
        return web.json_response({"status": "error", "errors": registry.load_errors}, status=503)
    body: dict[str, Any] = {"status": "ok"}
    if registry.not_loaded:  # start-up models beyond --max-loaded-models: they load on first request
        body["not_loaded"] = registry.not_loaded
    disk = request.app[disk_watch.DISK_WATCH].health()
    if disk is not None:  # a read-only data directory: serving goes on, and says so
        body["disk"] = disk
    return web.json_response(body)


def _model_object(model_id: str, loaded: LoadedModel, request: web.Request) -> dict[str, Any]:
    capacity = engine_of(request).capacity(model_id)
    info = loaded.backend.info()
    return {
        "id": model_id,
        "object": "model",
        "created": int(loaded.loaded_at),
        "owned_by": "localserve",
        "meta": {
            "backend": info.backend,
            "device": info.device,
            "architecture": info.architecture,
            "num_params": info.num_params,
            "n_ctx": capacity.n_ctx,
            "n_ctx_train": info.n_ctx_train,
            "max_num_seqs": capacity.max_num_seqs,
            "kind": ModelKind.CHAT,  # generative; one-shot models say "embeddings" or "transcription"
            "labels": list(loaded.spec.labels),
        },
    }


def _oneshot_object(model_id: str, loaded: LoadedOneShot) -> dict[str, Any]:
    """An embeddings or speech model, as `/v1/models` lists it: `meta.kind`
    says which route takes it (no context or slots: it runs in batches)."""
    info = loaded.backend.info()
    return {
        "id": model_id,
        "object": "model",
        "created": int(loaded.loaded_at),
        "owned_by": "localserve",
        "meta": {
            "kind": loaded.kind,
            "backend": info.backend,
            "device": info.device,
            "architecture": info.architecture,
            "num_params": info.num_params,
            "n_ctx_train": info.n_ctx_train,
            "labels": list(loaded.spec.labels),
            **_rerank_method(loaded.kind),
        },
    }


def _rerank_method(kind: ModelKind) -> dict[str, str]:
    """How a model reranks (`/v1/rerank`), if it does: an embeddings model by
    the cosine of its vectors (a bi-encoder), a rerank model by reading query
    and document together (a cross-encoder)."""
    methods = {ModelKind.EMBEDDINGS: "bi-encoder", ModelKind.RERANK: "cross-encoder"}
    return {"rerank": methods[kind]} if kind in methods else {}


async def list_models(request: web.Request) -> web.Response:
    """`GET /v1/models`: the loaded models, generative and one-shot (embeddings,
    speech); with `?all=true` also every model here that a request would load
    (`meta.loaded` false, `meta.source` where it was found). Each entry has a
    `localserve` block for model pickers: `kind`, `backend`, `loaded`,
    `variant_of` (the model it is an on-disk variant of, or null)."""
    registry = request.app[REGISTRY]
    data = [_model_object(model_id, loaded, request) for model_id, loaded in registry.loaded.items()]
    data += [_oneshot_object(model_id, loaded) for model_id, loaded in registry.oneshot.items()]
    for item in data:
        item["meta"]["loaded"] = True
    if request.query.get("all", "").strip().lower() in ("1", "true", "yes"):
        ids = {item["id"] for item in data}
        data += [_servable_object(row) for row in await asyncio.to_thread(_servable_rows) if row["id"] not in ids]
    known = [item["id"] for item in data]
    for item in data:
        item["localserve"] = _picker_block(item, known)
    return web.json_response({"object": "list", "data": data})


def _picker_block(item: dict[str, Any], known_ids: list[str]) -> dict[str, Any]:
    """What a model picker groups by (documented in the README's model list section)."""
    meta = item["meta"]
    return {
        "kind": str(meta["kind"]),
        "backend": meta.get("backend", ""),
        "loaded": bool(meta.get("loaded")),
        "variant_of": variant_of(item["id"], known_ids),
    }


def _servable_rows() -> list[dict[str, Any]]:
    from localserve.models.store.discovery import model_rows, servable

    return [row for row in model_rows() if servable(row)]


def _servable_object(row: dict[str, Any]) -> dict[str, Any]:
    """A model on this machine that is not loaded (a request loads it)."""
    return {
        "id": row["id"],
        "object": "model",
        "created": 0,
        "owned_by": "localserve",
        "meta": {
            "kind": row["kind"],
            "loaded": False,
            "backend": row["backend"],
            "source": row["source"],
            "labels": row["labels"],
            "size_bytes": row["size_bytes"],
            **_rerank_method(row["kind"]),
        },
    }


async def get_model(request: web.Request) -> web.Response:
    """`GET /v1/models/{id}`: one loaded model, or 404."""
    registry = request.app[REGISTRY]
    oneshot = registry.oneshot.get(request.match_info["model_id"])
    if oneshot is not None:
        item = _oneshot_object(request.match_info["model_id"], oneshot)
    else:
        model_id = await hold_chat_model(RequestModels(request), request.match_info["model_id"], load=False)
        item = _model_object(model_id, registry.get(model_id), request)
    item["meta"]["loaded"] = True
    item["localserve"] = _picker_block(item, list(registry.records))
    return web.json_response(item)


async def cancel_request(request: web.Request) -> web.Response:
    """Stop an answer: its single request, or every choice `ID-i` of it."""
    answer_id = request.match_info["request_id"]
    engine = engine_of(request)
    candidates = [answer_id, *request_ids(answer_id, MAX_CHOICES * MAX_PROMPTS)]
    num_cancelled = sum(engine.abort(request_id) for request_id in candidates)
    if not num_cancelled:
        raise NotFoundError(f"no running request with id {answer_id!r}", param="id")
    return web.json_response({"id": answer_id, "object": "request.cancelled", "num_cancelled": num_cancelled})
