"""OpenAI's request bodies (`schemas`) as the serving layer's requests:
chat completions and legacy completions (sampling fields, messages, tools,
`response_format`) and the Responses API (`input` items as messages, `text.format`).

Responses' `input` is a string (one user message) or a list of items:
messages of role user, assistant, system or developer (content a string or
`input_text` / `output_text` parts), `function_call` items (earlier calls of
the model) and `function_call_output` items (their results). `reasoning`
items a client sends back are skipped; `item_reference` is refused (this
server keeps no responses).

The bodies are `schemas`'s; the endpoints and batch lines import them from here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeVar

from localserve.engine.types import SamplingParams, parse_priority
from localserve.errors import InvalidRequestError
from localserve.serving import types as serving
from localserve.serving.openai.schemas import (
    STATELESS,
    ChatCompletionRequest,
    ChatMessage,
    NamedFunction,
    NamedToolChoice,
    ResponseFormat,
    ResponsesRequest,
    SamplingFields,
    TextCompletionRequest,
    ToolChoice,
    ToolDef,
)
from localserve.serving.sampling import REQUEST_DEFAULTS
from localserve.serving.types import ChatRequest, FunctionTool, HistoryCall, Message, Options, OutputFormat, Tools

__all__ = [
    "ChatCompletionRequest",
    "ResponsesRequest",
    "TextCompletionRequest",
    "chat_request",
    "completion_request",
    "input_messages",
    "message",
    "output_format",
    "responses_chat_request",
    "sampling",
    "tools",
]

T = TypeVar("T")

#: OpenAI's legacy completions endpoint defaults to 16 new tokens.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
#: Responses' message roles as chat templates know them ("developer" means "system").
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")


def sampling(fields: SamplingFields) -> SamplingParams:
    """The body's sampling fields; what it leaves out keeps the engine's default."""
    defaults = REQUEST_DEFAULTS
    return SamplingParams(
        temperature=_or(fields.temperature, defaults.temperature),
        top_k=_or(fields.top_k, defaults.top_k),
        top_p=_or(fields.top_p, defaults.top_p),
        min_p=_or(fields.min_p, defaults.min_p),
        typical_p=_or(fields.typical_p, defaults.typical_p),
        repeat_penalty=_or(fields.repeat_penalty, defaults.repeat_penalty),
        presence_penalty=_or(fields.presence_penalty, defaults.presence_penalty),
        frequency_penalty=_or(fields.frequency_penalty, defaults.frequency_penalty),
        seed=fields.seed,
        stop=fields.stop_list,
        ignore_eos=fields.ignore_eos,
        min_tokens=fields.min_tokens,
        logit_bias=tuple(sorted((fields.logit_bias or {}).items())),
        speculative=fields.speculative,
        cache_prompt=fields.cache_prompt,
    )


def message(source: ChatMessage) -> Message:
    """A chat message; OpenAI's newer "developer" role means "system" to templates."""
    data = source.for_template()
    calls = tuple(HistoryCall(call.function.name, call.function.arguments, call.id) for call in source.tool_calls or ())
    return Message(
        data["role"], data["content"], source.name, calls, source.tool_call_id, data.get("reasoning_content", "")
    )


def tools(defs: Sequence[ToolDef] | None, choice: ToolChoice | None, *, parallel: bool) -> Tools | None:
    """`tools` and `tool_choice` (none given: auto)."""
    if not defs:
        return None
    functions = tuple(FunctionTool(d.function.name, d.function.description, d.function.parameters) for d in defs)
    if isinstance(choice, NamedToolChoice):
        return Tools(functions, "named", choice.function.name, parallel)
    return Tools(functions, choice or "auto", None, parallel)


def output_format(response_format: ResponseFormat | None, body: SamplingFields | None = None) -> OutputFormat | None:
    """`response_format` json_object or json_schema, else llama.cpp's
    `json_schema` or `grammar` fields of `body` (the schema allows one);
    None for text."""
    if body is not None and body.json_schema is not None:
        return OutputFormat("json_schema", body.json_schema, param="json_schema", schema_param="json_schema")
    if body is not None and body.grammar is not None:
        return OutputFormat("grammar", param="grammar", schema_param="grammar", text=body.grammar)
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object" and response_format.schema_ is not None:
        return OutputFormat("json_schema", response_format.schema_, schema_param="response_format.schema")
    if response_format.type == "json_object":
        return OutputFormat("json_object")
    assert response_format.json_schema is not None  # checked by the schema
    spec = response_format.json_schema
    return OutputFormat("json_schema", spec.schema_, strict=bool(spec.strict))


def chat_request(body: ChatCompletionRequest) -> ChatRequest:
    """A `/v1/chat/completions` body as a serving request."""
    options = Options(
        sampling=sampling(body),
        max_tokens=body.token_limit,
        num_choices=body.n,
        num_logprobs=body.num_logprobs,
        priority=parse_priority(body.priority),
    )
    messages = [message(m) for m in body.messages]
    last = body.messages[-1]
    if last.role == "assistant" and isinstance(last.content, list) and body.continue_final_message is not False:
        # A continued message's parts are joined as llama-server's continuation writes them.
        texts = [part["text"] for part in last.content if part.get("type") == "text"]
        messages[-1] = dataclasses.replace(messages[-1], content="\n\n".join(texts))
    return ChatRequest(
        body.model,
        tuple(messages),
        options,
        tools=tools(body.tools, body.tool_choice, parallel=body.parallel_tool_calls),
        output=output_format(body.response_format, body),
        think=False if body.reasoning_effort == "none" else None,
        add_generation_prompt=body.add_generation_prompt,
        continue_final=body.continue_final_message,
    )


def completion_request(body: TextCompletionRequest) -> serving.CompletionRequest:
    """A `/v1/completions` body as a serving request."""
    options = Options(
        sampling=sampling(body),
        max_tokens=body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS,
        num_choices=body.n,
        num_logprobs=body.logprobs,
        priority=parse_priority(body.priority),
    )
    prompts = tuple(p if isinstance(p, str) else tuple(p) for p in body.prompts)
    return serving.CompletionRequest(
        body.model, prompts, options, suffix=body.suffix or None, output=output_format(None, body)
    )


# ---- the Responses API -----------------------------------------------------------------


def responses_chat_request(body: ResponsesRequest) -> ChatRequest:
    """A `/v1/responses` body as a serving chat request."""
    messages = [Message("system", body.instructions)] if body.instructions else []
    messages += input_messages(body.input)
    defaults = REQUEST_DEFAULTS
    params = dataclasses.replace(
        defaults,
        temperature=defaults.temperature if body.temperature is None else body.temperature,
        top_p=defaults.top_p if body.top_p is None else body.top_p,
        seed=body.seed,
    )
    options = Options(sampling=params, max_tokens=body.max_output_tokens, priority=parse_priority(body.priority))
    think = False if (body.reasoning or {}).get("effort") == "none" else None
    return ChatRequest(
        body.model,
        tuple(messages),
        options,
        tools=_response_tools(body),
        output=_response_output(body),
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
            out.append(_input_message(item, where))
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


def _input_message(item: dict[str, Any], where: str) -> Message:
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


def _response_tools(body: ResponsesRequest) -> Tools | None:
    if not body.tools:
        return None
    functions = tuple(FunctionTool(t.name, t.description, t.parameters) for t in body.tools)
    choice = body.tool_choice
    if isinstance(choice, NamedFunction):
        return Tools(functions, "named", choice.name, body.parallel_tool_calls)
    return Tools(functions, choice or "auto", None, body.parallel_tool_calls)


def _response_output(body: ResponsesRequest) -> OutputFormat | None:
    fmt = body.text.format if body.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return OutputFormat("json_object", param="text.format", schema_param="text.format.schema")
    return OutputFormat(
        "json_schema", fmt.schema_, param="text.format", schema_param="text.format.schema", strict=bool(fmt.strict)
    )


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
