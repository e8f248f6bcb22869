"""Ollama's request bodies (/api/chat, /api/generate, /api/show, /api/embed,
/api/embeddings, /api/pull, /api/copy), its `options` as the serving layer's
`Options`, and the chat and generate bodies as serving requests."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from localserve.engine.types import SamplingParams, parse_priority
from localserve.errors import InvalidRequestError
from localserve.serving.openai import schemas
from localserve.serving.openai.schemas import MAX_STOP, MAX_TOOLS, ToolDef
from localserve.serving.types import (
    ChatRequest,
    FunctionTool,
    HistoryCall,
    Message,
    Options,
    OutputFormat,
    TextRequest,
    Tools,
)

NO_IMAGES = "images are not supported: no model loaded here has vision; send text only"
INT32_MAX = 2**31 - 1  # llama.cpp takes these as int32


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class OllamaOptions(_Model):
    """The `options` this server honours; the rest (num_gpu, mirostat, ...) are ignored."""

    num_ctx: int | None = Field(default=None, ge=1, le=INT32_MAX)
    num_predict: int | None = Field(default=None, le=INT32_MAX)  # -1: no limit, -2: fill the context
    temperature: float | None = Field(default=None, ge=0.0)
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    typical_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    stop: list[str] | None = Field(default=None, max_length=MAX_STOP)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    repeat_last_n: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    @field_validator("stop", mode="before")
    @classmethod
    def _one_stop(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class OllamaMessage(_Model):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = None
    tool_calls: list[schemas.MessageToolCall] | None = None
    tool_name: str | None = None
    thinking: str | None = None  # an earlier answer's, as /api/chat returned it

    @field_validator("images")
    @classmethod
    def _no_images(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise ValueError(NO_IMAGES)
        return value

    def message(self) -> Message:
        """The message for the serving layer (`tool_name` names a tool's result)."""
        calls = tuple(HistoryCall(c.function.name, c.function.arguments, c.id) for c in self.tool_calls or ())
        reasoning = (self.thinking or "") if self.role == "assistant" else ""
        return Message(self.role, self.content or "", self.tool_name, calls, reasoning=reasoning)


class _OllamaRequest(_Model):
    model: str = Field(min_length=1)
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    stream: bool = True
    # How long the model stays loaded once idle; read from the body by
    # api.holds when the model is held (Ollama's semantics).
    keep_alive: str | float | None = None
    # false: a reasoning model's think section is closed in the prompt; else its thinking comes in `thinking`
    think: bool | str | None = None


class OllamaChatRequest(_OllamaRequest):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[ToolDef] | None = Field(default=None, max_length=MAX_TOOLS)


class OllamaGenerateRequest(_OllamaRequest):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None  # a Go template: not applicable, ignored
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None

    @field_validator("images")
    @classmethod
    def _no_images(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise ValueError(NO_IMAGES)
        return value


def ollama_options(options: OllamaOptions | None, *, priority: float) -> Options:
    """Ollama's options with Ollama's defaults (temperature 0.8, top_k 40,
    top_p 0.9, repeat_penalty 1.1 over the last 64 tokens). `num_ctx` caps
    prompt plus answer when it leaves room for an answer (the real context
    is the server's `--ctx-size`); `num_predict` -1 or -2: no limit."""
    o = options or OllamaOptions()
    sampling = SamplingParams(
        temperature=_or(o.temperature, 0.8),
        top_k=_or(o.top_k, 40),
        top_p=_or(o.top_p, 0.9),
        min_p=_or(o.min_p, 0.0),
        typical_p=_or(o.typical_p, 1.0),
        repeat_penalty=_or(o.repeat_penalty, 1.1),
        penalty_last_n=_or(o.repeat_last_n, 64),  # -1: the whole context
        presence_penalty=_or(o.presence_penalty, 0.0),
        frequency_penalty=_or(o.frequency_penalty, 0.0),
        seed=o.seed if o.seed is not None and o.seed >= 0 else None,
        stop=tuple(s for s in o.stop or () if s),
    )
    max_tokens = o.num_predict if o.num_predict and o.num_predict > 0 else None
    return Options(sampling=sampling, max_tokens=max_tokens, priority=priority, context_limit=o.num_ctx)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def chat_request(body: OllamaChatRequest, model_id: str) -> ChatRequest:
    """An /api/chat body as a serving chat request (tools as with `tool_choice: "auto"`)."""
    tools = None
    if body.tools:
        functions = tuple(
            FunctionTool(t.function.name, t.function.description, t.function.parameters) for t in body.tools
        )
        tools = Tools(functions)
    return ChatRequest(
        model_id,
        tuple(m.message() for m in body.messages),
        ollama_options(body.options, priority=parse_priority(None)),
        tools=tools,
        output=_output_format(body.format),
        think=False if body.think is False else None,
    )


def text_request(body: OllamaGenerateRequest, model_id: str) -> TextRequest:
    """An /api/generate body as a serving text request."""
    return TextRequest(
        model_id,
        body.prompt,
        ollama_options(body.options, priority=parse_priority(None)),
        system=body.system,
        raw=body.raw,
        context=tuple(body.context) if body.context else None,
        suffix=body.suffix or None,
        output=_output_format(body.format),
    )


def _output_format(value: str | dict[str, Any] | None) -> OutputFormat | None:
    """`format`: "json" (any JSON) or a JSON schema."""
    if not value:
        return None
    if value == "json":
        return OutputFormat("json_object", param="format", schema_param="format")
    if isinstance(value, dict):
        return OutputFormat("json_schema", value, param="format", schema_param="format")
    raise InvalidRequestError(f'format must be "json" or a JSON schema object; got {value!r}', param="format")


# ---- models and embeddings -----------------------------------------------------------


class ShowRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    name: str = ""  # Ollama's older field

    @model_validator(mode="after")
    def _named(self) -> ShowRequest:
        if not (self.model or self.name):
            raise ValueError("model is required")
        return self


class EmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True
    dimensions: int | None = Field(default=None, ge=1)
    keep_alive: str | float | None = None  # read by api.holds when the model is held


class LegacyEmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    prompt: str = ""
    keep_alive: str | float | None = None


class _Named(BaseModel):
    """Ollama's clients send `model`; older ones `name`."""

    model_config = ConfigDict(extra="ignore")
    model: str = ""
    name: str = ""

    @model_validator(mode="after")
    def _one_name(self) -> _Named:
        self.model = self.model or self.name
        if not self.model:
            raise InvalidRequestError("'model' is required", param="model")
        return self


class DeleteRequest(_Named):
    """Body of `DELETE /api/delete`."""


class OllamaPullRequest(_Named):
    stream: bool = True
    insecure: bool = False


class CopyRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    source: str
    destination: str
