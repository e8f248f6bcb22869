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

import time
from typing import Any

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.ollama.models import model_id_of
from localserve.api.ollama.wire import (
    ChatLines,
    GenerateLines,
    NdjsonWriter,
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaLines,
    now_iso,
    ollama_options,
    ollama_stream,
)
from localserve.engine.types import parse_priority
from localserve.errors import InvalidRequestError
from localserve.models.policy import parse_keep_alive
from localserve.serving.answer import Answer
from localserve.serving.chat import start_chat
from localserve.serving.completions import start_text
from localserve.serving.models import hold_chat_model
from localserve.serving.openai.wire import new_id
from localserve.serving.types import ChatRequest, FunctionTool, OutputFormat, TextRequest, Tools


async def chat(request: web.Request) -> web.StreamResponse:
    """`POST /api/chat`."""
    started_ns = time.monotonic_ns()
    body = await parse_body(request, OllamaChatRequest)
    host = RequestModels(request)
    model_id = await hold_chat_model(host, model_id_of(request, body.model))
    if not body.messages:
        return _loaded(body.model, body.keep_alive, {"message": {"role": "assistant", "content": ""}})
    tools = None
    if body.tools:
        functions = tuple(
            FunctionTool(t.function.name, t.function.description, t.function.parameters) for t in body.tools
        )
        tools = Tools(functions)
    chat_request = ChatRequest(
        model_id,
        tuple(m.message() for m in body.messages),
        ollama_options(body.options, priority=parse_priority(None)),
        tools=tools,
        output=_output_format(body.format),
        think=False if body.think is False else None,
    )
    answer = await start_chat(host, chat_request, answer_id=new_id("ollama"))
    return await _answer(request, answer, ChatLines(body.model, started_ns), stream=body.stream)


async def generate(request: web.Request) -> web.StreamResponse:
    """`POST /api/generate`."""
    started_ns = time.monotonic_ns()
    body = await parse_body(request, OllamaGenerateRequest)
    host = RequestModels(request)
    model_id = await hold_chat_model(host, model_id_of(request, body.model))
    if not body.prompt and not body.suffix and not body.context:
        return _loaded(body.model, body.keep_alive, {"response": ""})
    text_request = TextRequest(
        model_id,
        body.prompt,
        ollama_options(body.options, priority=parse_priority(None)),
        system=body.system,
        raw=body.raw,
        context=tuple(body.context) if body.context else None,
        suffix=body.suffix or None,
        output=_output_format(body.format),
    )
    answer = await start_text(host, text_request, answer_id=new_id("ollama"))
    return await _answer(request, answer, GenerateLines(body.model, started_ns, raw=body.raw), stream=body.stream)


async def _answer(request: web.Request, answer: Answer, lines: OllamaLines, *, stream: bool) -> web.StreamResponse:
    lines.follow(answer)
    headers = {"X-Request-Id": answer.id}
    if stream:
        return await ollama_stream(request, answer, lines, NdjsonWriter(request, headers))
    async with answer:
        (result,) = await answer.collect()
    return web.json_response(lines.whole(result, answer), headers=headers)


def _loaded(name: str, keep_alive: str | float | None, fields: dict[str, Any]) -> web.Response:
    """Ollama's answer to an empty request: the model is loaded (and held till
    now); with `keep_alive: 0` the lease's release unloads it once idle."""
    reason = "unload" if parse_keep_alive(keep_alive) == 0 else "load"
    return web.json_response({"model": name, "created_at": now_iso(), **fields, "done_reason": reason, "done": True})


def _output_format(value: str | dict[str, Any] | None) -> OutputFormat | None:
    """`format`: "json" (any JSON) or a JSON schema."""
    if not value:
        return None
    if value == "json":
        return OutputFormat("json_object", param="format", schema_param="format")
    if isinstance(value, dict):
        return OutputFormat("json_schema", value, param="format", schema_param="format")
    raise InvalidRequestError(f'format must be "json" or a JSON schema object; got {value!r}', param="format")
