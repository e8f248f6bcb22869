"""OpenAI's Responses API's answers as JSON: the `response` object of an
answer, whole (the endpoint without `stream`, and batch lines) or as it
grows, the items it holds, and the streaming events (`ResponseEvents`:
event name and data; `api.openai.responses` writes them as SSE)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from localserve.errors import LocalServeError
from localserve.serving.answer import Answer
from localserve.serving.chat import start_chat
from localserve.serving.models import ModelHost
from localserve.serving.openai.request import ResponsesRequest, responses_chat_request
from localserve.serving.sampling import REQUEST_DEFAULTS
from localserve.serving.timings import answer_timings, prompt_progress
from localserve.serving.types import (
    ChoiceEnd,
    ChoiceResult,
    Delta,
    Event,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)


def item_id(prefix: str) -> str:
    """`resp_...`, `msg_...`, `fc_...` as OpenAI spells them."""
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseBuilder:
    """The `response` object of one answer, as it grows (streaming) or whole."""

    def __init__(self, response_id: str, model: str, body: ResponsesRequest) -> None:
        self.id = response_id
        self.model = model
        self.body = body
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.usage: Usage | None = None
        self.status = "in_progress"

    def finish(self, finish_reason: str, usage: Usage) -> None:
        """Completed, or incomplete when the token limit cut the answer."""
        self.usage = usage
        self.status = "incomplete" if finish_reason == "length" else "completed"

    def to_json(self, error: dict[str, Any] | None = None) -> dict[str, Any]:
        body = self.body
        tool_choice = body.tool_choice or "auto"
        fmt = body.text.format.model_dump(by_alias=True, exclude_none=True) if body.text else {"type": "text"}
        defaults = REQUEST_DEFAULTS
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if self.status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.model,
            "output": self.output,
            "output_text": output_text(self.output),
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": defaults.temperature if body.temperature is None else body.temperature,
            "text": {"format": fmt},
            "tool_choice": tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(),
            "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or ()],
            "top_p": defaults.top_p if body.top_p is None else body.top_p,
            "truncation": "disabled",
            "usage": _usage(self.usage) if self.usage is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
        }


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.num_prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.num_cached_tokens},
        "output_tokens": usage.num_output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.num_prompt_tokens + usage.num_output_tokens,
    }


def output_text(output: list[dict[str, Any]]) -> str:
    """The text of every `output_text` part (what the SDK's `output_text` gives)."""
    parts = (part for item in output if item["type"] == "message" for part in item["content"])
    return "".join(part["text"] for part in parts if part["type"] == "output_text")


def message_item(msg_id: str, content: list[dict[str, Any]], status: str = "completed") -> dict[str, Any]:
    return {"id": msg_id, "type": "message", "status": status, "role": "assistant", "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(fc_id: str, call: ToolCall, status: str = "completed") -> dict[str, Any]:
    fields = {"call_id": call.id, "name": call.name, "arguments": call.arguments}
    return {"id": fc_id, "type": "function_call", "status": status, **fields}


def reasoning_item(rs_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    """A model's thinking (serving/reasoning.py) as a `reasoning` item."""
    content = [{"type": "reasoning_text", "text": text}]
    return {"id": rs_id, "type": "reasoning", "status": status, "summary": [], "content": content}


def whole_response(response: ResponseBuilder, result: ChoiceResult) -> dict[str, Any]:
    """A whole answer: the reasoning (for a reasoning model), a message with
    the text (if any, or if there is no call), then one `function_call` item
    per call."""
    if result.reasoning is not None:
        response.output.append(reasoning_item(item_id("rs"), result.reasoning))
    if result.content or not result.tool_calls:
        response.output.append(message_item(item_id("msg"), [text_part(result.content or "")]))
    response.output += [call_item(item_id("fc"), call) for call in result.tool_calls]
    response.finish(result.finish_reason, result.usage)
    return response.to_json()


async def start(host: ModelHost, body: ResponsesRequest) -> tuple[ResponseBuilder, Answer]:
    """Queue the answer to `body` (the endpoint and batch lines)."""
    response_id = item_id("resp")
    answer = await start_chat(host, responses_chat_request(body), answer_id=response_id)
    return ResponseBuilder(response_id, answer.model_id, body), answer


async def whole(response: ResponseBuilder, answer: Answer) -> dict[str, Any]:
    """The `response` object, once the answer is complete."""
    async with answer:
        (result,) = await answer.collect()
    return whole_response(response, result)


class ResponseEvents:
    """The streaming events of one answer, numbered from 0. With `answer`,
    llama-server's extras as the request asks: `timings` on every event
    (`timings_per_token`), and before the first output two
    `response.in_progress` events with `prompt_progress` (`return_progress`:
    the prompt's cached part, then all of it, as chat streams them)."""

    def __init__(
        self, response: ResponseBuilder, answer: Answer | None = None, body: ResponsesRequest | None = None
    ) -> None:
        self.response = response
        self.answer = answer
        self.timings_per_token = bool(body and body.timings_per_token)
        self.return_progress = bool(body and body.return_progress)
        self.sequence_number = 0
        self.message: dict[str, Any] | None = None  # the message item being written
        self.text = ""
        self.thinking: dict[str, Any] | None = None  # the reasoning item being written
        self.calls: dict[int, dict[str, Any]] = {}  # call index -> its item, while open

    def _event(self, kind: str, **fields: Any) -> Event:
        payload = {"type": kind, **fields, "sequence_number": self.sequence_number}
        self.sequence_number += 1
        return kind, payload

    def opening(self) -> list[Event]:
        state = self.response.to_json()
        return [self._event("response.created", response=state), self._event("response.in_progress", response=state)]

    def events(self, delta: Delta) -> list[Event]:
        if self.answer is None or not (self.timings_per_token or self.return_progress):
            return self._events(delta)
        out = self._progress() if self.return_progress else []
        out += self._events(delta)
        if self.timings_per_token:
            timings = answer_timings(self.answer, delta.index)
            for _, payload in out:
                payload["timings"] = timings
        return out

    def _progress(self) -> list[Event]:
        """The two progress events, once, before the first output."""
        assert self.answer is not None
        self.return_progress = False
        answer = self.answer
        total, cache = answer.num_prompt_tokens(0), answer.num_cached_tokens(0)
        done_ms = max(0, answer.first_token_ns(0) - answer.submitted_ns) / 1e6
        state = self.response.to_json()
        return [
            self._event("response.in_progress", response=state, prompt_progress=progress)
            for progress in (
                prompt_progress(total=total, cache=cache, processed=cache, time_ms=0.0),
                prompt_progress(total=total, cache=cache, processed=total, time_ms=done_ms),
            )
        ]

    def _events(self, delta: Delta) -> list[Event]:
        if isinstance(delta, ReasoningDelta):
            return self._reasoning(delta.text) if delta.text else []
        if isinstance(delta, TextDelta):
            return [*self._close_reasoning(), *self._text(delta.text)] if delta.text else []
        if isinstance(delta, ToolCallStart):
            call = call_item(item_id("fc"), ToolCall(delta.call_id, delta.name, ""), status="in_progress")
            self.calls[delta.call_index] = call
            return [*self._close_reasoning(), *self._close_message(), self._added(call)]
        if isinstance(delta, ToolCallArguments):
            call = self.calls[delta.call_index]
            call["arguments"] += delta.arguments
            index = self.response.output.index(call)
            return [self._event("response.function_call_arguments.delta", item_id=call["id"], output_index=index, delta=delta.arguments)]  # fmt: skip
        if isinstance(delta, ToolCallEnd):
            return self._close_call(delta.call_index, "completed")
        if isinstance(delta, ChoiceEnd):
            return self._end(delta)
        return []

    def _added(self, item: dict[str, Any]) -> Event:
        self.response.output.append(item)
        return self._event("response.output_item.added", output_index=len(self.response.output) - 1, item=dict(item))

    def _reasoning(self, text: str) -> list[Event]:
        out = []
        if self.thinking is None:
            self.thinking = reasoning_item(item_id("rs"), "", status="in_progress")
            out.append(self._added(self.thinking))
        part = self.thinking["content"][0]
        part["text"] += text
        index = self.response.output.index(self.thinking)
        fields = {"item_id": self.thinking["id"], "output_index": index, "content_index": 0}
        out.append(self._event("response.reasoning_text.delta", **fields, delta=text))
        return out

    def _close_reasoning(self) -> list[Event]:
        if self.thinking is None:
            return []
        item, self.thinking = self.thinking, None
        item["status"] = "completed"
        index = self.response.output.index(item)
        fields = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            self._event("response.reasoning_text.done", **fields, text=item["content"][0]["text"]),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def _text(self, text: str) -> list[Event]:
        out = []
        if self.message is None:
            self.message = message_item(item_id("msg"), [], status="in_progress")
            out.append(self._added(self.message))
            out.append(self._part_event("response.content_part.added", text_part("")))
        self.text += text
        out.append(self._text_event("response.output_text.delta", delta=text, logprobs=[]))
        return out

    def _text_event(self, kind: str, **fields: Any) -> Event:
        assert self.message is not None
        index = self.response.output.index(self.message)
        return self._event(kind, item_id=self.message["id"], output_index=index, content_index=0, **fields)

    def _part_event(self, kind: str, part: dict[str, Any]) -> Event:
        return self._text_event(kind, part=part)

    def _close_message(self, status: str = "completed") -> list[Event]:
        if self.message is None:
            return []
        message, part = self.message, text_part(self.text)
        out = [
            self._text_event("response.output_text.done", text=self.text, logprobs=[]),
            self._part_event("response.content_part.done", part),
        ]
        message["content"], message["status"] = [part], status
        out.append(self._event("response.output_item.done", output_index=self.response.output.index(message), item=message))  # fmt: skip
        self.message = None
        return out

    def _close_call(self, call_index: int, status: str) -> list[Event]:
        call = self.calls.pop(call_index)
        call["status"] = status
        index = self.response.output.index(call)
        return [
            self._event(
                "response.function_call_arguments.done",
                item_id=call["id"],
                output_index=index,
                arguments=call["arguments"],
            ),  # fmt: skip
            self._event("response.output_item.done", output_index=index, item=call),
        ]

    def _end(self, end: ChoiceEnd) -> list[Event]:
        status = "incomplete" if end.finish_reason == "length" else "completed"
        out = self._close_reasoning()
        if not any(item["type"] != "reasoning" for item in self.response.output):
            out += self._text("")  # an empty answer is still one message
        out += self._close_message(status)
        for call_index in list(self.calls):  # a call the token limit cut short
            out += self._close_call(call_index, "incomplete")
        self.response.finish(end.finish_reason, end.usage)
        kind = "response.incomplete" if self.response.status == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=self.response.to_json())]

    def failure(self, exc: LocalServeError) -> list[Event]:
        self.response.status = "failed"
        error = {"code": exc.code or exc.type, "message": exc.message}
        return [
            self._event("error", code=exc.code or exc.type, message=exc.message, param=exc.param),
            self._event("response.failed", response=self.response.to_json(error)),
        ]
