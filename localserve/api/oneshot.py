"""What the embeddings and audio routes share: model lookup, route prefixes,
and closing the one-shot models when the server stops."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from localserve.api.admin.metrics import note_model
from localserve.api.admin.stats import add_one_shot_provider
from localserve.api.leases import use_model
from localserve.api.state import MANAGER, SETTINGS, STATE
from localserve.errors import LocalServeError, ModelLoadingError
from localserve.models.names import validate_model_id
from localserve.models.oneshot import EMBEDDINGS, oneshot_kind
from localserve.models.policy import ASR
from localserve.models.policy import EMBEDDINGS as EMBEDDINGS_KIND
from localserve.models.registry import LoadedOneShot, ModelManager, resolve

PREFIXES = ("/v1", "/api/v1")
_CLEANUP_ADDED = web.AppKey("oneshot_cleanup_added", bool)


async def oneshot_model(request: web.Request, model_id: str, kind: str) -> LoadedOneShot:
    """The one-shot model, loaded on demand and held for this request
    (api.leases); 503 while start-up loading may still bring it. The
    request's metrics carry its id (only once found: a client's made-up ids
    must not become label values)."""
    manager = request.app[MANAGER]
    if model_id not in manager.oneshot:
        validate_model_id(model_id)
        if request.app[STATE].loading:
            raise ModelLoadingError(f"model {model_id!r} is not ready yet: models are still loading; retry in a moment")
    model_id = await use_model(request, model_id, kind=EMBEDDINGS_KIND if kind == EMBEDDINGS else ASR)
    model = manager.get_oneshot(model_id, kind)
    note_model(request, model_id)
    return model


def setup_oneshot(app: web.Application) -> None:
    """Once per app: show the batcher stats of the one-shot models named at
    start-up in /api/v1/stats, and close every batcher and backend on shutdown."""
    if app.get(_CLEANUP_ADDED):
        return
    app[_CLEANUP_ADDED] = True
    manager = app[MANAGER]
    for name in app[SETTINGS].models:
        try:
            spec = resolve(name)
        except LocalServeError:
            continue  # the loader reports it
        if oneshot_kind(spec.labels):
            add_one_shot_provider(app, spec.model_id, _stats_of(manager, spec.model_id))

    async def close_oneshot(app: web.Application) -> None:
        await app[MANAGER].close_oneshot()

    app.on_cleanup.append(close_oneshot)


def _stats_of(manager: ModelManager, model_id: str) -> Any:
    def provider() -> dict[str, Any]:
        model = manager.oneshot.get(model_id)
        return {"kind": model.kind, **model.batcher.stats()} if model is not None else {}

    return provider


def usage_tokens(num_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
