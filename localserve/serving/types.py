"""What goes into the serving layer and what comes out: plain dataclasses,
shared by every dialect (OpenAI, Ollama, llama.cpp infill, Responses,
Anthropic Messages) and every entry point that is not HTTP (the batch
runner, `localserve batch run`, Ray replicas, `localserve run`).

Adapters turn their wire shapes into these requests, and the answers'
deltas and results back into theirs; no untyped dict crosses the layer
(a JSON schema, being JSON, stays one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from localserve.engine.types import PRIORITY_ALIASES, SamplingParams, TokenLogprob
from localserve.errors import LocalServeError

# ---- requests --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryCall:
    """A tool call of an earlier assistant turn: `arguments` as the client
    sent them (OpenAI: JSON text; Ollama, Anthropic: an object)."""

    name: str
    arguments: str | dict[str, Any] = "{}"
    id: str | None = None

    def for_template(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True, slots=True)
class Message:
    """One turn of a conversation. Roles are the chat templates' own:
    system, user, assistant and tool (a tool's result). `reasoning`: an
    earlier assistant turn's thinking as the client sent it back; templates
    get it as `reasoning_content` (llama-server's name) and decide whether
    it is rendered (Qwen3's keep it for the turns after the last user
    message, as in a tool-calling loop)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    name: str | None = None  # the author, or for a tool result the tool's name
    tool_calls: tuple[HistoryCall, ...] = ()  # assistant turns
    tool_call_id: str | None = None  # tool results
    reasoning: str = ""  # assistant turns

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.for_template() for call in self.tool_calls]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning:
            message["reasoning_content"] = self.reasoning
        return message


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """A function the model may call; `parameters` is its JSON schema."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # none: no arguments


@dataclass(frozen=True, slots=True)
class Tools:
    """The tools of a request and how they may be used: `choice` is auto
    (calls or text), required (one or more calls), none (no calls), or
    named (a call of the function `name`)."""

    functions: tuple[FunctionTool, ...]
    choice: Literal["auto", "required", "none", "named"] = "auto"
    name: str | None = None  # with choice "named"
    parallel: bool = True


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """Structured output, enforced by a grammar (serving/grammar.py): any
    JSON object, JSON that matches `schema` (`strict`: refuse what cannot be
    enforced), or a GBNF/Lark grammar's `text`. `param` names the request's
    field in errors."""

    kind: Literal["json_object", "json_schema", "grammar"]
    schema: dict[str, Any] | bool | None = None
    param: str = "response_format"
    schema_param: str = "response_format.json_schema.schema"
    strict: bool = False
    text: str | None = None  # kind "grammar"


@dataclass(frozen=True, slots=True)
class Options:
    """How to generate. `sampling` is complete but for `max_tokens`,
    `grammar` and `logprobs`, which the layer sets: `max_tokens` None means
    until the context is full (a larger one is cut to the room left);
    `context_limit` (Ollama's `num_ctx`) caps prompt plus answer when it
    leaves room for an answer; `penalty_last_n` -1 means the whole context."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    num_choices: int = 1
    num_logprobs: int | None = None
    priority: float = PRIORITY_ALIASES["default"]
    context_limit: int | None = None


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A conversation to continue, optionally with tools or a JSON format."""

    model: str
    messages: tuple[Message, ...]
    options: Options = field(default_factory=Options)
    tools: Tools | None = None
    output: OutputFormat | None = None
    prompt_param: str = "messages"
    think: bool | None = None  # False: close a reasoning model's think section in the prompt (serving/reasoning.py)
    reasoning_budget: int | None = (
        None  # thinking tokens before </think> is forced; None: the server's --reasoning-budget
    )
    # The prompt's end: the template's generation prompt, or (continue_final) the last message's text
    # after it, the answer going on from there. None: continue a last assistant message (llama-server's
    # and Anthropic's prefill); the API refuses both true at once.
    add_generation_prompt: bool = True
    continue_final: bool | None = None


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    """Plain completion of each prompt (text, tokenized with the model's
    special tokens, or token ids); with `suffix`, each prompt is the text
    before a gap that the answer fills (fill-in-the-middle)."""

    model: str
    prompts: tuple[str | tuple[int, ...], ...]
    options: Options = field(default_factory=Options)
    suffix: str | None = None
    prompt_param: str = "prompt"
    output: OutputFormat | None = None


@dataclass(frozen=True, slots=True)
class TextRequest:
    """One text prompt: through the chat template as a user turn (after
    `system`), or `raw`; after `context` (token ids of an earlier exchange)
    it goes on from there; with `suffix`, fill-in-the-middle instead."""

    model: str
    prompt: str
    options: Options = field(default_factory=Options)
    system: str | None = None
    raw: bool = False
    context: tuple[int, ...] | None = None
    suffix: str | None = None
    output: OutputFormat | None = None
    prompt_param: str = "prompt"


@dataclass(frozen=True, slots=True)
class ExtraChunk:
    """Another file's text, given as context to fill-in-the-middle."""

    filename: str
    text: str


@dataclass(frozen=True, slots=True)
class InfillRequest:
    """Fill the gap between `prefix` and `suffix` (code completion);
    `prompt` is the start of the middle; `extra` other files as context."""

    model: str
    prefix: str
    suffix: str
    prompt: str = ""
    extra: tuple[ExtraChunk, ...] = ()
    options: Options = field(default_factory=Options)
    model_param: str | None = None  # names the field that chose the model, for "no FIM tokens"
    prompt_param: str = "input_prefix"


# ---- answers ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one choice."""

    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    num_draft_tokens: int = 0  # speculative decoding: drafted tokens verified
    num_accepted_tokens: int = 0  # ... and accepted


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New text of choice `index` (possibly empty when only `logprobs` came)."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """New reasoning text of choice `index` (serving/reasoning.py)."""

    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """Choice `index` began tool call `call_index`: its id and name are known."""

    index: int
    call_index: int
    call_id: str
    name: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCallArguments:
    """A piece of a tool call's `arguments` (JSON text)."""

    index: int
    call_index: int
    arguments: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A whole tool call: `arguments` is the JSON text the model wrote."""

    id: str
    name: str
    arguments: str

    def arguments_object(self) -> dict[str, Any]:
        """The arguments parsed ({} when they do not parse as an object)."""
        try:
            value = json.loads(self.arguments) if self.arguments else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class ToolCallEnd:
    """Tool call `call_index` of choice `index` is complete."""

    index: int
    call_index: int
    call: ToolCall


@dataclass(frozen=True, slots=True)
class ChoiceEnd:
    """Choice `index` is over. `finish_reason` is the engine's (stop,
    length, abort, error); `num_tool_calls` tells adapters whether "stop"
    means "the calls are made"; `stop_sequence` is the stop string that
    ended it, if one did; `error` is set with finish_reason "error"."""

    index: int
    finish_reason: str
    usage: Usage = field(default_factory=Usage)
    num_tool_calls: int = 0
    stop_sequence: str | None = None
    error: LocalServeError | None = None


Delta = TextDelta | ReasoningDelta | ToolCallStart | ToolCallArguments | ToolCallEnd | ChoiceEnd

#: A named event of a stream: `event: NAME` and its `data` (the Responses and Anthropic Messages streams).
Event = tuple[str, dict[str, Any]]


@dataclass(slots=True)
class ChoiceResult:
    """Everything one choice produced (a whole answer). With tools, `content`
    is the text outside the calls (None when there is only calls)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None
    stop_sequence: str | None = None
    reasoning: str | None = None  # the think section's text, for a reasoning model (None: no section)
