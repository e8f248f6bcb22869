"""OpenAI request bodies (api.schemas) as the serving layer's requests:
sampling fields, messages, tools and `response_format`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

from localserve.engine.types import SamplingParams, parse_priority
from localserve.serving import types as serving
from localserve.serving.openai.schemas import (
    ChatCompletionRequest,
    ChatMessage,
    NamedToolChoice,
    ResponseFormat,
    SamplingFields,
    TextCompletionRequest,
    ToolChoice,
    ToolDef,
)
from localserve.serving.sampling import REQUEST_DEFAULTS
from localserve.serving.types import ChatRequest, FunctionTool, HistoryCall, Message, Options, OutputFormat, Tools

T = TypeVar("T")

#: OpenAI's legacy completions endpoint defaults to 16 new tokens.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


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
    )


def message(source: ChatMessage) -> Message:
    """A chat message; OpenAI's newer "developer" role means "system" to templates."""
    data = source.for_template()
    calls = tuple(HistoryCall(call.function.name, call.function.arguments, call.id) for call in source.tool_calls or ())
    return Message(data["role"], data["content"], source.name, calls, source.tool_call_id)


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


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
