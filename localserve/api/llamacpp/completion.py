"""`POST /completion` (and `/completions`): llama-server's native completion.

Body: `prompt` as a string, token ids, a mix of both (`[12, "text", 13]`:
one prompt), or a list of those (one answer each: the response is then a
list), plus the fields `/infill` takes (`n_predict`, `temperature`, `top_k`,
`top_p`, `min_p`, `seed`, `stop`, `n_probs`, `stream`, `return_tokens`,
`response_fields`, ...). No `n_predict` (or -1): the server's `--n-predict`,
else until the context ends. `cache_prompt: false` computes the whole
prompt, reusing no cached prefix; `samplers` is accepted and ignored (the
sampler chain is fixed).

Answer: llama-server's result object (`content`, `tokens`, `stop`,
`stop_type`, `tokens_predicted`, `tokens_evaluated`, `timings`, ...);
streamed as `data: {"content": ..., "stop": false}` events and a last one
with `"stop": true` and the timings, without `[DONE]`.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.routes import OBJECT_OR_LIST, Route, add_routes
from localserve.api.sse import SseWriter
from localserve.api.state import SETTINGS
from localserve.errors import LocalServeError
from localserve.serving.answer import Answer
from localserve.serving.completions import start_completion
from localserve.serving.llamacpp.answer import InfillRun
from localserve.serving.llamacpp.bias import logit_bias_pairs
from localserve.serving.llamacpp.request import (
    NativeCompletionRequest,
    completion_request,
    n_predict_of,
    prompts_of,
    with_server_defaults,
)
from localserve.serving.models import hold_chat_model
from localserve.serving.openai.answer import new_id

log = logging.getLogger(__name__)


def register(app: web.Application) -> None:
    for path in ("/completion", "/completions"):
        add_routes(app, Route("POST", path, completion, NativeCompletionRequest, answer_schema=OBJECT_OR_LIST))


async def completion(request: web.Request) -> web.StreamResponse:
    """llama-server's native completion (see the module docstring)."""
    settings = request.app[SETTINGS]
    body = with_server_defaults(await parse_body(request, NativeCompletionRequest), settings.temp, settings.seed)
    host = RequestModels(request)
    model_id = await hold_chat_model(host, body.model or "")
    tokenizer = host.registry.engine.tokenizer(model_id)
    prompts = await asyncio.to_thread(prompts_of, body.prompt, tokenizer)
    bias = await asyncio.to_thread(logit_bias_pairs, body.logit_bias, tokenizer)
    n_predict = n_predict_of(body.n_predict, settings.n_predict)
    serving_request = completion_request(body, model_id, prompts, bias, n_predict)
    answer = await start_completion(host, serving_request, answer_id=new_id("cmpl"))
    runs = [
        InfillRun(
            body,
            answer.model_id,
            False,
            answer.model.n_ctx,
            answer.tokenizer.decode(ids),
            index=index,
            tokenizer=answer.tokenizer,
            n_predict=n_predict,
            logit_bias=bias,
        )
        for index, ids in enumerate(answer.prompt_ids)
    ]
    headers = {"X-Request-Id": answer.id}
    if body.stream:
        return await _stream(request, body, answer, runs, headers)
    async with answer:
        async for index, event in answer.events():
            runs[index].add(event)
    results = [run.result() for run in runs]
    return web.json_response(
        results if isinstance(body.prompt, list) and len(prompts) > 1 else results[0], headers=headers
    )


async def _stream(
    request: web.Request, body: NativeCompletionRequest, answer: Answer, runs: list[InfillRun], headers: dict[str, str]
) -> web.StreamResponse:
    writer = SseWriter(request, headers)
    try:
        async with answer:
            async for index, event in answer.events():
                run = runs[index]
                num_probs = len(run.probs)
                piece = run.add(event)
                if body.return_progress and not run.progress_sent:
                    for progress in run.progress():
                        await writer.send(progress)
                if piece or event.token_ids:
                    await writer.send(run.partial(piece, len(run.probs) - num_probs))
                if event.finished:
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
        log.exception("error while streaming /completion")
        await writer.send_error(LocalServeError("The server had an unexpected error while streaming."))
    return writer.response
