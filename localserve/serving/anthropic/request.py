"""The request of Anthropic's Messages API: the body of `/v1/messages` (and
of `/v1/messages/count_tokens`), and its turns as the serving layer's
messages.

Content is a string or a list of blocks: `text`, `tool_use` (an earlier call
of the model: `id`, `name`, `input`) and `tool_result` (its result:
`tool_use_id`, `content`, `is_error`). The `thinking` blocks of an
assistant turn are its reasoning (the template decides whether it shows:
Qwen3's keep it in a tool-calling loop, as Anthropic's API does);
`redacted_thinking` is skipped; images and documents are refused (the
models here read text).
`thinking` `{"type": "disabled"}` closes a reasoning model's think section
in the prompt; `{"type": "enabled", "budget_tokens": N}` caps it at N tokens;
either way its thinking comes back in `thinking` blocks.
`metadata` and `service_tier` are accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from localserve.engine.types import parse_priority
from localserve.errors import InvalidRequestError
from localserve.serving.openai.schemas import FUNCTION_NAME, MAX_STOP, MAX_TOOLS, Priority
from localserve.serving.sampling import REQUEST_DEFAULTS
from localserve.serving.types import ChatRequest, FunctionTool, HistoryCall, Message, Options, Tools

SKIPPED_BLOCKS = ("thinking", "redacted_thinking")  # but an assistant turn's thinking is its reasoning


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ToolParam(_Model):
    """A client tool: `input_schema` is the JSON schema of its input."""

    type: Literal["custom"] | None = None  # server tools (web search, ...) are not tools of this server
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolChoiceParam(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _named(self) -> ToolChoiceParam:
        if self.type == "tool" and not self.name:
            raise ValueError("a tool_choice of type 'tool' needs the tool's 'name'")
        return self


class MessageParam(_Model):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(_Model):
    """Body of `POST /v1/messages/count_tokens`: a request without `max_tokens`."""

    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolParam] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoiceParam | None = None

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, value: list[ToolParam] | None) -> list[ToolParam] | None:
        names = [tool.name for tool in value or ()]
        if len(set(names)) != len(names):
            raise ValueError("every tool needs its own name")
        return value

    @model_validator(mode="after")
    def _choice_fits(self) -> CountTokensRequest:
        names = [tool.name for tool in self.tools or ()]
        choice = self.tool_choice
        if choice is not None and choice.type == "any" and not names:
            raise InvalidRequestError("tool_choice 'any' needs at least one entry in 'tools'", param="tool_choice")
        if choice is not None and choice.type == "tool" and choice.name not in names:
            raise InvalidRequestError(f"the tool {choice.name!r} is not in 'tools'", param="tool_choice.name")
        return self


class MessagesRequest(CountTokensRequest):
    """Body of `POST /v1/messages`."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_STOP)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None  # {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}
    priority: Priority = None  # this server's extension


def chat_request(body: CountTokensRequest) -> ChatRequest:
    """The body as a serving chat request (sampling only from `MessagesRequest`)."""
    messages = [Message("system", system_text(body.system))] if body.system else []
    messages += turns(body.messages)
    options = Options()
    think, budget = None, None
    if isinstance(body, MessagesRequest):
        thinking = body.thinking or {}
        think = False if thinking.get("type") == "disabled" else None
        if thinking.get("type") == "enabled" and isinstance(thinking.get("budget_tokens"), int):
            budget = max(0, thinking["budget_tokens"])
        defaults = REQUEST_DEFAULTS
        sampling = dataclasses.replace(
            defaults,
            temperature=defaults.temperature if body.temperature is None else body.temperature,
            top_p=defaults.top_p if body.top_p is None else body.top_p,
            top_k=defaults.top_k if body.top_k is None else body.top_k,
            stop=tuple(s for s in body.stop_sequences or () if s),
        )
        options = Options(sampling=sampling, max_tokens=body.max_tokens, priority=parse_priority(body.priority))
    return ChatRequest(body.model, tuple(messages), options, tools=_tools(body), think=think, reasoning_budget=budget)


def system_text(system: str | list[dict[str, Any]] | None) -> str:
    if isinstance(system, str) or system is None:
        return system or ""
    return "\n\n".join(_text_blocks(system, "system"))


def turns(messages: list[MessageParam]) -> list[Message]:
    """The turns as messages: an assistant turn's `tool_use` blocks become its
    tool calls; a user turn's `tool_result` blocks, tool messages before its text."""
    out: list[Message] = []
    names: dict[str, str] = {}  # tool_use id -> tool name, for the results
    for index, turn in enumerate(messages):
        where = f"messages[{index}].content"
        if isinstance(turn.content, str):
            out.append(Message(turn.role, turn.content))
            continue
        texts: list[str] = []
        thoughts: list[str] = []
        calls: list[HistoryCall] = []
        for number, block in enumerate(turn.content):
            kind = block.get("type") if isinstance(block, dict) else None
            place = f"{where}[{number}]"
            if kind == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif kind == "thinking" and turn.role == "assistant" and isinstance(block.get("thinking"), str):
                thoughts.append(block["thinking"])
            elif kind == "tool_use" and turn.role == "assistant":
                call = HistoryCall(_field(block, "name", place), _input(block, place), _field(block, "id", place))
                names[call.id or ""] = call.name
                calls.append(call)
            elif kind == "tool_result" and turn.role == "user":
                out.append(_tool_result(block, place, names))
            elif kind not in SKIPPED_BLOCKS:
                raise InvalidRequestError(
                    f"content blocks of type {kind!r} are not supported here: this server's models read text "
                    "(text, tool_use and tool_result blocks)",
                    param=place,
                )
        if texts or calls or thoughts or not out or out[-1].role != "tool":
            out.append(Message(turn.role, "".join(texts), tool_calls=tuple(calls), reasoning="\n\n".join(thoughts)))
    return out


def _tool_result(block: dict[str, Any], place: str, names: dict[str, str]) -> Message:
    tool_use_id = _field(block, "tool_use_id", place)
    content = block.get("content", "")
    text = content if isinstance(content, str) else "".join(_text_blocks(content, f"{place}.content"))
    if block.get("is_error"):
        text = f"Error: {text}"
    return Message("tool", text, name=names.get(tool_use_id), tool_call_id=tool_use_id)


def _text_blocks(blocks: Any, where: str) -> list[str]:
    if not isinstance(blocks, list):
        raise InvalidRequestError("expected a string or a list of text blocks", param=where)
    texts = []
    for index, block in enumerate(blocks):
        if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
            raise InvalidRequestError("only text blocks are supported here", param=f"{where}[{index}]")
        texts.append(block["text"])
    return texts


def _field(block: dict[str, Any], name: str, place: str) -> str:
    value = block.get(name)
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"Missing required parameter: '{place}.{name}' (a string).", param=f"{place}.{name}")
    return value


def _input(block: dict[str, Any], place: str) -> dict[str, Any]:
    value = block.get("input", {})
    if not isinstance(value, dict):
        raise InvalidRequestError("a tool_use block's input must be an object", param=f"{place}.input")
    return value


def _tools(body: CountTokensRequest) -> Tools | None:
    choice = body.tool_choice
    if not body.tools:
        return None
    functions = tuple(FunctionTool(t.name, t.description, t.input_schema) for t in body.tools)
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    if choice is None or choice.type == "auto":
        return Tools(functions, "auto", None, parallel)
    if choice.type == "any":
        return Tools(functions, "required", None, parallel)
    if choice.type == "tool":
        return Tools(functions, "named", choice.name, parallel)
    return Tools(functions, "none", None, parallel)
