"""Ollama's API, for editors and tools that speak it (Continue, Zed, Open
WebUI, JetBrains AI Assistant, ...): point them at this server's base URL
as if it were Ollama.

* `GET /` - "Ollama is running", as Ollama answers (a browser gets the UI: `api.webui`)
* `GET /api/version`, `GET /api/tags`, `GET /api/ps`, `POST /api/show`
* `POST /api/chat`, `POST /api/generate` (see `api.ollama.chat`)
* `POST /api/embed` (`input`: text or texts) and the older
  `POST /api/embeddings` (`prompt`), on a loaded embeddings model

Errors on these routes are Ollama's `{"error": "message"}` with the status
(`ERROR_SHAPE`); `/api/v1/...` is this server's own API and keeps
the OpenAI envelope. Models are never pulled, copied or deleted through this
API (`/api/pull` and the like answer 404; this server's `/api/v1/pull`
does that); chat and embeddings models not loaded are loaded on demand, and
`keep_alive` works as in Ollama (see `models.registry`).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from typing import Any

from aiohttp import web

from localserve.api import webui
from localserve.api.hosting import RequestModels
from localserve.api.middleware import ErrorShape, error_response, parse_body
from localserve.api.ollama import chat as ollama_chat
from localserve.api.ollama.models import (
    all_models,
    capabilities,
    details,
    file_facts,
    find_model,
    installed_models,
    loaded_models,
    model_entry,
    model_id_of,
)
from localserve.api.routes import Route, add_routes
from localserve.api.state import REGISTRY
from localserve.engine.backend import Tokenizer
from localserve.errors import InvalidRequestError, LocalServeError
from localserve.models.kinds import ModelKind
from localserve.serving.embeddings import Embeddings, EmbeddingsRequest
from localserve.serving.embeddings import embed as serving_embed
from localserve.serving.fim import fim_tokens
from localserve.serving.ollama.answer import embed_json, embedding_json
from localserve.serving.ollama.request import (
    EmbedRequest,
    LegacyEmbeddingsRequest,
    OllamaChatRequest,
    OllamaGenerateRequest,
    ShowRequest,
)

#: The Ollama API level this server answers like (clients check a minimum).
OLLAMA_VERSION = "0.12.0"
#: `/api/ps` for a model in use or kept forever: Ollama shows a far expiry then.
NEVER_EXPIRES = "2318-01-01T00:00:00Z"


def register(app: web.Application) -> None:
    """Add the Ollama routes (give the app's error middleware `ERROR_SHAPE` too)."""
    add_routes(
        app,
        Route("GET", "/", root, media_types=("text/plain", "text/html")),
        Route("GET", "/api/version", version),
        Route("GET", "/api/tags", tags),
        Route("GET", "/api/ps", running),
        Route("POST", "/api/show", show, ShowRequest),
        Route("POST", "/api/chat", ollama_chat.chat, OllamaChatRequest),
        Route("POST", "/api/generate", ollama_chat.generate, OllamaGenerateRequest),
        Route("POST", "/api/embed", embed, EmbedRequest),
        Route("POST", "/api/embeddings", embeddings, LegacyEmbeddingsRequest),
    )


def is_ollama_path(path: str) -> bool:
    return path == "/" or (path.startswith("/api/") and not (path + "/").startswith("/api/v1/"))


def ollama_error(exc: LocalServeError) -> web.Response:
    """Ollama's `{"error": "..."}`, with the status and headers of every error."""
    response = error_response(exc)
    response.body = json.dumps({"error": exc.message}).encode()
    return response


#: Errors on Ollama's routes (`api.middleware.error_middleware`).
ERROR_SHAPE = ErrorShape(is_ollama_path, ollama_error)


# ---- models --------------------------------------------------------------------------


async def root(request: web.Request) -> web.Response:
    """The text "Ollama is running", as Ollama answers; a browser (Accept: text/html) gets the UI's page instead."""
    if webui.wants_page(request):
        return await webui.page(request)
    return web.Response(text="Ollama is running")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION})


async def tags(request: web.Request) -> web.Response:
    """`GET /api/tags`: the chat and embeddings models here, loaded or not."""
    installed = await asyncio.to_thread(installed_models)
    models = all_models(request, installed)
    entries = await asyncio.to_thread(lambda: [model_entry(model) for model in models])
    return web.json_response({"models": entries})


async def running(request: web.Request) -> web.Response:
    """`GET /api/ps`: the loaded models, with when they will be unloaded."""
    registry = request.app[REGISTRY]
    expiry = {r["id"]: r["expires_in_s"] for r in registry.describe()}
    out = []
    for model in loaded_models(request):
        assert model.info is not None
        entry = await asyncio.to_thread(model_entry, model)
        entry.pop("modified_at")
        expires_in = expiry.get(model.model_id)
        entry["expires_at"] = _in_seconds(expires_in) if isinstance(expires_in, int | float) else NEVER_EXPIRES
        entry["size_vram"] = entry["size"] if model.info.device.upper() != "CPU" else 0
        entry["context_length"] = (
            registry.engine.capacity(model.model_id).n_ctx if model.kind == ModelKind.CHAT else model.info.n_ctx_train
        )
        out.append(entry)
    return web.json_response({"models": out})


def _in_seconds(seconds: float) -> str:
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


async def show(request: web.Request) -> web.Response:
    """`POST /api/show`: details, template, context length, capabilities."""
    body = await parse_body(request, ShowRequest)
    installed = await asyncio.to_thread(installed_models)
    model = find_model(request, body.model or body.name, installed)
    registry = request.app[REGISTRY]
    template, parameters = "", ""
    model_info: dict[str, Any] = {}
    facts = details(model)
    if model.info is not None:
        family = facts["family"]
        model_info = {"general.architecture": family, "general.parameter_count": model.info.num_params}
        if model.kind == ModelKind.CHAT:
            tokenizer = registry.engine.tokenizer(model.model_id)
            context_length = registry.engine.capacity(model.model_id).n_ctx
            template = _template(tokenizer)
            # Modelfile-style lines; Continue reads num_ctx and JSON-parses each stop.
            lines = [f"num_ctx {context_length}"]
            if tokenizer.eos_token:
                lines.append(f"stop {json.dumps(tokenizer.eos_token)}")
            parameters = "\n".join(lines)
        else:
            context_length = model.info.n_ctx_train
        model_info[f"{family}.context_length"] = context_length
    _, _, modified = await asyncio.to_thread(file_facts, model.path)
    return web.json_response(
        {
            "license": "",
            "modelfile": f"# served by localserve\nFROM {model.path}\n",
            "parameters": parameters,
            "template": template,
            "details": facts,
            "model_info": model_info,
            "capabilities": capabilities(request, model),
            "modified_at": modified,
        }
    )


def _template(tokenizer: Tokenizer) -> str:
    """The model's Jinja chat template; for a model with FIM tokens, led by an
    Ollama-style `{{ if .Suffix }}` block, the sign Ollama clients (Continue)
    look for before they send fill-in-the-middle requests."""
    source = tokenizer.chat_template or ""
    fim = fim_tokens(tokenizer)
    if fim is None:
        return source
    special = getattr(tokenizer, "special_text", tokenizer.token_text)
    pre, suf, mid = (special(t) for t in (fim.pre, fim.suf, fim.mid))
    return (
        f"{{{{- if .Suffix }}}}{pre}{{{{ .Prompt }}}}{suf}{{{{ .Suffix }}}}{mid}{{{{- else }}}}{source}{{{{- end }}}}"
    )


# ---- embeddings ----------------------------------------------------------------------


async def embed(request: web.Request) -> web.Response:
    """`POST /api/embed`: `{"embeddings": [[...], ...]}` (unit vectors)."""
    started = time.monotonic_ns()
    body = await parse_body(request, EmbedRequest)
    texts = (body.input,) if isinstance(body.input, str) else tuple(body.input)
    result = await _embed(request, body.model, texts, truncate=body.truncate, dimensions=body.dimensions)
    return web.json_response(embed_json(body.model, result, started))


async def embeddings(request: web.Request) -> web.Response:
    """`POST /api/embeddings` (Ollama's older route): `{"embedding": [...]}`;
    an empty prompt only loads the model."""
    body = await parse_body(request, LegacyEmbeddingsRequest)
    texts = (body.prompt,) if body.prompt else ()
    result = await _embed(request, body.model, texts, truncate=True, refuse_chat_models=bool(texts))
    return web.json_response(embedding_json(result))


async def _embed(
    request: web.Request,
    name: str,
    texts: tuple[str, ...],
    *,
    truncate: bool,
    dimensions: int | None = None,
    refuse_chat_models: bool = True,
) -> Embeddings:
    """`serving.embeddings.embed` on the model an Ollama name means; a chat
    model is a 400 that names the embeddings models loaded."""
    model_id = model_id_of(request, name)
    registry = request.app[REGISTRY]
    if refuse_chat_models and model_id in registry.loaded:
        embedders = [m for m, o in registry.oneshot.items() if o.kind == ModelKind.EMBEDDINGS]
        raise InvalidRequestError(
            f'"{name}" is a chat model and does not make embeddings here; use an embeddings model '
            f"(loaded: {', '.join(embedders) or 'none'})",
            param="model",
        )
    return await serving_embed(
        RequestModels(request), EmbeddingsRequest(model_id, texts, dimensions=dimensions, truncate=truncate)
    )
