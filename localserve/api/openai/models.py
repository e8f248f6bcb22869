"""OpenAI's model list: `GET /v1/models` (`?all=true`: also the models a
request would load) and `GET /v1/models/{id}`; the objects are
`serving.openai.models`'s."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.state import REGISTRY, engine_of
from localserve.serving.models import hold_chat_model
from localserve.serving.openai.models import model_object, oneshot_object, picker_block, servable_object


async def list_models(request: web.Request) -> web.Response:
    """`GET /v1/models`: the loaded models, generative and one-shot (embeddings,
    speech); with `?all=true` also every model here that a request would load
    (`meta.loaded` false, `meta.source` where it was found). Each entry has a
    `localserve` block for model pickers: `kind`, `backend`, `loaded`,
    `variant_of` (the model it is an on-disk variant of, or null)."""
    registry = request.app[REGISTRY]
    data = [
        model_object(model_id, loaded, engine_of(request).capacity(model_id))
        for model_id, loaded in registry.loaded.items()
    ]
    data += [oneshot_object(model_id, loaded) for model_id, loaded in registry.oneshot.items()]
    for item in data:
        item["meta"]["loaded"] = True
    if request.query.get("all", "").strip().lower() in ("1", "true", "yes"):
        ids = {item["id"] for item in data}
        data += [servable_object(row) for row in await asyncio.to_thread(_servable_rows) if row["id"] not in ids]
    known = [item["id"] for item in data]
    for item in data:
        item["localserve"] = picker_block(item, known)
    return web.json_response({"object": "list", "data": data})


def _servable_rows() -> list[dict[str, Any]]:
    from localserve.models.store.discovery import model_rows, servable

    return [row for row in model_rows() if servable(row)]


async def get_model(request: web.Request) -> web.Response:
    """`GET /v1/models/{id}`: one loaded model, or 404."""
    registry = request.app[REGISTRY]
    oneshot = registry.oneshot.get(request.match_info["model_id"])
    if oneshot is not None:
        item = oneshot_object(request.match_info["model_id"], oneshot)
    else:
        model_id = await hold_chat_model(RequestModels(request), request.match_info["model_id"], load=False)
        item = model_object(model_id, registry.get(model_id), engine_of(request).capacity(model_id))
    item["meta"]["loaded"] = True
    item["localserve"] = picker_block(item, list(registry.records))
    return web.json_response(item)
