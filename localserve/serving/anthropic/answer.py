"""Anthropic's Messages answers as JSON, without HTTP: the whole `message`
object, the streaming events of one answer (`MessageEvents`: event name and
data; `api.anthropic.messages` writes them as SSE) and the error body.
"""

from __future__ import annotations

from typing import Any

from localserve.errors import LocalServeError
from localserve.serving.answer import Answer
from localserve.serving.types import (
    ChoiceEnd,
    ChoiceResult,
    Delta,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(exc: LocalServeError) -> dict[str, Any]:
    kind = ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def tool_use_id(call_id: str) -> str:
    """A call's id as Anthropic spells tool_use ids."""
    return "toolu_" + call_id.removeprefix("call_")


def usage_json(usage: Usage, num_prompt_tokens: int | None = None) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` leaves out what the prefix cache read."""
    prompt = usage.num_prompt_tokens if num_prompt_tokens is None else num_prompt_tokens
    return {
        "input_tokens": prompt - usage.num_cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.num_cached_tokens,
        "output_tokens": usage.num_output_tokens,
    }


def stop_reason(finish_reason: str, *, num_calls: int, stop_sequence: str | None) -> str:
    if finish_reason == "length":
        return "max_tokens"
    if num_calls:
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


def message_json(msg_id: str, model: str, content: list[dict[str, Any]], usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }


def whole_message(answer: Answer, result: ChoiceResult) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if result.reasoning is not None:
        content.append({"type": "thinking", "thinking": result.reasoning, "signature": ""})
    if result.content:
        content.append({"type": "text", "text": result.content})
    content += [
        {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name, "input": call.arguments_object()}
        for call in result.tool_calls
    ]
    message = message_json(answer.id, answer.model_id, content, usage_json(result.usage))
    message["stop_reason"] = stop_reason(
        result.finish_reason, num_calls=len(result.tool_calls), stop_sequence=result.stop_sequence
    )
    message["stop_sequence"] = result.stop_sequence
    return message


class MessageEvents:
    """Anthropic's streaming events of one answer."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.num_blocks = 0
        self.open_block: str | None = None  # "thinking", "text" or "tool_use"

    def opening(self) -> list[Event]:
        usage = usage_json(Usage(), num_prompt_tokens=len(self.answer.prompt_ids[0]))
        message = message_json(self.answer.id, self.answer.model_id, [], usage)
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def events(self, delta: Delta) -> list[Event]:
        if isinstance(delta, TextDelta) and delta.text:
            out = [] if self.open_block == "text" else self._start({"type": "text", "text": ""})
            return [*out, self._delta({"type": "text_delta", "text": delta.text})]
        if isinstance(delta, ReasoningDelta) and delta.text:
            thinking = {"type": "thinking", "thinking": "", "signature": ""}
            out = [] if self.open_block == "thinking" else self._start(thinking)
            return [*out, self._delta({"type": "thinking_delta", "thinking": delta.text})]
        if isinstance(delta, ToolCallStart):
            block = {"type": "tool_use", "id": tool_use_id(delta.call_id), "name": delta.name, "input": {}}
            return self._start(block)
        if isinstance(delta, ToolCallArguments):
            return [self._delta({"type": "input_json_delta", "partial_json": delta.arguments})]
        if isinstance(delta, ToolCallEnd):
            return self._stop()
        if isinstance(delta, ChoiceEnd):
            reason = stop_reason(delta.finish_reason, num_calls=delta.num_tool_calls, stop_sequence=delta.stop_sequence)
            end = {"stop_reason": reason, "stop_sequence": delta.stop_sequence}
            usage = usage_json(delta.usage)
            return [
                *self._stop(),
                ("message_delta", {"type": "message_delta", "delta": end, "usage": usage}),
                ("message_stop", {"type": "message_stop"}),
            ]
        return []

    def _start(self, block: dict[str, Any]) -> list[Event]:
        out = self._stop()
        self.open_block = block["type"]
        event = {"type": "content_block_start", "index": self.num_blocks, "content_block": block}
        return [*out, ("content_block_start", event)]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return "content_block_delta", {"type": "content_block_delta", "index": self.num_blocks, "delta": delta}

    def _stop(self) -> list[Event]:
        if self.open_block is None:
            return []
        event = {"type": "content_block_stop", "index": self.num_blocks}
        self.open_block = None
        self.num_blocks += 1
        return [("content_block_stop", event)]

    def failure(self, exc: LocalServeError) -> list[Event]:
        return [("error", error_body(exc))]
