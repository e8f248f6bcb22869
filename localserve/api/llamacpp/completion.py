"""`POST /completion` (and `/completions`): llama-server's native completion.

Body: `prompt` as a string, token ids, a mix of both (`[12, "text", 13]`:
one prompt), or a list of those (one answer each: the response is then a
list), plus the fields `/infill` takes (`n_predict`, `temperature`, `top_k`,
`top_p`, `min_p`, `seed`, `stop`, `n_probs`, `stream`, `return_tokens`,
`response_fields`, ...). No `n_predict` (or -1): the server's `--n-predict`,
else until the context ends. `cache_prompt` and `samplers` are accepted
and ignored (the prefix cache is always on; the sampler chain is fixed).

Answer: llama-server's result object (`content`, `tokens`, `stop`,
`stop_type`, `tokens_predicted`, `tokens_evaluated`, `timings`, ...);
streamed as `data: {"content": ..., "stop": false}` events and a last one
with `"stop": true` and the timings, without `[DONE]`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from pydantic import Field

from localserve.api.hosting import RequestModels
from localserve.api.llamacpp.bias import logit_bias_pairs
from localserve.api.llamacpp.infill_run import InfillRun, LlamaParams, sampling_of, with_server_defaults
from localserve.api.middleware import parse_body
from localserve.api.routes import OBJECT_OR_LIST, Route, add_routes
from localserve.api.sse import SseWriter
from localserve.api.state import SETTINGS
from localserve.engine.types import parse_priority
from localserve.errors import InvalidRequestError, LocalServeError
from localserve.serving import types as serving
from localserve.serving.answer import Answer
from localserve.serving.completions import start_completion
from localserve.serving.models import hold_chat_model
from localserve.serving.openai.wire import new_id
from localserve.serving.types import Options

log = logging.getLogger(__name__)

PromptPart = int | str
Prompt = str | list[PromptPart]


class NativeCompletionRequest(LlamaParams):
    prompt: Prompt | list[Prompt] | dict[str, Any] = ""
    n_cmpl: int = Field(default=1, ge=1, le=1)  # several completions of one prompt: not here


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
    prompts = await asyncio.to_thread(_prompts, body.prompt, tokenizer)
    bias = await asyncio.to_thread(logit_bias_pairs, body.logit_bias, tokenizer)
    n_predict = _n_predict(body.n_predict, settings.n_predict)
    options = Options(
        sampling=sampling_of(body, bias),
        max_tokens=n_predict if n_predict > 0 else None,
        num_logprobs=body.n_probs or None,
        priority=parse_priority(body.priority),
    )
    answer = await start_completion(
        host, serving.CompletionRequest(model_id, prompts, options), answer_id=new_id("cmpl")
    )
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
        return await _stream(request, answer, runs, headers)
    async with answer:
        async for index, event in answer.events():
            runs[index].add(event)
    results = [run.result() for run in runs]
    return web.json_response(
        results if isinstance(body.prompt, list) and len(prompts) > 1 else results[0], headers=headers
    )


def _n_predict(asked: int, server_default: int) -> int:
    """llama-server's rule: the request's n_predict, capped by --n-predict."""
    if asked < 0:
        return server_default
    return min(asked, server_default) if server_default >= 0 else asked


def _prompts(prompt: Prompt | list[Prompt] | dict[str, Any], tokenizer: Any) -> tuple[str | tuple[int, ...], ...]:
    """One entry per prompt: text, or token ids (a mix becomes ids)."""
    if isinstance(prompt, dict):
        text = prompt.get("prompt_string")
        if not isinstance(text, str) or prompt.get("multimodal_data"):
            raise InvalidRequestError(
                "a JSON prompt needs 'prompt_string'; multimodal data is not supported here", param="prompt"
            )
        return (text,)
    if isinstance(prompt, str):
        return (prompt,)
    if not prompt:
        raise InvalidRequestError("'prompt' is empty", param="prompt")
    if all(isinstance(part, int | str) for part in prompt) and any(isinstance(part, int) for part in prompt):
        return (_token_ids(prompt, tokenizer),)  # type: ignore[arg-type]
    out: list[str | tuple[int, ...]] = []
    for entry in prompt:
        out.append(entry if isinstance(entry, str) else _token_ids(entry, tokenizer))  # type: ignore[arg-type]
    return tuple(out)


def _token_ids(parts: list[PromptPart], tokenizer: Any) -> tuple[int, ...]:
    ids: list[int] = []
    vocab_size = tokenizer.vocab_size
    for part in parts:
        if isinstance(part, int):
            if not 0 <= part < vocab_size:  # llama.cpp would refuse the whole step
                raise InvalidRequestError(
                    f"token id {part} in 'prompt' is outside the vocabulary (size {vocab_size})", param="prompt"
                )
            ids.append(part)
        else:
            ids.extend(tokenizer.encode(part, add_special=False, parse_special=True))
    return tuple(ids)


async def _stream(
    request: web.Request, answer: Answer, runs: list[InfillRun], headers: dict[str, str]
) -> web.StreamResponse:
    writer = SseWriter(request, headers)
    try:
        async with answer:
            async for index, event in answer.events():
                run = runs[index]
                num_probs = len(run.probs)
                piece = run.add(event)
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
