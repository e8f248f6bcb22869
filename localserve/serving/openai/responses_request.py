"""The request of OpenAI's Responses API (stateless): the body, and its
`input` items as the serving layer's messages.

`input` is a string (one user message) or a list of items: messages of role
user, assistant, system or developer (content a string or `input_text` /
`output_text` parts), `function_call` items (earlier calls of the model) and
`function_call_output` items (their results). `reasoning` items a client
sends back are skipped. Server-side state (`previous_response_id`,
`store: true`, `conversation`, `background`, `item_reference`) is refused
with a 400: this server keeps no responses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from localserve.engine.types import parse_priority
from localserve.errors import InvalidRequestError
from localserve.serving.openai.schemas import FUNCTION_NAME, MAX_TOOLS, Priority
from localserve.serving.sampling import REQUEST_DEFAULTS
from localserve.serving.types import ChatRequest, FunctionTool, HistoryCall, Message, Options, OutputFormat, Tools
from localserve.serving.validation import check_unicode

STATELESS = (
    "this server is stateless: it keeps no responses or conversations, so {what} cannot be used; "
    "send the whole conversation in 'input' (with 'store': false or left out)"
)
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionToolDef(_Model):
    type: Literal["function"]
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Model):
    type: Literal["function"]
    name: str


class TextFormat(_Model):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a format of type 'json_schema' needs a 'schema'")
        return self


class TextConfig(_Model):
    format: TextFormat = Field(default_factory=TextFormat)


class ResponsesRequest(_Model):
    """Body of `POST /v1/responses`."""

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        # Over HTTP parse_body has checked already; a Batch API line is validated here alone.
        check_unicode(data)
        return data

    model: str = ""  # "": the only chat model this server runs (serving/models.py)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    tools: list[FunctionToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    stream: bool = False
    # llama-server's streamed extras: `timings` on every event, and `prompt_progress` events
    timings_per_token: bool = False
    return_progress: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    seed: int | None = None  # an extension, as on chat completions
    priority: Priority = None  # this server's extension
    reasoning: dict[str, Any] | None = None  # {"effort": "none"} closes a reasoning model's think section

    @model_validator(mode="after")
    def _stateless(self) -> ResponsesRequest:
        for field, what in (
            ("previous_response_id", "previous_response_id"),
            ("conversation", "conversation"),
        ):
            if getattr(self, field):
                raise InvalidRequestError(STATELESS.format(what=what), param=field)
        if self.store:
            raise InvalidRequestError(STATELESS.format(what="'store': true"), param="store")
        if self.background:
            raise InvalidRequestError(STATELESS.format(what="'background': true"), param="background")
        return self

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, value: list[FunctionToolDef] | None) -> list[FunctionToolDef] | None:
        names = [tool.name for tool in value or ()]
        if len(set(names)) != len(names):
            raise ValueError("every function needs its own name")
        return value

    @model_validator(mode="after")
    def _named_tool_exists(self) -> ResponsesRequest:
        names = [tool.name for tool in self.tools or ()]
        if self.tool_choice == "required" and not names:
            raise InvalidRequestError("tool_choice 'required' needs at least one entry in 'tools'", param="tool_choice")
        if isinstance(self.tool_choice, NamedFunction) and self.tool_choice.name not in names:
            raise InvalidRequestError(f"the function {self.tool_choice.name!r} is not in 'tools'", param="tool_choice")
        return self


# ---- request -> serving ----------------------------------------------------------------


def chat_request(body: ResponsesRequest) -> ChatRequest:
    """The body as a serving chat request."""
    messages = [Message("system", body.instructions)] if body.instructions else []
    messages += input_messages(body.input)
    defaults = REQUEST_DEFAULTS
    sampling = dataclasses.replace(
        defaults,
        temperature=defaults.temperature if body.temperature is None else body.temperature,
        top_p=defaults.top_p if body.top_p is None else body.top_p,
        seed=body.seed,
    )
    options = Options(sampling=sampling, max_tokens=body.max_output_tokens, priority=parse_priority(body.priority))
    think = False if (body.reasoning or {}).get("effort") == "none" else None
    return ChatRequest(
        body.model,
        tuple(messages),
        options,
        tools=_tools(body),
        output=_output(body),
        prompt_param="input",
        think=think,
    )


def input_messages(items: str | list[dict[str, Any]]) -> list[Message]:
    """`input` as messages: function calls join the assistant turn before
    them, their outputs become tool messages."""
    if isinstance(items, str):
        return [Message("user", items)]
    out: list[Message] = []
    names: dict[str, str] = {}  # call_id -> function name, for the results
    for index, item in enumerate(items):
        where = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            out.append(_message(item, where))
        elif kind == "function_call":
            call = HistoryCall(_str(item, "name", where), _str(item, "arguments", where), _str(item, "call_id", where))
            names[call.id or ""] = call.name
            if out and out[-1].role == "assistant":
                last = out.pop()
                out.append(Message("assistant", last.content, tool_calls=(*last.tool_calls, call)))
            else:
                out.append(Message("assistant", "", tool_calls=(call,)))
        elif kind == "function_call_output":
            call_id = _str(item, "call_id", where)
            output = _content_text(item.get("output"), f"{where}.output")
            out.append(Message("tool", output, name=names.get(call_id), tool_call_id=call_id))
        elif kind == "reasoning":
            continue  # a client's copy of earlier reasoning: templates drop it from the history too
        elif kind == "item_reference":
            raise InvalidRequestError(STATELESS.format(what="item references"), param=where)
        else:
            raise InvalidRequestError(
                f"input items of type {kind!r} are not supported; send message, function_call and "
                "function_call_output items",
                param=f"{where}.type",
            )
    if not out:
        raise InvalidRequestError("input has no message", param="input")
    return out


def _message(item: dict[str, Any], where: str) -> Message:
    role = item.get("role")
    if role not in ROLES:
        raise InvalidRequestError(f"role must be one of {', '.join(ROLES)}; got {role!r}", param=f"{where}.role")
    return Message(ROLES[role], _content_text(item.get("content"), f"{where}.content"))  # type: ignore[arg-type]


def _content_text(content: Any, where: str) -> str:
    """A string, or the text of `input_text` / `output_text` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError("content must be a string or a list of text parts", param=where)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        else:
            raise InvalidRequestError(
                f"content parts of type {kind!r} are not supported: this server's models read text only",
                param=f"{where}[{index}]",
            )
    return "".join(texts)


def _str(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise InvalidRequestError(f"Missing required parameter: '{where}.{name}' (a string).", param=f"{where}.{name}")
    return value


def _tools(body: ResponsesRequest) -> Tools | None:
    if not body.tools:
        return None
    functions = tuple(FunctionTool(t.name, t.description, t.parameters) for t in body.tools)
    choice = body.tool_choice
    if isinstance(choice, NamedFunction):
        return Tools(functions, "named", choice.name, body.parallel_tool_calls)
    return Tools(functions, choice or "auto", None, body.parallel_tool_calls)


def _output(body: ResponsesRequest) -> OutputFormat | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return OutputFormat("json_object", param="text.format", schema_param="text.format.schema")
    return OutputFormat(
        "json_schema", fmt.schema_, param="text.format", schema_param="text.format.schema", strict=bool(fmt.strict)
    )
