"""OpenAI's embeddings: the request (text or token ids) and the `list` of
vectors it answers, batched across requests by the model's queue
(`serving.embeddings`)."""

from __future__ import annotations

import base64
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from localserve.engine.types import parse_priority
from localserve.serving.embeddings import EmbeddingsRequest, embed
from localserve.serving.models import ModelHost
from localserve.serving.openai.schemas import Priority

MAX_INPUTS = 2048  # as OpenAI


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = ""  # "": the only embeddings model this server runs (serving/models.py)
    # texts, token ids, or lists of them; token ids and text mixed in one prompt ([12, "text", 13]) as llama-server
    input: str | list[int | str] | list[str | list[int | str]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    priority: Priority = None

    @field_validator("input", mode="before")
    @classmethod
    def _object_entries(cls, value: Any) -> Any:
        """llama-server's object entries: `{"prompt_string": text}` or
        `{"content": [{"type": "text", "text": ...}, ...]}` (text parts only)."""
        if isinstance(value, dict):
            return _object_text(value)
        if isinstance(value, list):
            return [_object_text(v) if isinstance(v, dict) else v for v in value]
        return value

    @field_validator("input")
    @classmethod
    def _check_input(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError("input must not be an empty list")
            if len(value) > MAX_INPUTS and not isinstance(value[0], int):
                raise ValueError(f"at most {MAX_INPUTS} inputs per request; got {len(value)}")
        return value

    def inputs(self) -> tuple[str | tuple[int | str, ...], ...]:
        """One entry per vector asked for (`embedding_inputs`)."""
        return embedding_inputs(self.input)


def embedding_inputs(value: str | list[Any]) -> tuple[str | tuple[int | str, ...], ...]:
    """One entry per vector: a text, or a prompt of token ids (with text
    pieces among them). A list holding token ids is one prompt; any other
    list is one prompt per entry, as llama-server reads it."""
    if isinstance(value, str):
        return (value,)
    if any(isinstance(x, int) for x in value):
        return (tuple(value),)
    return tuple(x if isinstance(x, str) else tuple(x) for x in value)


def _object_text(entry: dict[str, Any]) -> str:
    text = entry.get("prompt_string")
    if isinstance(text, str) and not entry.get("multimodal_data"):
        return text
    parts = entry.get("content")
    if isinstance(parts, list) and parts and all(isinstance(p, dict) and p.get("type") == "text" for p in parts):
        texts = [p.get("text") for p in parts]
        if all(isinstance(t, str) for t in texts):
            return "".join(texts)  # type: ignore[arg-type]
    raise ValueError("an input object is {'prompt_string': text} or {'content': [text parts]} (this model takes text)")


async def answer(host: ModelHost, body: EmbeddingRequest, *, arrays: bool = False) -> dict[str, Any]:
    """The embeddings `list` object for `body` (the endpoint and batch lines).

    With `arrays`, float vectors stay float32 numpy arrays, for an encoder
    that writes them itself (the endpoint's orjson: each number as float32's
    shortest decimal, which reads back to the same float32, in a tenth of
    the time `json` takes over the list of float64s and in half the bytes).
    """
    request = EmbeddingsRequest(body.model, body.inputs(), body.dimensions, parse_priority(body.priority))
    result = await embed(host, request)
    if body.encoding_format == "base64":
        encode: Any = _base64
    else:
        encode = _float32 if arrays else _floats
    data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(result.vectors)]
    return {"object": "list", "data": data, "model": result.model_id, "usage": usage_tokens(result.num_tokens)}


def _floats(vector: np.ndarray) -> list[float]:
    return vector.astype(np.float32).tolist()  # type: ignore[no-any-return]


def _float32(vector: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(vector, dtype=np.float32)


def _base64(vector: np.ndarray) -> str:
    """Little-endian float32, as the openai SDK decodes it."""
    return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")


def usage_tokens(num_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
