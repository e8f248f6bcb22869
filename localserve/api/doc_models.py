"""What the OpenAPI document says of answers the code does not type: the
shapes of JSON answers (`Route.response`), the error envelopes of each
dialect, and multipart forms (`Route.form`). Documentation only: handlers
build their answers themselves; `extra="allow"` because answers may carry
more fields."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, RootModel


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow")  # answers may carry more fields


class ErrorDetail(_Doc):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(_Doc):
    """OpenAI's error object, on every route but Ollama's."""

    error: ErrorDetail


class OllamaError(_Doc):
    """Ollama's error object, on Ollama's routes."""

    error: str


class Health(_Doc):
    status: Literal["ok", "loading", "error"]
    not_loaded: dict[str, str] | None = None  # start-up models beyond --max-loaded-models -> why
    disk: dict[str, Any] | None = None  # the data directory, when it is read-only


class PickerBlock(_Doc):
    """What a model picker groups by."""

    kind: str  # chat, embeddings, transcription
    backend: str  # llamacpp, onnx, openvino, whisper, ...
    loaded: bool
    variant_of: str | None  # the model this id is an on-disk variant of (all-minilm-l6-v2 for -onnx-int8)


class ModelObject(_Doc):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    localserve: PickerBlock


class ModelList(_Doc):
    object: Literal["list"]
    data: list[ModelObject]


class UsageObject(_Doc):
    prompt_tokens: int
    total_tokens: int


class ChatChoice(_Doc):
    index: int
    message: dict[str, Any]
    finish_reason: str | None


class ChatCompletion(_Doc):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageObject


class TextChoice(_Doc):
    index: int
    text: str
    finish_reason: str | None


class TextCompletion(_Doc):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: UsageObject


class Embedding(_Doc):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str


class EmbeddingList(_Doc):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: UsageObject


class RerankResult(_Doc):
    index: int
    relevance_score: float
    document: dict[str, str] | None = None


class RerankResults(_Doc):
    id: str
    model: str
    results: list[RerankResult]
    usage: UsageObject
    meta: dict[str, Any]


class TeiRank(_Doc):
    """One document of Hugging Face TEI's rerank answer (a `texts` request)."""

    index: int
    score: float
    text: str | None = None


class RerankAnswer(RootModel[RerankResults | list[TeiRank]]):
    """A rerank answer: the Cohere/Jina shape, or TEI's bare list for a `texts` request."""


class Score(_Doc):
    index: int
    object: Literal["score"]
    score: float


class Scores(_Doc):
    object: Literal["list"]
    model: str
    data: list[Score]
    usage: UsageObject


class Classification(_Doc):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class Classifications(_Doc):
    object: Literal["list"]
    model: str
    data: list[Classification]
    usage: UsageObject


class ResponseObject(_Doc):
    """OpenAI's Responses API `response` (`/v1/responses`)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["completed", "incomplete", "failed", "in_progress"]
    model: str
    output: list[dict[str, Any]]
    output_text: str
    usage: dict[str, Any] | None


class AnthropicMessage(_Doc):
    """Anthropic's `message` (`/v1/messages`)."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None
    stop_sequence: str | None
    usage: dict[str, Any]


class TokenCount(_Doc):
    input_tokens: int


class AnthropicErrorDetail(_Doc):
    type: str
    message: str


class AnthropicError(_Doc):
    """Anthropic's error object, on the Messages routes."""

    type: Literal["error"]
    error: AnthropicErrorDetail


SPEECH_FORM: dict[str, Any] = {
    "type": "object",
    "required": ["file", "model"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "the audio (wav, mp3, flac, ogg, ...)"},
        "model": {"type": "string"},
        "language": {"type": "string"},
        "prompt": {"type": "string"},
        "response_format": {"type": "string", "enum": ["json", "text", "srt", "verbose_json", "vtt"]},
        "temperature": {"type": "number", "minimum": 0, "maximum": 1},
        "timestamp_granularities[]": {"type": "array", "items": {"type": "string", "enum": ["segment", "word"]}},
        "priority": {"type": "string"},
    },
}
UPLOAD_FORM: dict[str, Any] = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": ["batch", "batch_output", "fine-tune", "assistants", "user_data"]},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer"},
    },
}
SPEECH_TYPES = ("application/json", "text/plain", "application/x-subrip", "text/vtt")
