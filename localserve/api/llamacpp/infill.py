"""`POST /infill`: llama.cpp server's fill-in-the-middle endpoint, for code
completion in editors (llama.vim, llama.vscode, Continue's llama.cpp
provider...).

Body: `input_prefix`, `input_suffix` (both required, may be empty),
`input_extra` ([{filename, text}]), `prompt` (start of the middle),
`n_predict`, `t_max_predict_ms`, `n_indent`, `temperature`, `top_k`, `top_p`,
`min_p`, `seed`, `stop`, `repeat_penalty`, `presence_penalty`,
`frequency_penalty`, `stream`, `return_tokens`, `response_fields`, and
`model` (optional: which loaded model; by default the only one, or the first
that has FIM tokens). `cache_prompt: false` computes the whole prompt,
reusing no cached prefix; `samplers`, `t_max_prompt_ms` and `id_slot` are
accepted and ignored.

As in llama.cpp: once a newline has been generated, `t_max_predict_ms`
stops generation after that many ms, and `n_indent` stops it at the first
later line indented less (the text is cut before that line's first
character); both end with `stop_type: "limit"`. Streaming sends
`data: {json}` events (`content` pieces, `stop: false`) and a last one with
`stop: true`, the counts and timings; no `[DONE]`.
"""

from __future__ import annotations

import logging

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.routes import Route, add_routes
from localserve.api.sse import SseWriter
from localserve.api.state import REGISTRY, SETTINGS
from localserve.errors import LocalServeError, ModelNotFoundError
from localserve.serving.answer import Answer
from localserve.serving.completions import start_infill
from localserve.serving.fim import fim_tokens
from localserve.serving.llamacpp.answer import InfillRun
from localserve.serving.llamacpp.request import NativeInfillRequest, infill_request, with_server_defaults
from localserve.serving.openai.answer import new_id

log = logging.getLogger(__name__)


def register(app: web.Application) -> None:
    add_routes(app, Route("POST", "/infill", infill, NativeInfillRequest))


async def infill(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    body = with_server_defaults(await parse_body(request, NativeInfillRequest), settings.temp, settings.seed)
    serving_request = infill_request(body, body.model or _default_model(request))
    answer = await start_infill(RequestModels(request), serving_request, answer_id=new_id("infill"))
    n_ctx = answer.model.n_ctx
    run = InfillRun(body, answer.model_id, answer.truncated, n_ctx, answer.tokenizer.decode(answer.prompt_ids[0]))
    headers = {"X-Request-Id": answer.id}
    if body.stream:
        return await _stream(request, answer, run, headers)
    async with answer:
        async for _, event in answer.events():
            run.add(event)
            if run.stopped:
                break
    return web.json_response(run.result(), headers=headers)


def _default_model(request: web.Request) -> str:
    """The only generative model, else the first with FIM tokens."""
    registry = request.app[REGISTRY]
    loaded = list(registry.loaded)
    if len(loaded) == 1:
        return loaded[0]
    for model_id in loaded:
        if fim_tokens(registry.engine.tokenizer(model_id)) is not None:
            return model_id
    if loaded:
        return loaded[0]
    raise ModelNotFoundError("no model is loaded", param="model")


async def _stream(request: web.Request, answer: Answer, run: InfillRun, headers: dict[str, str]) -> web.StreamResponse:
    writer = SseWriter(request, headers)
    try:
        async with answer:
            async for _, event in answer.events():
                piece = run.add(event)
                if piece or event.token_ids:
                    await writer.send(run.partial(piece))
                if run.stopped:
                    break
        await writer.send(run.result(streamed=True))
    except ConnectionResetError:
        pass  # the client left; leaving the answer aborted it
    except LocalServeError as exc:
        if not writer.started:
            raise
        await writer.send_error(exc)
    except Exception:
        if not writer.started:
            raise
        log.exception("error while streaming /infill")
        await writer.send_error(LocalServeError("The server had an unexpected error while streaming."))
    return writer.response
