"""The bodies of OpenAI's generating endpoints (chat completions, legacy
completions, Responses), validated at the edge; `request` turns them into the
serving layer's requests.

Unknown fields are accepted and ignored, as OpenAI's API does, so clients
that send newer parameters keep working. Fields that would change the answer
in a way this server cannot honour (image parts, `echo` with `logprobs`)
are refused with a 400 that names them. The Responses API is stateless
here: server-side state (`previous_response_id`, `store: true`,
`conversation`, `background`) is refused with a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from localserve.engine.types import parse_priority
from localserve.errors import InvalidRequestError
from localserve.serving.validation import check_unicode

MAX_STOP = 16
MAX_CHOICES = 16
MAX_PROMPTS = 256

Probability = Annotated[float, Field(ge=0.0, le=1.0)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]


def _checked_priority(value: float | str | None) -> float | str | None:
    parse_priority(value)  # ValueError -> 400 naming `priority`
    return value


#: This server's `priority` extension (0-10 or a class name), checked as a body is read: every dialect's field
Priority = Annotated[float | str | None, AfterValidator(_checked_priority)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Model):
    include_usage: bool = False


class JsonSchemaFormat(_Model):
    name: str = "response"
    description: str | None = None
    # `schema` shadows a BaseModel attribute, hence the alias.
    schema_: dict[str, Any] | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    # llama-server's `{"type": "json_object", "schema": {...}}`: JSON that follows the schema
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs a 'json_schema' object with a 'schema'")
        return self


def _text_of(content: str | list[dict[str, Any]] | None) -> str:
    """Join text parts; refuse parts this text-only server cannot read."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "text":
            raise ValueError("a content part of type 'text' needs a string 'text'")
        else:
            raise ValueError(f"content parts of type {kind!r} are not supported: this server's models read text only")
    return "".join(texts)


MAX_TOOLS = 128
FUNCTION_NAME = r"^[a-zA-Z0-9_.-]{1,64}$"


class FunctionDef(_Model):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None


class ToolDef(_Model):
    """One entry of `tools` (the only tool type is a function)."""

    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionName(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolCallFunction(_Model):
    name: str
    arguments: str | dict[str, Any] = "{}"  # OpenAI sends a JSON string; Ollama an object


class MessageToolCall(_Model):
    """A tool call of an earlier assistant message in the history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages
    # An earlier answer's thinking, as llama-server and vLLM return it (`reasoning`: OpenRouter's and newer vLLM's name)
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("content")
    @classmethod
    def _check_parts(cls, value: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        _text_of(value)  # raise early, with the field path in the error
        return value

    @model_validator(mode="after")
    def _content_given(self) -> ChatMessage:
        # As OpenAI: only an assistant message that calls tools may leave out its content.
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            needs = "a 'content' (or 'tool_calls')" if self.role == "assistant" else "a 'content'"
            raise ValueError(f"a message of role '{self.role}' needs {needs}")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates expect it (plain string content)."""
        # Templates know "system"; OpenAI's newer "developer" role means the same.
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": _text_of(self.content)}
        if self.name:
            message["name"] = self.name
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id:
            message["tool_call_id"] = self.tool_call_id
        reasoning = self.reasoning_content or self.reasoning
        if reasoning and role == "assistant":
            message["reasoning_content"] = reasoning
        return message


def _constrains(value: Any) -> bool:
    return value is not None and not (isinstance(value, ResponseFormat) and value.type == "text")


class SamplingFields(_Model):
    """Parameters shared by chat and legacy completions."""

    @model_validator(mode="before")
    @classmethod
    def _unicode_only(cls, data: Any) -> Any:
        # Over HTTP parse_body has checked already; a Batch API line is validated here alone.
        check_unicode(data)  # NotUnicodeError (400, naming the field) passes through pydantic as is
        return data

    model: str = ""  # "": the only model of its kind this server runs (serving/models.py)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: Probability | None = None
    top_k: int | None = Field(default=None, ge=0)
    min_p: Probability | None = None
    typical_p: Probability | None = None  # llama-server's extension; 1: off
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repeat_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    logit_bias: dict[int, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    speculative: bool = True  # false: this request drafts no tokens (speculative decoding, --speculative)
    cache_prompt: bool = True  # llama-server's: false computes the whole prompt, reusing no cached prefix
    priority: Priority = None
    # llama.cpp's server's own constraints: a JSON schema, or a GBNF (or Lark) grammar
    json_schema: dict[str, Any] | None = None
    grammar: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _one_constraint(self) -> SamplingFields:
        given = [
            name for name in ("response_format", "json_schema", "grammar") if _constrains(getattr(self, name, None))
        ]
        if len(given) > 1:
            raise ValueError(f"give one of {', '.join(given)}, not several: each constrains the whole output")
        return self

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences are allowed")
        return value

    @property
    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(SamplingFields):
    """Body of `POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    # "none" closes a reasoning model's think section in the prompt; the other efforts change nothing here
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # llama-server's (and vLLM's) prompt controls: a conversation that ends with an assistant message
    # continues it unless continue_final_message is false; true needs add_generation_prompt false
    add_generation_prompt: bool = True
    continue_final_message: bool | None = None
    # llama-server's debug fields: `__verbose` (the prompt and its result object), `timings` on every
    # chunk, and `prompt_progress` chunks before a streamed answer's first token
    verbose: bool | None = None  # None: the server's --verbose
    timings_per_token: bool = False
    return_progress: bool = False

    @model_validator(mode="after")
    def _one_prompt_end(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("Cannot set both add_generation_prompt and continue_final_message to true.")
        return self

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[ToolDef] | None) -> list[ToolDef] | None:
        names = [tool.function.name for tool in value or ()]
        if len(set(names)) != len(names):
            raise ValueError("every function needs its own name")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _check_tool_choice(cls, value: ToolChoice | None, info: ValidationInfo) -> ToolChoice | None:
        names = [tool.function.name for tool in info.data.get("tools") or ()]
        if value == "required" and not names:
            raise ValueError("'required' needs at least one entry in 'tools'")
        if isinstance(value, NamedToolChoice) and value.function.name not in names:
            raise ValueError(f"the function {value.function.name!r} is not in 'tools'")
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _check_top_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs set to true")
        return value

    @property
    def token_limit(self) -> int | None:
        # max_completion_tokens is OpenAI's newer name and wins when both are given.
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


TokenIds = list[Annotated[int, Field(ge=0)]]
_PROMPT_SHAPES = "prompt must be a string, a list of strings, a list of token ids, or a list of token-id lists"


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class TextCompletionRequest(SamplingFields):
    """Body of the legacy `POST /v1/completions`."""

    prompt: str | list[str] | TokenIds | list[TokenIds]
    echo: bool = False
    suffix: str | None = None
    logprobs: int | None = Field(default=None, ge=0, le=20)
    best_of: int | None = Field(default=None, ge=1, le=MAX_CHOICES)

    @field_validator("prompt", mode="before")
    @classmethod
    def _check_prompt(cls, value: Any) -> Any:
        # One clear message instead of one error per member of the union.
        if isinstance(value, str):
            return value
        if not isinstance(value, list) or not value:
            raise ValueError(_PROMPT_SHAPES if value != [] else "the prompt list is empty")
        if all(_is_token_id(item) for item in value):
            return value
        if all(isinstance(item, str) for item in value) or all(
            isinstance(item, list) and all(_is_token_id(t) for t in item) for item in value
        ):
            if len(value) > MAX_PROMPTS:
                raise ValueError(f"at most {MAX_PROMPTS} prompts are allowed in one request")
            return value
        raise ValueError(_PROMPT_SHAPES)

    @field_validator("logprobs")
    @classmethod
    def _check_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("echo"):
            raise ValueError("echo together with logprobs is not supported (prompt log-probabilities are not computed)")
        return value

    @field_validator("best_of")
    @classmethod
    def _check_best_of(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value != info.data.get("n", 1):
            raise ValueError("best_of is not supported unless it equals n")
        return value

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of prompts (text or token ids)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(item, int) for item in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


# ---- the Responses API -------------------------------------------------------------------

STATELESS = (
    "this server is stateless: it keeps no responses or conversations, so {what} cannot be used; "
    "send the whole conversation in 'input' (with 'store': false or left out)"
)


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
