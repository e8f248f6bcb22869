"""`POST /v1/chat/completions`: OpenAI's chat dialect over `serving.chat`
(tools and JSON formats included). The whole answer is the
`chat.completion` object a batch line gets too (`serving.openai.wire`); the
stream's chunks are here. llama-server's fields come only when asked:
`timings` (`timings_per_token`), `prompt_progress` (`return_progress`) and
`__verbose` (`verbose`, or the server's `--verbose`). Also
`/chat/completions/input_tokens`: the prompt's length."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.sse import stream_answer
from localserve.api.state import SETTINGS
from localserve.engine.backend import Tokenizer
from localserve.engine.types import TokenLogprob
from localserve.serving.answer import Answer
from localserve.serving.chat import count_chat_tokens, render_chat
from localserve.serving.openai.chat import start, whole_and_results
from localserve.serving.openai.convert import chat_request
from localserve.serving.openai.schemas import ChatCompletionRequest
from localserve.serving.openai.wire import AnswerMeta, chat_logprobs, usage
from localserve.serving.timings import answer_timings, prompt_progress
from localserve.serving.types import (
    ChoiceEnd,
    ChoiceResult,
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
    then pieces of `arguments`) and the finish reason becomes `tool_calls`.

    llama-server's debug fields, only when asked (`debug`): `timings` on
    every chunk after the first (`timings_per_token`), and (`return_progress`)
    the first chunk of a choice replaced by two `prompt_progress` chunks: the
    part of the prompt reused from the cache, then the whole prompt done. The
    engine tells no progress between, and tells both at the first token."""

    def __init__(
        self,
        meta: AnswerMeta,
        tokenizer: Tokenizer,
        *,
        num_choices: int,
        include_usage: bool,
        with_logprobs: bool,
        tools: bool = False,
        debug: LlamaDebug | None = None,
    ) -> None:
        self.meta = meta
        self.tokenizer = tokenizer
        self.include_usage = include_usage
        self.with_logprobs = with_logprobs
        self.tools = tools
        self.debug = debug
        self._started: set[int] = set()
        self._usages: list[Usage | None] = [None] * num_choices

    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        out = self._chunks(delta)
        if self.debug is not None:
            self.debug.decorate(delta.index, out)
        return out

    def _chunks(self, delta: Delta) -> list[dict[str, Any]]:
        index = delta.index
        out = []
        if index not in self._started:
            self._started.add(index)
            out.append(self._chunk(index, {"role": "assistant", "content": None}))  # as llama-server: no empty delta
            if self.debug is not None and self.debug.return_progress:
                out.append(self._chunk(index, {"role": "assistant", "content": None}))
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
        if self.debug is not None and self.debug.timings_per_token:
            body["timings"] = answer_timings(self.debug.answer)
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


class LlamaDebug:
    """What a streamed answer adds for llama-server's `timings_per_token` and `return_progress`."""

    def __init__(self, answer: Answer, *, timings_per_token: bool, return_progress: bool) -> None:
        self.answer = answer
        self.timings_per_token = timings_per_token
        self.return_progress = return_progress
        self._seen: set[int] = set()

    def decorate(self, index: int, chunks: list[dict[str, Any]]) -> None:
        first = index not in self._seen
        self._seen.add(index)
        if first and self.return_progress:  # the two chunks ChatChunkFormat put first
            total, cache = self.answer.num_prompt_tokens(index), self.answer.num_cached_tokens(index)
            done_ms = max(0, self.answer.first_token_ns(index) - self.answer.submitted_ns) / 1e6
            chunks[0]["prompt_progress"] = prompt_progress(total=total, cache=cache, processed=cache, time_ms=0.0)
            chunks[1]["prompt_progress"] = prompt_progress(total=total, cache=cache, processed=total, time_ms=done_ms)
        if self.timings_per_token:
            timings = answer_timings(self.answer, index)
            for chunk in chunks[1:] if first and not self.return_progress else chunks:
                chunk["timings"] = timings


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Chat completion, streamed (SSE) or whole; n choices; JSON modes; tools."""
    body = await parse_body(request, ChatCompletionRequest)
    meta, answer = await start(RequestModels(request), body)
    headers = {"X-Request-Id": meta.id}
    if body.stream:
        debug = None
        if body.timings_per_token or body.return_progress:
            debug = LlamaDebug(answer, timings_per_token=body.timings_per_token, return_progress=body.return_progress)
        fmt = ChatChunkFormat(
            meta,
            answer.tokenizer,
            num_choices=answer.num_choices,
            include_usage=body.include_usage,
            with_logprobs=body.logprobs,
            tools=answer.plan is not None,
            debug=debug,
        )
        return await stream_answer(request, answer, fmt, include_usage=body.include_usage, headers=headers)
    verbose = body.verbose if body.verbose is not None else request.app[SETTINGS].verbose
    reply, results = await whole_and_results(meta, answer, body)
    if body.timings_per_token:
        reply["timings"] = answer_timings(answer)
    if verbose:  # the prompt's text: special tokens decode to nothing, so it is rendered again
        _, prompt = await render_chat(RequestModels(request), chat_request(body))
        reply["__verbose"] = verbose_result(answer, results[0], prompt)
    return web.json_response(reply, headers=headers)


async def chat_input_tokens(request: web.Request) -> web.Response:
    """llama-server's `/chat/completions/input_tokens`: the prompt's length, nothing generated."""
    body = await parse_body(request, ChatCompletionRequest)
    return web.json_response({"input_tokens": await count_chat_tokens(RequestModels(request), chat_request(body))})


def verbose_result(answer: Answer, result: ChoiceResult, prompt: str) -> dict[str, Any]:
    """llama-server's `__verbose`: its native result object for the first choice, with the prompt text."""
    stop_type = {"stop": "word" if result.stop_sequence else "eos", "length": "limit"}.get(result.finish_reason, "none")
    return {
        "index": 0,
        "content": result.text,
        "tokens": [],
        "id_slot": -1,
        "stop": True,
        "model": answer.model_id,
        "tokens_predicted": result.usage.num_output_tokens,
        "tokens_evaluated": result.usage.num_prompt_tokens,
        "prompt": prompt,
        "truncated": False,
        "stop_type": stop_type,
        "stopping_word": result.stop_sequence or "",
        "tokens_cached": result.usage.num_cached_tokens,
        "timings": answer_timings(answer),
    }
