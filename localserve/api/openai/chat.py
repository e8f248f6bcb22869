"""`POST /v1/chat/completions`: OpenAI's chat dialect over `serving.chat`
(tools and JSON formats included). The whole answer is
`serving.openai.chat`'s, as for a batch line; the stream's chunks are here."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.sse import stream_answer
from localserve.engine.backend import Tokenizer
from localserve.engine.types import TokenLogprob
from localserve.serving.openai.chat import start, whole
from localserve.serving.openai.schemas import ChatCompletionRequest
from localserve.serving.openai.wire import AnswerMeta, chat_logprobs, usage
from localserve.serving.types import (
    ChoiceEnd,
    Delta,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallStart,
    Usage,
)


class ChatChunkFormat:
    """`chat.completion.chunk` objects: a first chunk per choice with the
    role, content deltas, a last chunk with the finish reason, and the usage
    chunk (`choices: []`) when `stream_options.include_usage` is set.

    With tools, calls leave as `delta.tool_calls` (index, id and name first,
    then pieces of `arguments`) and the finish reason becomes `tool_calls`."""

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
        self.tools = tools
        self._started: set[int] = set()
        self._usages: list[Usage | None] = [None] * num_choices

    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        index = delta.index
        out = []
        if index not in self._started:
            self._started.add(index)
            out.append(self._chunk(index, {"role": "assistant", "content": None}))  # as llama-server: no empty delta
        if isinstance(delta, TextDelta):
            out.append(self._chunk(index, {"content": delta.text}, logprobs=self._logprobs(delta.logprobs)))
        elif isinstance(delta, ReasoningDelta):  # as llama-server and vLLM stream a model's thinking
            out.append(self._chunk(index, {"reasoning_content": delta.text}, logprobs=self._logprobs(delta.logprobs)))
        elif isinstance(delta, ToolCallStart):
            function = {"name": delta.name, "arguments": ""}
            call = {"index": delta.call_index, "id": delta.call_id, "type": "function", "function": function}
            out.append(self._chunk(index, {"tool_calls": [call]}, logprobs=self._logprobs(delta.logprobs)))
        elif isinstance(delta, ToolCallArguments):
            call = {"index": delta.call_index, "function": {"arguments": delta.arguments}}
            out.append(self._chunk(index, {"tool_calls": [call]}, logprobs=self._logprobs(delta.logprobs)))
        elif isinstance(delta, ChoiceEnd):
            self._usages[index] = delta.usage
            reason = delta.finish_reason
            if delta.num_tool_calls and reason == "stop":
                reason = "tool_calls"
            out.append(self._chunk(index, {}, finish_reason=reason))
        return out

    def _logprobs(self, logprobs: tuple[TokenLogprob, ...]) -> dict[str, Any] | None:
        # With tools, only the first piece of an event carries its log-probabilities.
        if not self.with_logprobs or (self.tools and not logprobs):
            return None
        return chat_logprobs(self.tokenizer, logprobs)

    def usage_chunk(self) -> dict[str, Any]:
        body = self.meta.header("chat.completion.chunk")
        body["choices"] = []
        body["usage"] = usage(self._usages, len(self._usages))
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
    meta, answer = await start(RequestModels(request), body)
    headers = {"X-Request-Id": meta.id}
    if body.stream:
        fmt = ChatChunkFormat(
            meta,
            answer.tokenizer,
            num_choices=answer.num_choices,
            include_usage=body.include_usage,
            with_logprobs=body.logprobs,
            tools=answer.plan is not None,
        )
        return await stream_answer(request, answer, fmt, include_usage=body.include_usage, headers=headers)
    return web.json_response(await whole(meta, answer, body), headers=headers)
