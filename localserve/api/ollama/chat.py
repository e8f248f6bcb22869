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
loaded once idle (`api.holds`). An empty prompt or message list only loads
the model (`done_reason: "load"`, or `"unload"` with `keep_alive: 0`), as
Ollama does.
"""

from __future__ import annotations

import time

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.ollama.models import model_id_of
from localserve.api.ollama.ndjson import NdjsonWriter, ollama_stream
from localserve.serving.answer import Answer
from localserve.serving.chat import start_chat
from localserve.serving.completions import start_text
from localserve.serving.models import hold_chat_model
from localserve.serving.ollama.answer import ChatLines, GenerateLines, OllamaLines, loaded_line
from localserve.serving.ollama.request import OllamaChatRequest, OllamaGenerateRequest, chat_request, text_request
from localserve.serving.openai.answer import new_id


async def chat(request: web.Request) -> web.StreamResponse:
    """`POST /api/chat`."""
    started_ns = time.monotonic_ns()
    body = await parse_body(request, OllamaChatRequest)
    host = RequestModels(request)
    model_id = await hold_chat_model(host, model_id_of(request, body.model))
    if not body.messages:
        fields = {"message": {"role": "assistant", "content": ""}}
        return web.json_response(loaded_line(body.model, body.keep_alive, fields))
    answer = await start_chat(host, chat_request(body, model_id), answer_id=new_id("ollama"))
    return await _answer(request, answer, ChatLines(body.model, started_ns), stream=body.stream)


async def generate(request: web.Request) -> web.StreamResponse:
    """`POST /api/generate`."""
    started_ns = time.monotonic_ns()
    body = await parse_body(request, OllamaGenerateRequest)
    host = RequestModels(request)
    model_id = await hold_chat_model(host, model_id_of(request, body.model))
    if not body.prompt and not body.suffix and not body.context:
        return web.json_response(loaded_line(body.model, body.keep_alive, {"response": ""}))
    answer = await start_text(host, text_request(body, model_id), answer_id=new_id("ollama"))
    return await _answer(request, answer, GenerateLines(body.model, started_ns, raw=body.raw), stream=body.stream)


async def _answer(request: web.Request, answer: Answer, lines: OllamaLines, *, stream: bool) -> web.StreamResponse:
    lines.follow(answer)
    headers = {"X-Request-Id": answer.id}
    if stream:
        return await ollama_stream(request, answer, lines, NdjsonWriter(request, headers))
    async with answer:
        (result,) = await answer.collect()
    return web.json_response(lines.whole(result, answer), headers=headers)
