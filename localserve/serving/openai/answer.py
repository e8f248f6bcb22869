"""OpenAI's answers as JSON, built from the serving layer's results and
deltas: the whole `chat.completion` and `text_completion` objects, their
streamed chunks (`ChatChunkFormat`, `CompletionChunkFormat`; `api/sse.py`
writes them), usage, both log-probability formats (chat and legacy), and
llama-server's extras on chat (`LlamaDebug`: `timings`, `prompt_progress`;
`verbose_result`: `__verbose`). The Responses API's objects and events are
`responses`'s."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localserve import __version__
from localserve.engine.backend import Tokenizer
from localserve.engine.types import TokenLogprob
from localserve.serving.answer import Answer
from localserve.serving.timings import answer_timings, prompt_progress
from localserve.serving.types import (
    ChoiceEnd,
    ChoiceResult,
    Delta,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    Usage,
)

SYSTEM_FINGERPRINT = f"fp_localserve_{__version__}"

JsonDict = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class AnswerMeta:
    """What every object of one answer repeats."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def header(self, obj: str) -> JsonDict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }


def usage(usages: Sequence[Usage | None], num_choices_per_prompt: int) -> JsonDict:
    """OpenAI usage: each prompt counted once however many choices it has;
    completion tokens summed over all choices. Drafts of speculative decoding
    go where OpenAI reports predicted-output tokens."""
    prompt = cached = completion = drafted = accepted = 0
    for index, counts in enumerate(usages):
        if counts is None:
            continue
        completion += counts.num_output_tokens
        drafted += counts.num_draft_tokens
        accepted += counts.num_accepted_tokens
        if index % num_choices_per_prompt == 0:
            prompt += counts.num_prompt_tokens
            cached += counts.num_cached_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        },
    }


# ---- log-probabilities -----------------------------------------------------------


def _token(tokenizer: Tokenizer, token_id: int, logprob: float) -> JsonDict:
    raw = tokenizer.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob]) -> JsonDict:
    """`choices[].logprobs` of chat completions."""
    content = []
    for lp in logprobs:
        entry = _token(tokenizer, lp.token_id, lp.logprob)
        entry["top_logprobs"] = [_token(tokenizer, t, v) for t, v in lp.top]
        content.append(entry)
    return {"content": content, "refusal": None}


def legacy_logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob], text_offset: int) -> tuple[JsonDict, int]:
    """`choices[].logprobs` of legacy completions, with character offsets
    starting at `text_offset`; also returns the offset after the last token."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = tokenizer.token_text(lp.token_id)
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        tops.append({tokenizer.token_text(t): v for t, v in lp.top})
        offsets.append(text_offset)
        text_offset += len(text)
    out = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
    return out, text_offset


# ---- whole answers -----------------------------------------------------------------


def chat_completion(
    meta: AnswerMeta, results: Sequence[ChoiceResult], tokenizer: Tokenizer, *, with_logprobs: bool
) -> JsonDict:
    """A `chat.completion` object; replies that are tool calls become
    `message.tool_calls` with finish reason `tool_calls`."""
    choices = []
    for result in results:
        message: JsonDict = {"role": "assistant", "content": result.content, "refusal": None}
        if result.reasoning is not None:
            message["reasoning_content"] = result.reasoning
        finish_reason = result.finish_reason
        if result.tool_calls:
            message["tool_calls"] = [tool_call(call) for call in result.tool_calls]
            finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
        choices.append(
            {
                "index": result.index,
                "message": message,
                "logprobs": chat_logprobs(tokenizer, result.logprobs) if with_logprobs else None,
                "finish_reason": finish_reason,
            }
        )
    body = meta.header("chat.completion")
    body["choices"] = choices
    body["usage"] = usage([r.usage for r in results], len(results))
    return body


def tool_call(call: ToolCall) -> JsonDict:
    """A tool call as `message.tool_calls` lists it."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def text_completion(
    meta: AnswerMeta,
    results: Sequence[ChoiceResult],
    tokenizer: Tokenizer,
    *,
    echoes: Sequence[str],
    num_choices_per_prompt: int,
    with_logprobs: bool,
) -> JsonDict:
    """A `text_completion` object; `echoes[i]` is prepended to choice i."""
    choices = []
    for index, result in enumerate(results):
        logprobs = None
        if with_logprobs:
            logprobs, _ = legacy_logprobs(tokenizer, result.logprobs, len(echoes[index]))
        choices.append(
            {
                "text": echoes[index] + result.text,
                "index": index,
                "logprobs": logprobs,
                "finish_reason": result.finish_reason,
            }
        )
    body = meta.header("text_completion")
    body["choices"] = choices
    body["usage"] = usage([r.usage for r in results], num_choices_per_prompt)
    return body


# ---- streamed chunks ---------------------------------------------------------------


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


class CompletionChunkFormat:
    """`text_completion` chunks: the echoed prompt first (with `echo`), text
    deltas, a last chunk with the finish reason, then the usage chunk."""

    def __init__(
        self,
        meta: AnswerMeta,
        tokenizer: Tokenizer,
        *,
        echoes: Sequence[str],
        num_choices_per_prompt: int,
        include_usage: bool,
        with_logprobs: bool,
    ) -> None:
        self.meta = meta
        self.tokenizer = tokenizer
        self.echoes = echoes
        self.num_choices_per_prompt = num_choices_per_prompt
        self.include_usage = include_usage
        self.with_logprobs = with_logprobs
        self._offsets: dict[int, int] = {}  # text offset per choice, for logprobs
        self._usages: list[Usage | None] = [None] * len(echoes)

    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        index = delta.index
        out = []
        if index not in self._offsets:
            self._offsets[index] = len(self.echoes[index])
            if self.echoes[index]:
                out.append(self._chunk(index, self.echoes[index]))
        if isinstance(delta, TextDelta):
            logprobs = None
            if self.with_logprobs:
                logprobs, self._offsets[index] = legacy_logprobs(self.tokenizer, delta.logprobs, self._offsets[index])
            out.append(self._chunk(index, delta.text, logprobs=logprobs))
        elif isinstance(delta, ChoiceEnd):
            self._usages[index] = delta.usage
            out.append(self._chunk(index, "", finish_reason=delta.finish_reason))
        return out

    def usage_chunk(self) -> dict[str, Any]:
        body = self.meta.header("text_completion")
        body["choices"] = []
        body["usage"] = usage(self._usages, self.num_choices_per_prompt)
        return body

    def _chunk(
        self, index: int, text: str, *, logprobs: dict[str, Any] | None = None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        body = self.meta.header("text_completion")
        body["choices"] = [{"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}]
        if self.include_usage:
            body["usage"] = None
        return body


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
