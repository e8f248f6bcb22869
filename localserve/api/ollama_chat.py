"""Ollama's `POST /api/chat` and `POST /api/generate`.

Streaming is the default (`stream` defaults to true, as in Ollama): one JSON
object per line (`application/x-ndjson`), `done: false` while text comes, then
one `done: true` line with `done_reason` and the timings in nanoseconds
(`total_duration`, `load_duration`, `prompt_eval_count`,
`prompt_eval_duration`, `eval_count`, `eval_duration`). An error after the
first line arrives as a last `{"error": "..."}` line.

Sampling follows Ollama's defaults (temperature 0.8, top_k 40, top_p 0.9,
repeat_penalty 1.1 over the last 64 tokens) unless `options` say otherwise.
`format` ("json" or a JSON schema) becomes a grammar. `tools` on /api/chat
work as on /v1/chat/completions with `tool_choice: "auto"`; the calls come
back as `message.tool_calls` with `arguments` as an object, each in one line
once complete. /api/generate takes `system`, `raw`, `context` and `suffix`
(fill-in-the-middle with the model's FIM tokens); `template` is ignored
(Ollama's Go templates do not apply: the model's own Jinja template is used).
A model not loaded is loaded on demand; `keep_alive` sets how long it stays
loaded once idle (`api.leases`). An empty prompt or message list only loads
the model (`done_reason: "load"`, or `"unload"` with `keep_alive: 0`), as
Ollama does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from localserve.api.generation import MergedStreams, submit_all
from localserve.api.infill_prompt import fim_prompt, require_fim
from localserve.api.metrics import latency_observer, note_model
from localserve.api.middleware import parse_body
from localserve.api.ollama_models import model_id_of
from localserve.api.ollama_wire import (
    ChatLines,
    GenerateLines,
    NdjsonWriter,
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaLines,
    now_iso,
    ollama_sampling,
    ollama_stream,
)
from localserve.api.prompts import chat_prompt, completion_prompt
from localserve.api.sampling import grammar_for, validate
from localserve.api.schemas import JsonSchemaFormat, ResponseFormat
from localserve.api.state import STATE, engine_of, require_model
from localserve.api.tools import ToolTemplate, plan_tools, prompt_messages
from localserve.api.wire import new_id
from localserve.engine.types import SamplingParams, parse_priority
from localserve.errors import InvalidRequestError
from localserve.models.policy import parse_keep_alive


async def chat(request: web.Request) -> web.StreamResponse:
    """`POST /api/chat`."""
    started_ns = _now_ns()
    body = await parse_body(request, OllamaChatRequest)
    model_id = await _generative(request, body.model)
    if not body.messages:
        return _loaded(body.model, body.keep_alive, {"message": {"role": "assistant", "content": ""}})
    engine = engine_of(request)
    tokenizer = engine.tokenizer(model_id)
    template = request.app[STATE].chat_template(model_id, tokenizer)
    plan = plan_tools(body.tools, "auto", parallel=True) if body.tools else None
    grammar = _format_grammar(body.format)
    if plan is not None and grammar is not None:
        raise InvalidRequestError("format cannot be combined with tools", param="format")
    messages, tools = prompt_messages([m.for_template() for m in body.messages], plan, template)
    renderer = ToolTemplate(template, tools) if tools else template
    prompt_ids = await asyncio.to_thread(chat_prompt, renderer, tokenizer, messages)  # type: ignore[arg-type]
    params = ollama_sampling(
        body.options,
        num_prompt_tokens=len(prompt_ids),
        n_ctx=engine.capacity(model_id).n_ctx,
        grammar=plan.grammar if plan else grammar,
    )
    await validate(engine.backend(model_id), params, param="tools" if plan else "format")
    lines = ChatLines(body.model, started_ns, tools=plan is not None)
    return await _run(request, model_id, prompt_ids, params, lines, stream=body.stream, prompt_param="messages")


async def generate(request: web.Request) -> web.StreamResponse:
    """`POST /api/generate`."""
    started_ns = _now_ns()
    body = await parse_body(request, OllamaGenerateRequest)
    model_id = await _generative(request, body.model)
    if not body.prompt and not body.suffix and not body.context:
        return _loaded(body.model, body.keep_alive, {"response": ""})
    engine = engine_of(request)
    tokenizer = engine.tokenizer(model_id)
    n_ctx = engine.capacity(model_id).n_ctx
    num_predict = body.options.num_predict if body.options else None

    def build() -> list[int]:
        if body.suffix:
            fim = require_fim(tokenizer, model_id, param="suffix")
            return fim_prompt(
                tokenizer, fim, prefix=body.prompt, suffix=body.suffix, n_ctx=n_ctx, max_tokens=num_predict
            ).token_ids
        template = request.app[STATE].chat_template(model_id, tokenizer)
        messages = [{"role": "system", "content": body.system}] if body.system else []
        messages.append({"role": "user", "content": body.prompt})
        if body.context:  # the conversation goes on: no second BOS in the middle
            _check_ids(body.context, tokenizer.vocab_size)
            text = body.prompt if body.raw else template.render(messages, add_generation_prompt=True)
            return list(body.context) + tokenizer.encode(text, add_special=False, parse_special=True)
        if body.raw:
            return completion_prompt(tokenizer, body.prompt, index=0)
        return chat_prompt(template, tokenizer, messages)

    prompt_ids = await asyncio.to_thread(build)
    grammar = _format_grammar(body.format)
    params = ollama_sampling(body.options, num_prompt_tokens=len(prompt_ids), n_ctx=n_ctx, grammar=grammar)
    await validate(engine.backend(model_id), params, param="format")
    lines = GenerateLines(body.model, started_ns, context=None if body.raw else prompt_ids)
    return await _run(request, model_id, prompt_ids, params, lines, stream=body.stream, prompt_param="prompt")


async def _run(
    request: web.Request,
    model_id: str,
    prompt_ids: list[int],
    params: SamplingParams,
    lines: OllamaLines,
    *,
    stream: bool,
    prompt_param: str,
) -> web.StreamResponse:
    answer_id = new_id("ollama")
    engine = engine_of(request)
    lines.submitted_ns = _now_ns()
    streams = submit_all(
        engine, model_id, answer_id, [(prompt_ids, params)], priority=parse_priority(None), prompt_param=prompt_param
    )
    merged = MergedStreams(streams, observer=latency_observer(request, model_id))
    headers = {"X-Request-Id": answer_id}
    if stream:
        return await ollama_stream(request, merged, lines, NdjsonWriter(request, headers))
    try:
        async for _, event in merged:
            lines.add(event)
    finally:
        merged.abort()
    return web.json_response(lines.whole(), headers=headers)


async def _generative(request: web.Request, name: str) -> str:
    """The chat model `name` means, loaded (on demand) and held for this request."""
    model_id = await require_model(request, model_id_of(request, name))
    note_model(request, model_id)
    return model_id


def _loaded(name: str, keep_alive: str | float | None, fields: dict[str, Any]) -> web.Response:
    """Ollama's answer to an empty request: the model is loaded (and held till
    now); with `keep_alive: 0` the lease's release unloads it once idle."""
    reason = "unload" if parse_keep_alive(keep_alive) == 0 else "load"
    return web.json_response({"model": name, "created_at": now_iso(), **fields, "done_reason": reason, "done": True})


def _format_grammar(value: str | dict[str, Any] | None) -> str | None:
    if not value:
        return None
    try:
        if value == "json":
            return grammar_for(ResponseFormat(type="json_object"))
        if isinstance(value, dict):
            return grammar_for(
                ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat.model_validate({"schema": value}))
            )
    except InvalidRequestError as exc:
        raise InvalidRequestError(
            exc.message.replace("response_format.json_schema.schema", "format"), param="format"
        ) from None
    raise InvalidRequestError(f'format must be "json" or a JSON schema object; got {value!r}', param="format")


def _check_ids(token_ids: list[int], vocab_size: int) -> None:
    bad = next((t for t in token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequestError(
            f"context has token id {bad}, outside the vocabulary (size {vocab_size})", param="context"
        )


def _now_ns() -> int:
    return time.monotonic_ns()
