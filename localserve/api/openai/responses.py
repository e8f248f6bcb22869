"""`POST /v1/responses`: OpenAI's Responses API, stateless, over
`serving.chat` (tools and `text.format` enforced by the same grammars as
chat completions).

Whole, the answer is a `response` object: `output` holds a `message` item
with the text (`output_text`), then a `function_call` item per call;
`status` is `completed`, or `incomplete` with `incomplete_details.reason:
"max_output_tokens"` when the token limit cut it. Streamed (`stream: true`)
it is OpenAI's event sequence, each event numbered by `sequence_number`:
`response.created`, `response.in_progress`, then per item
`response.output_item.added`, (`response.content_part.added`,
`response.output_text.delta`..., `response.output_text.done`,
`response.content_part.done`) or (`response.function_call_arguments.delta`...,
`response.function_call_arguments.done`), `response.output_item.done`, and
last `response.completed` or `response.incomplete`. A failure after the
first event is an `error` event followed by `response.failed`. The
`response` object and the whole answer are `serving.openai.responses`'s (a
batch line's too); the events are here.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from localserve.api.doc_models import ResponseObject
from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.routes import API_PREFIXES, Route, add_routes
from localserve.api.sse import Event, stream_events
from localserve.errors import LocalServeError
from localserve.serving.answer import Answer
from localserve.serving.openai.responses import (
    ResponseBuilder,
    call_item,
    item_id,
    message_item,
    reasoning_item,
    start,
    text_part,
    whole,
)
from localserve.serving.openai.responses_request import ResponsesRequest
from localserve.serving.timings import answer_timings, prompt_progress
from localserve.serving.types import (
    ChoiceEnd,
    Delta,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
)


def register(app: web.Application) -> None:
    for prefix in (*API_PREFIXES, ""):  # "": llama-server's unprefixed route
        add_routes(app, Route("POST", f"{prefix}/responses", create_response, ResponsesRequest, ResponseObject))


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


async def create_response(request: web.Request) -> web.StreamResponse:
    """A model response (stateless): whole, or streamed as events."""
    body = await parse_body(request, ResponsesRequest)
    response, answer = await start(RequestModels(request), body)
    headers = {"X-Request-Id": response.id}
    if not body.stream:
        return web.json_response(await whole(response, answer), headers=headers)
    return await stream_events(request, answer, ResponseEvents(response, answer, body), headers=headers)
