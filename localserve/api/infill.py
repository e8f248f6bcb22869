"""`POST /infill`: llama.cpp server's fill-in-the-middle endpoint, for code
completion in editors (llama.vim, llama.vscode, Continue's llama.cpp
provider...).

Body: `input_prefix`, `input_suffix` (both required, may be empty),
`input_extra` ([{filename, text}]), `prompt` (start of the middle),
`n_predict`, `t_max_predict_ms`, `n_indent`, `temperature`, `top_k`, `top_p`,
`min_p`, `seed`, `stop`, `repeat_penalty`, `presence_penalty`,
`frequency_penalty`, `stream`, `return_tokens`, `response_fields`, and
`model` (optional: which loaded model; by default the only one, or the first
that has FIM tokens). `cache_prompt` (the prefix cache is always on),
`samplers`, `t_max_prompt_ms` and `id_slot` are accepted and ignored.

As in llama.cpp: once a newline has been generated, `t_max_predict_ms`
stops generation after that many ms, and `n_indent` stops it at the first
later line indented less (the text is cut before that line's first
character); both end with `stop_type: "limit"`. Streaming sends
`data: {json}` events (`content` pieces, `stop: false`) and a last one with
`stop: true`, the counts and timings; no `[DONE]`.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from localserve.api.generation import MergedStreams, submit_all
from localserve.api.infill_prompt import ExtraChunk, fim_prompt, fim_tokens, require_fim
from localserve.api.infill_run import InfillRun
from localserve.api.metrics import latency_observer, note_model
from localserve.api.middleware import parse_body
from localserve.api.sse import SseWriter
from localserve.api.state import MANAGER, engine_of, require_model
from localserve.api.wire import new_id
from localserve.engine.types import SamplingParams, parse_priority
from localserve.errors import LocalServeError, ModelNotFoundError

log = logging.getLogger(__name__)


INT32_MAX = 2**31 - 1  # llama.cpp takes these as int32


class InfillExtra(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str
    filename: str = "tmp"


class InfillRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    input_prefix: str
    input_suffix: str
    input_extra: list[InfillExtra] = Field(default_factory=list)
    prompt: str = ""
    model: str | None = None
    n_predict: int = Field(default=-1, le=INT32_MAX)  # < 1: until the context is full
    t_max_predict_ms: int = 0  # <= 0: no limit
    n_indent: int = Field(default=0, ge=0)
    # llama.cpp server's defaults
    temperature: float = Field(default=0.8, ge=0.0, le=2.0)
    top_k: int = Field(default=40, ge=0, le=INT32_MAX)
    top_p: float = Field(default=0.95, ge=0.0, le=1.0)
    min_p: float = Field(default=0.05, ge=0.0, le=1.0)
    seed: int | None = None  # -1 or none: random
    stop: list[str] = Field(default_factory=list, max_length=16)
    repeat_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    repeat_last_n: int = Field(default=64, ge=0, le=INT32_MAX)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    ignore_eos: bool = False
    stream: bool = False
    return_tokens: bool = False
    response_fields: list[str] | None = None
    priority: float | str | None = None


def register(app: web.Application) -> None:
    app.router.add_post("/infill", infill)


async def infill(request: web.Request) -> web.StreamResponse:
    body = await parse_body(request, InfillRequest)
    model_id = await require_model(request, body.model or _default_model(request))
    note_model(request, model_id)
    engine = engine_of(request)
    tokenizer = engine.tokenizer(model_id)
    fim = require_fim(tokenizer, model_id, param="model" if body.model else None)
    n_ctx = engine.capacity(model_id).n_ctx
    max_tokens = body.n_predict if body.n_predict > 0 else None
    extra = [ExtraChunk(chunk.filename, chunk.text) for chunk in body.input_extra]
    built = await asyncio.to_thread(
        fim_prompt,
        tokenizer,
        fim,
        prefix=body.input_prefix,
        suffix=body.input_suffix,
        prompt=body.prompt,
        extra=extra,
        n_ctx=n_ctx,
        max_tokens=max_tokens,
    )
    params = _sampling(body, room=n_ctx - len(built.token_ids), max_tokens=max_tokens)
    answer_id = new_id("infill")
    streams = submit_all(
        engine,
        model_id,
        answer_id,
        [(built.token_ids, params)],
        priority=parse_priority(body.priority),
        prompt_param="input_prefix",
    )
    run = InfillRun(body, model_id, built.truncated, n_ctx, tokenizer.decode(built.token_ids))
    merged = MergedStreams(streams, observer=latency_observer(request, model_id))
    headers = {"X-Request-Id": answer_id}
    if body.stream:
        return await _stream(request, merged, run, headers)
    try:
        async for _, event in merged:
            run.add(event)
            if run.stopped:
                break
    finally:
        merged.abort()
    return web.json_response(run.result(), headers=headers)


def _default_model(request: web.Request) -> str:
    """The only generative model, else the first with FIM tokens."""
    manager = request.app[MANAGER]
    loaded = list(manager.loaded)
    if len(loaded) == 1:
        return loaded[0]
    for model_id in loaded:
        if fim_tokens(manager.engine.tokenizer(model_id)) is not None:
            return model_id
    if loaded:
        return loaded[0]
    raise ModelNotFoundError("no model is loaded", param="model")


def _sampling(body: InfillRequest, *, room: int, max_tokens: int | None) -> SamplingParams:
    room = max(1, room)
    return SamplingParams(
        max_tokens=min(max_tokens, room) if max_tokens else room,
        temperature=body.temperature,
        top_k=body.top_k,
        top_p=body.top_p,
        min_p=body.min_p,
        repeat_penalty=body.repeat_penalty,
        penalty_last_n=body.repeat_last_n,
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        seed=body.seed if body.seed is not None and body.seed >= 0 else None,
        stop=tuple(s for s in body.stop if s),
        ignore_eos=body.ignore_eos,
    )


async def _stream(
    request: web.Request, merged: MergedStreams, run: InfillRun, headers: dict[str, str]
) -> web.StreamResponse:
    writer = SseWriter(request, headers)
    try:
        async for _, event in merged:
            piece = run.add(event)
            if piece or event.token_ids:
                await writer.send(run.partial(piece))
            if run.stopped:
                break
        await writer.send(run.result(streamed=True))
    except ConnectionResetError:
        pass  # the client left; the finally aborts the request
    except LocalServeError as exc:
        if not writer.started:
            raise
        await writer.send_error(exc)
    except Exception:
        if not writer.started:
            raise
        log.exception("error while streaming /infill")
        await writer.send_error(LocalServeError("The server had an unexpected error while streaming."))
    finally:
        merged.abort()
    return writer.response
