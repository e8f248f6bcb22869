"""`POST /v1/chat/completions`, with tool calling (see `api.tools`)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from localserve.api.generation import MergedStreams, collect, submit_all
from localserve.api.metrics import latency_observer, note_model
from localserve.api.middleware import parse_body
from localserve.api.prompts import chat_prompt_async
from localserve.api.sampling import check_logit_bias, grammar_for, per_choice, sampling_params, validate
from localserve.api.schemas import ChatCompletionRequest
from localserve.api.sse import stream_answer
from localserve.api.state import STATE, engine_of, require_model
from localserve.api.tools import ToolPlan, ToolTemplate, plan_tools, prompt_messages
from localserve.api.tools_parse import Delta, ToolCallParser, parse_reply
from localserve.api.wire import FINISH_REASONS, AnswerMeta, ChoiceResult, chat_completion, chat_logprobs, new_id, usage
from localserve.backends.base import Tokenizer
from localserve.engine.types import TokenEvent, parse_priority
from localserve.errors import InvalidRequestError


class ChatChunkFormat:
    """`chat.completion.chunk` objects: a first chunk per choice with the
    role, content deltas, a last chunk with the finish reason, and the usage
    chunk (`choices: []`) when `stream_options.include_usage` is set.

    With tools, each choice's text goes through a `ToolCallParser`: calls
    leave as `delta.tool_calls` (index, id and name first, then pieces of
    `arguments`) and the finish reason becomes `tool_calls`."""

    def __init__(
        self,
        meta: AnswerMeta,
        tokenizer: Tokenizer,
        *,
        num_choices: int,
        include_usage: bool,
        with_logprobs: bool,
        tools: bool = False,
    ) -> None:
        self.meta = meta
        self.tokenizer = tokenizer
        self.include_usage = include_usage
        self.with_logprobs = with_logprobs
        self._started: set[int] = set()
        self._finals: list[TokenEvent | None] = [None] * num_choices
        self._parsers = [ToolCallParser() for _ in range(num_choices)] if tools else None

    def chunks(self, index: int, event: TokenEvent) -> list[dict[str, Any]]:
        out = []
        if index not in self._started:
            self._started.add(index)
            out.append(self._chunk(index, {"role": "assistant", "content": ""}))
        if event.text or event.logprobs:
            logprobs = chat_logprobs(self.tokenizer, event.logprobs) if self.with_logprobs else None
            if self._parsers is None:
                out.append(self._chunk(index, {"content": event.text}, logprobs=logprobs))
            else:
                deltas = self._tool_deltas(self._parsers[index].feed(event.text))
                out += [self._chunk(index, d, logprobs=logprobs if i == 0 else None) for i, d in enumerate(deltas)]
        if event.finish_reason is not None:
            self._finals[index] = event
            finish_reason = FINISH_REASONS[event.finish_reason]
            if self._parsers is not None:
                parser = self._parsers[index]
                out += [self._chunk(index, d) for d in self._tool_deltas(parser.finish())]
                if parser.calls and finish_reason == "stop":
                    finish_reason = "tool_calls"
            out.append(self._chunk(index, {}, finish_reason=finish_reason))
        return out

    @staticmethod
    def _tool_deltas(deltas: list[Delta]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for d in deltas:
            if d.content:
                out.append({"content": d.content})
            elif d.name:
                call = {
                    "index": d.index,
                    "id": d.call_id,
                    "type": "function",
                    "function": {"name": d.name, "arguments": ""},
                }
                out.append({"tool_calls": [call]})
            elif d.arguments:
                out.append({"tool_calls": [{"index": d.index, "function": {"arguments": d.arguments}}]})
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
    """Chat completion, streamed (SSE) or whole; n choices; JSON modes; tools."""
    body = await parse_body(request, ChatCompletionRequest)
    model_id = await require_model(request, body.model)
    note_model(request, model_id)
    engine = engine_of(request)
    tokenizer = engine.tokenizer(model_id)
    template = request.app[STATE].chat_template(model_id, tokenizer)
    plan = plan_tools(body.tools, body.tool_choice, parallel=body.parallel_tool_calls)
    messages, tools = prompt_messages([m.for_template() for m in body.messages], plan, template)
    renderer = ToolTemplate(template, tools) if tools else template
    prompt_ids = await chat_prompt_async(renderer, tokenizer, messages)  # type: ignore[arg-type]
    check_logit_bias(body, tokenizer.vocab_size)
    params = sampling_params(
        body,
        num_prompt_tokens=len(prompt_ids),
        n_ctx=engine.capacity(model_id).n_ctx,
        max_tokens=body.token_limit,
        num_logprobs=body.num_logprobs,
        grammar=_grammar(body, plan),
    )
    await validate(engine.backend(model_id), params, param="tools" if plan else "response_format")
    meta = AnswerMeta(new_id("chatcmpl"), model_id)
    streams = submit_all(
        engine,
        model_id,
        meta.id,
        [(prompt_ids, per_choice(params, i)) for i in range(body.n)],
        priority=parse_priority(body.priority),
        prompt_param="messages",
    )
    merged = MergedStreams(streams, observer=latency_observer(request, model_id))
    headers = {"X-Request-Id": meta.id}
    if body.stream:
        fmt = ChatChunkFormat(
            meta,
            tokenizer,
            num_choices=body.n,
            include_usage=body.include_usage,
            with_logprobs=body.logprobs,
            tools=plan is not None,
        )
        return await stream_answer(request, merged, fmt, include_usage=body.include_usage, headers=headers)
    results = await collect(merged)
    answer = chat_completion(meta, results, tokenizer, with_logprobs=body.logprobs)
    if plan is not None:
        _add_tool_calls(answer, results)
    return web.json_response(answer, headers=headers)


def _grammar(body: ChatCompletionRequest, plan: ToolPlan | None) -> str | None:
    if plan is None:
        return grammar_for(body.response_format)
    if body.response_format is not None and body.response_format.type != "text":
        raise InvalidRequestError(
            "response_format cannot be combined with tools; use tool_choice 'none' or leave response_format out",
            param="response_format",
        )
    return plan.grammar


def _add_tool_calls(answer: dict[str, Any], results: list[ChoiceResult]) -> None:
    """Turn replies that are tool calls into `message.tool_calls`."""
    for choice, result in zip(answer["choices"], results, strict=True):
        reply = parse_reply(result.text)
        if not reply.calls:
            continue
        choice["message"]["content"] = reply.content
        choice["message"]["tool_calls"] = [call.openai() for call in reply.calls]
        if choice["finish_reason"] == "stop":
            choice["finish_reason"] = "tool_calls"
