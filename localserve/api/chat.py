"""`POST /v1/chat/completions`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from localserve.api.generation import MergedStreams, collect, submit_all
from localserve.api.middleware import parse_body
from localserve.api.prompts import chat_prompt_async
from localserve.api.sampling import check_logit_bias, grammar_for, per_choice, sampling_params, validate
from localserve.api.schemas import ChatCompletionRequest
from localserve.api.sse import stream_answer
from localserve.api.state import STATE, engine_of, require_model
from localserve.api.wire import FINISH_REASONS, AnswerMeta, chat_completion, chat_logprobs, new_id, usage
from localserve.backends.base import Tokenizer
from localserve.engine.types import TokenEvent, parse_priority


class ChatChunkFormat:
    """`chat.completion.chunk` objects: a first chunk per choice with the
    role, content deltas, a last chunk with the finish reason, and the usage
    chunk (`choices: []`) when `stream_options.include_usage` is set."""

    def __init__(
        self, meta: AnswerMeta, tokenizer: Tokenizer, *, num_choices: int, include_usage: bool, with_logprobs: bool
    ) -> None:
        self.meta = meta
        self.tokenizer = tokenizer
        self.include_usage = include_usage
        self.with_logprobs = with_logprobs
        self._started: set[int] = set()
        self._finals: list[TokenEvent | None] = [None] * num_choices

    def chunks(self, index: int, event: TokenEvent) -> list[dict[str, Any]]:
        out = []
        if index not in self._started:
            self._started.add(index)
            out.append(self._chunk(index, {"role": "assistant", "content": ""}))
        if event.text or event.logprobs:
            logprobs = chat_logprobs(self.tokenizer, event.logprobs) if self.with_logprobs else None
            out.append(self._chunk(index, {"content": event.text}, logprobs=logprobs))
        if event.finish_reason is not None:
            self._finals[index] = event
            out.append(self._chunk(index, {}, finish_reason=FINISH_REASONS[event.finish_reason]))
        return out

    def usage_chunk(self) -> dict[str, Any]:
        body = self.meta.header("chat.completion.chunk")
        body["choices"] = []
        body["usage"] = usage(self._finals, len(self._finals))
        return body

    def _chunk(
        self,
        index: int,
        delta: dict[str, Any],
        *,
        logprobs: dict[str, Any] | None = None,
        finish_reason: str | None = None,
    ) -> dict[str, Any]:
        body = self.meta.header("chat.completion.chunk")
        body["choices"] = [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]
        if self.include_usage:
            body["usage"] = None  # OpenAI sends null on every chunk but the last
        return body


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Chat completion, streamed (SSE) or whole; n choices; JSON modes."""
    body = await parse_body(request, ChatCompletionRequest)
    model_id = require_model(request, body.model)
    engine = engine_of(request)
    tokenizer = engine.tokenizer(model_id)
    template = request.app[STATE].chat_template(model_id, tokenizer)
    prompt_ids = await chat_prompt_async(template, tokenizer, [m.for_template() for m in body.messages])
    check_logit_bias(body, tokenizer.vocab_size)
    params = sampling_params(
        body,
        num_prompt_tokens=len(prompt_ids),
        n_ctx=engine.capacity(model_id).n_ctx,
        max_tokens=body.token_limit,
        num_logprobs=body.num_logprobs,
        grammar=grammar_for(body.response_format),
    )
    await validate(engine.backend(model_id), params, param="response_format")
    meta = AnswerMeta(new_id("chatcmpl"), model_id)
    streams = submit_all(
        engine,
        model_id,
        meta.id,
        [(prompt_ids, per_choice(params, i)) for i in range(body.n)],
        priority=parse_priority(body.priority),
        prompt_param="messages",
    )
    merged = MergedStreams(streams)
    headers = {"X-Request-Id": meta.id}
    if body.stream:
        fmt = ChatChunkFormat(
            meta, tokenizer, num_choices=body.n, include_usage=body.include_usage, with_logprobs=body.logprobs
        )
        return await stream_answer(request, merged, fmt, include_usage=body.include_usage, headers=headers)
    results = await collect(merged)
    answer = chat_completion(meta, results, tokenizer, with_logprobs=body.logprobs)
    return web.json_response(answer, headers=headers)
