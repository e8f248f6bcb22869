"""llama-server's own endpoints beside `/completion` and `/infill`:

* `POST /tokenize` `{content, add_special, parse_special, with_pieces}` ->
  `{tokens}` (ids, or `{id, piece}` with `with_pieces`; a piece that is not
  whole UTF-8 is its list of bytes)
* `POST /detokenize` `{tokens}` -> `{content}`
* `POST /apply-template` (a chat completion body, `add_generation_prompt`)
  -> `{prompt}`: the text the chat path would tokenize
* `GET /props`: the model, its chat template, slots and default settings
* `GET /slots`: one entry per KV slot (501 with `--no-slots`)
* `POST /embedding`, `/embeddings` `{content | input}` -> `[{index,
  embedding: [[...]]}]`: the pooled vector, or with `--pooling none` one
  vector per token (the only routes that return those)

Every body may name a `model`; by default the only one of its kind.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.routes import OBJECT_OR_LIST, Route, add_routes
from localserve.api.state import REGISTRY, SETTINGS
from localserve.engine.backend import Tokenizer
from localserve.errors import InvalidRequestError, NotSupportedError
from localserve.serving.chat import render_chat
from localserve.serving.embeddings import EmbeddingsRequest, embed
from localserve.serving.llamacpp.request import (
    ApplyTemplateRequest,
    DetokenizeRequest,
    NativeEmbeddingRequest,
    TokenizeRequest,
)
from localserve.serving.models import hold_chat_model
from localserve.serving.openai.embeddings import embedding_inputs
from localserve.serving.openai.request import chat_request


def register(app: web.Application) -> None:
    add_routes(
        app,
        Route("POST", "/tokenize", tokenize, TokenizeRequest),
        Route("POST", "/detokenize", detokenize, DetokenizeRequest),
        Route("POST", "/apply-template", apply_template, ApplyTemplateRequest),
        Route("GET", "/props", props),
        Route("GET", "/slots", slots, answer_schema={"type": "array"}),
        Route("POST", "/slots/{id_slot}", slot_action, query=("action",)),
        Route("POST", "/embedding", embeddings, NativeEmbeddingRequest, answer_schema=OBJECT_OR_LIST),
        Route("POST", "/embeddings", embeddings, NativeEmbeddingRequest, answer_schema=OBJECT_OR_LIST),
    )


async def _tokenizer(request: web.Request, name: str) -> tuple[str, Tokenizer]:
    model_id = await hold_chat_model(RequestModels(request), name)
    return model_id, request.app[REGISTRY].engine.tokenizer(model_id)


async def tokenize(request: web.Request) -> web.Response:
    """Text to token ids (llama-server's `/tokenize`)."""
    body = await parse_body(request, TokenizeRequest)
    _, tokenizer = await _tokenizer(request, body.model)
    ids = await asyncio.to_thread(
        tokenizer.encode, body.content, add_special=body.add_special, parse_special=body.parse_special
    )
    if not body.with_pieces:
        return web.json_response({"tokens": ids})
    return web.json_response({"tokens": [{"id": i, "piece": _piece(tokenizer.token_bytes(i))} for i in ids]})


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def detokenize(request: web.Request) -> web.Response:
    """Token ids to text (llama-server's `/detokenize`)."""
    body = await parse_body(request, DetokenizeRequest)
    _, tokenizer = await _tokenizer(request, body.model)
    bad = [t for t in body.tokens if not 0 <= t < tokenizer.vocab_size]
    if bad:
        raise InvalidRequestError(f"token ids outside the vocabulary: {bad[:5]}", param="tokens")
    return web.json_response({"content": tokenizer.decode(body.tokens)})


async def apply_template(request: web.Request) -> web.Response:
    """The prompt a chat request renders to (llama-server's `/apply-template`)."""
    body = await parse_body(request, ApplyTemplateRequest)
    _, text = await render_chat(RequestModels(request), chat_request(body))
    return web.json_response({"prompt": text})


async def props(request: web.Request) -> web.Response:
    """The model and its defaults (llama-server's `GET /props`)."""
    host = RequestModels(request)
    model_id = await hold_chat_model(host, request.query.get("model", ""))
    registry = request.app[REGISTRY]
    engine = registry.engine
    capacity = engine.capacity(model_id)
    tokenizer = engine.tokenizer(model_id)
    settings = request.app[SETTINGS]
    return web.json_response(
        {
            "default_generation_settings": {
                "id": 0,
                "n_ctx": capacity.n_ctx,
                "is_processing": False,
                "params": _default_params(settings.n_predict, settings.temp, settings.seed),
            },
            "total_slots": capacity.num_slots,
            "model_alias": model_id,
            "model_path": str(registry.get(model_id).spec.path),
            "chat_template": tokenizer.chat_template or "",
            "bos_token": tokenizer.bos_token,
            "eos_token": tokenizer.eos_token,
            "modalities": {"vision": False, "audio": False},
            "build_info": "localserve",
            "is_sleeping": False,
            # What localserve takes and ignores (llama-server honours them).
            "localserve": {"ignored_fields": ["samplers", "id_slot", "t_max_prompt_ms"]},
        }
    )


def _default_params(n_predict: int, temperature: float, seed: int) -> dict[str, Any]:
    """llama-server's defaults, which `/completion` and `/infill` use."""
    return {
        "n_predict": n_predict,
        "seed": seed,
        "temperature": temperature,
        "top_k": 40,
        "top_p": 0.95,
        "min_p": 0.05,
        "repeat_penalty": 1.0,
        "repeat_last_n": 64,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop": [],
        "n_probs": 0,
        "stream": False,
    }


async def slots(request: web.Request) -> web.Response:
    """One entry per KV slot of the model (llama-server's `GET /slots`)."""
    if request.app[SETTINGS].no_slots:
        raise NotSupportedError("This server has slot endpoints disabled (--no-slots).")
    model_id = await hold_chat_model(RequestModels(request), request.query.get("model", ""))
    engine = request.app[REGISTRY].engine
    capacity = engine.capacity(model_id)
    busy = engine.num_in_flight(model_id)
    entries = [
        {"id": slot, "n_ctx": capacity.n_ctx, "is_processing": slot < busy, "id_task": -1}
        for slot in range(capacity.num_slots)
    ]
    return web.json_response(entries)


async def slot_action(request: web.Request) -> web.Response:
    """`?action=erase` forgets nothing a later request could not recompute and
    answers as llama-server; `save` and `restore` are not supported (501)."""
    if request.app[SETTINGS].no_slots:
        raise NotSupportedError("This server has slot endpoints disabled (--no-slots).")
    try:
        id_slot = int(request.match_info["id_slot"])
    except ValueError:
        raise InvalidRequestError("the slot id is a number", param="id_slot") from None
    action = request.query.get("action", "")
    if action == "erase":
        return web.json_response({"id_slot": id_slot, "n_erased": 0})
    if action in ("save", "restore"):
        raise NotSupportedError(
            f"slot {action} is not supported: localserve keeps prompt prefixes in its own KV cache and on disk "
            "(--prefix-cache-disk), which a repeated prompt reuses without a slot file"
        )
    raise InvalidRequestError(f"unknown slot action {action!r}: erase, save or restore", param="action")


async def embeddings(request: web.Request) -> web.Response:
    """llama-server's native shape, `[{index, embedding: [[...]]}]`: a
    pooled vector alone in its list, or with `--pooling none` each token's."""
    body = await parse_body(request, NativeEmbeddingRequest)
    value = body.content if body.content is not None else body.input
    if value is None:
        raise InvalidRequestError("'content' is required", param="content")
    inputs = embedding_inputs(value)
    if not inputs:
        raise InvalidRequestError("'content' is empty", param="content")
    asked = EmbeddingsRequest(body.model, inputs, param="content", per_token=True)
    result = await embed(RequestModels(request), asked)
    data = [
        {"index": i, "embedding": v.tolist() if v.ndim == 2 else [v.tolist()]} for i, v in enumerate(result.vectors)
    ]
    return web.json_response(data)
