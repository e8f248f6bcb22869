"""Ollama's request bodies and answer lines for /api/chat and /api/generate,
its `options` as the serving layer's `Options`, and the NDJSON writer."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import time
from collections.abc import Sequence
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from localserve.api.http_edge import BYTES_SENT, note_abandoned
from localserve.engine.types import SamplingParams
from localserve.errors import LocalServeError
from localserve.serving.answer import Answer
from localserve.serving.openai import schemas
from localserve.serving.openai.schemas import MAX_STOP, MAX_TOOLS, ToolDef
from localserve.serving.types import (
    ChoiceEnd,
    ChoiceResult,
    Delta,
    HistoryCall,
    Message,
    Options,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    Usage,
)

log = logging.getLogger(__name__)

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
    tool_calls: list[schemas.ToolCall] | None = None
    tool_name: str | None = None

    @field_validator("images")
    @classmethod
    def _no_images(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise ValueError(NO_IMAGES)
        return value

    def message(self) -> Message:
        """The message for the serving layer (`tool_name` names a tool's result)."""
        calls = tuple(HistoryCall(c.function.name, c.function.arguments, c.id) for c in self.tool_calls or ())
        return Message(self.role, self.content or "", self.tool_name, calls)


class _OllamaRequest(_Model):
    model: str = Field(min_length=1)
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    stream: bool = True
    # How long the model stays loaded once idle; read from the body by
    # api.leases when the model is acquired (Ollama's semantics).
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


def now_iso() -> str:
    """Ollama's `created_at`: RFC 3339 in UTC."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# ---- answer lines --------------------------------------------------------------------


class OllamaLines:
    """Turns an answer's deltas into Ollama's lines, with the counts and the
    timings in nanoseconds."""

    def __init__(self, model: str, started_ns: int) -> None:
        self.model = model
        self.started_ns = started_ns
        self.submitted_ns = started_ns
        self.first_token_ns = 0
        self.end: ChoiceEnd | None = None
        self.output_ids: list[int] = []

    def follow(self, answer: Answer) -> None:
        """The answer's submission time, for the timings."""
        self.submitted_ns = answer.submitted_ns

    def add(self, delta: Delta, answer: Answer) -> list[dict[str, Any]]:
        """The lines a delta makes (streaming)."""
        if not isinstance(delta, ChoiceEnd):
            return self._pieces(delta)
        if delta.error is not None:
            raise delta.error
        self.end = delta
        self._took(answer)
        return [self._line(self._empty(), done=True) | self.stats()]

    def _took(self, answer: Answer) -> None:
        self.first_token_ns = answer.first_token_ns(0)
        self.output_ids = answer.token_ids(0)

    def stats(self) -> dict[str, Any]:
        end_ns = time.monotonic_ns()
        first = self.first_token_ns or end_ns
        usage = self.end.usage if self.end is not None else Usage(num_output_tokens=len(self.output_ids))
        return {
            "done_reason": self.end.finish_reason if self.end is not None else "stop",
            "total_duration": end_ns - self.started_ns,
            "load_duration": self.submitted_ns - self.started_ns,
            "prompt_eval_count": usage.num_prompt_tokens,
            "prompt_eval_duration": first - self.submitted_ns,
            "eval_count": usage.num_output_tokens,
            "eval_duration": end_ns - first,
        }

    def whole(self, result: ChoiceResult, answer: Answer) -> dict[str, Any]:
        """The one line of an answer that is not streamed."""
        self.end = ChoiceEnd(0, result.finish_reason, result.usage)
        self._took(answer)
        return self._line(self._whole(result), done=True) | self.stats()

    def _line(self, fields: dict[str, Any], *, done: bool) -> dict[str, Any]:
        return {"model": self.model, "created_at": now_iso(), **fields, "done": done}

    def _pieces(self, delta: Delta) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _empty(self) -> dict[str, Any]:
        raise NotImplementedError

    def _whole(self, result: ChoiceResult) -> dict[str, Any]:
        raise NotImplementedError


class ChatLines(OllamaLines):
    """`message` lines; tool calls leave one line each once complete, with
    `arguments` as an object."""

    @staticmethod
    def _message(content: str, calls: Sequence[ToolCall] = (), thinking: str | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking is not None:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = [
                {"function": {"name": call.name, "arguments": call.arguments_object()}} for call in calls
            ]
        return {"message": message}

    def _empty(self) -> dict[str, Any]:
        return self._message("")

    def _pieces(self, delta: Delta) -> list[dict[str, Any]]:
        if isinstance(delta, TextDelta) and delta.text:
            return [self._line(self._message(delta.text), done=False)]
        if isinstance(delta, ReasoningDelta) and delta.text:
            return [self._line(self._message("", thinking=delta.text), done=False)]
        if isinstance(delta, ToolCallEnd):
            return [self._line(self._message("", [delta.call]), done=False)]
        return []

    def _whole(self, result: ChoiceResult) -> dict[str, Any]:
        return self._message(result.content or "", result.tool_calls, result.reasoning)


class GenerateLines(OllamaLines):
    """`response` lines; the last carries `context` (prompt and answer ids)
    unless the prompt was raw."""

    def __init__(self, model: str, started_ns: int, *, raw: bool) -> None:
        super().__init__(model, started_ns)
        self.raw = raw
        self.context: list[int] | None = None

    def follow(self, answer: Answer) -> None:
        super().follow(answer)
        self.context = None if self.raw else answer.prompt_ids[0]

    def _empty(self) -> dict[str, Any]:
        return {"response": ""}

    def _pieces(self, delta: Delta) -> list[dict[str, Any]]:
        if isinstance(delta, TextDelta) and delta.text:
            return [self._line({"response": delta.text}, done=False)]
        return []

    def stats(self) -> dict[str, Any]:
        stats = super().stats()
        if self.context is not None:
            stats["context"] = [*self.context, *self.output_ids]
        return stats

    def _whole(self, result: ChoiceResult) -> dict[str, Any]:
        return {"response": result.text}


# ---- NDJSON --------------------------------------------------------------------------


class NdjsonWriter:
    """One JSON object per line; headers go out with the first line, so an
    error before it is still a plain `{"error"}` response with its status."""

    def __init__(self, request: web.Request, headers: dict[str, str]) -> None:
        self.request = request
        self.response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", **headers})

    @property
    def started(self) -> bool:
        return self.response.prepared

    async def send(self, obj: dict[str, Any]) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        try:
            await self.response.write(data)
        except ConnectionResetError:  # the client is gone
            note_abandoned(self.request)
            raise
        self.request[BYTES_SENT] = self.request.get(BYTES_SENT, 0) + len(data)


async def ollama_stream(
    request: web.Request, answer: Answer, lines: OllamaLines, writer: NdjsonWriter
) -> web.StreamResponse:
    """Stream an answer's lines; a client that leaves aborts it."""
    try:
        async with answer:
            async for delta in answer.deltas():
                for line in lines.add(delta, answer):
                    await writer.send(line)
    except ConnectionResetError:
        log.debug("client left %s during streaming; aborted", request.path)
    except Exception as exc:
        if not writer.started:
            raise
        if not isinstance(exc, LocalServeError):
            log.exception("error while streaming %s", request.path)
        message = (
            exc.message if isinstance(exc, LocalServeError) else "the server had an unexpected error while streaming"
        )
        with contextlib.suppress(ConnectionResetError):
            await writer.send({"error": message})
    return writer.response
