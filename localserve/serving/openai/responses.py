"""OpenAI's Responses API, whole: the `response` object of an answer (the
endpoint without `stream`, and batch lines) and the items it holds, which
the endpoint's stream of events sends as they grow."""

from __future__ import annotations

import time
import uuid
from typing import Any

from localserve.serving.answer import Answer
from localserve.serving.chat import start_chat
from localserve.serving.models import ModelHost
from localserve.serving.openai.responses_request import ResponsesRequest, chat_request
from localserve.serving.sampling import REQUEST_DEFAULTS
from localserve.serving.types import ChoiceResult, ToolCall, Usage


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
    answer = await start_chat(host, chat_request(body), answer_id=response_id)
    return ResponseBuilder(response_id, answer.model_id, body), answer


async def whole(response: ResponseBuilder, answer: Answer) -> dict[str, Any]:
    """The `response` object, once the answer is complete."""
    async with answer:
        (result,) = await answer.collect()
    return whole_response(response, result)
