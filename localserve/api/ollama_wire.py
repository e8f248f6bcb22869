"""Ollama's request bodies and answer lines for /api/chat and /api/generate,
its `options` as the engine's `SamplingParams`, and the NDJSON writer."""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import time
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, field_validator

from localserve.api.generation import MergedStreams, event_error
from localserve.api.schemas import MAX_STOP, MAX_TOOLS, ToolCall, ToolDef
from localserve.api.tools_parse import ToolCallParser, parse_reply
from localserve.api.wire import FINISH_REASONS
from localserve.engine.types import FinishReason, SamplingParams, TokenEvent
from localserve.errors import LocalServeError

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
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None

    @field_validator("images")
    @classmethod
    def _no_images(cls, value: list[str] | None) -> list[str] | None:
        if value:
            raise ValueError(NO_IMAGES)
        return value

    def for_template(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_name:
            message["name"] = self.tool_name
        return message


class _OllamaRequest(_Model):
    model: str = Field(min_length=1)
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: OllamaOptions | None = None
    stream: bool = True
    # How long the model stays loaded once idle; read from the body by
    # api.leases when the model is acquired (Ollama's semantics).
    keep_alive: str | float | None = None
    think: bool | str | None = None  # no model here thinks; accepted and ignored


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


def ollama_sampling(
    options: OllamaOptions | None, *, num_prompt_tokens: int, n_ctx: int, grammar: str | None
) -> SamplingParams:
    """Ollama's options with Ollama's defaults. `num_ctx` caps prompt plus
    answer when it leaves room for an answer (the real context is the
    server's `--ctx-size`)."""
    o = options or OllamaOptions()
    ctx = min(n_ctx, o.num_ctx) if o.num_ctx and o.num_ctx > num_prompt_tokens else n_ctx
    room = max(1, ctx - num_prompt_tokens)
    last_n = o.repeat_last_n if o.repeat_last_n is not None else 64
    return SamplingParams(
        max_tokens=min(o.num_predict, room) if o.num_predict and o.num_predict > 0 else room,
        temperature=_or(o.temperature, 0.8),
        top_k=_or(o.top_k, 40),
        top_p=_or(o.top_p, 0.9),
        min_p=_or(o.min_p, 0.0),
        repeat_penalty=_or(o.repeat_penalty, 1.1),
        penalty_last_n=ctx if last_n == -1 else last_n,
        presence_penalty=_or(o.presence_penalty, 0.0),
        frequency_penalty=_or(o.frequency_penalty, 0.0),
        seed=o.seed if o.seed is not None and o.seed >= 0 else None,
        stop=tuple(s for s in o.stop or () if s),
        grammar=grammar,
    )


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def now_iso() -> str:
    """Ollama's `created_at`: RFC 3339 in UTC."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# ---- answer lines --------------------------------------------------------------------


class OllamaLines:
    """Turns token events into Ollama's lines; keeps the counts and timings."""

    def __init__(self, model: str, started_ns: int) -> None:
        self.model = model
        self.started_ns = started_ns
        self.submitted_ns = started_ns
        self.first_token_ns = 0
        self.final: TokenEvent | None = None
        self.text = ""
        self.output_ids: list[int] = []

    def add(self, event: TokenEvent) -> list[dict[str, Any]]:
        """The lines this event makes (streaming); whole answers ignore them."""
        if event.finish_reason is FinishReason.ERROR:
            raise event_error(event)
        if event.token_ids and not self.first_token_ns:
            self.first_token_ns = _monotonic_ns()
        self.output_ids.extend(event.token_ids)
        self.text += event.text
        lines = self._pieces(event.text)
        if event.finished:
            self.final = event
            lines += self._last_pieces()
            lines.append(self._line(self._empty(), done=True) | self.stats())
        return lines

    def stats(self) -> dict[str, Any]:
        end = _monotonic_ns()
        first = self.first_token_ns or end
        final = self.final
        reason = FINISH_REASONS[final.finish_reason] if final and final.finish_reason else "stop"
        return {
            "done_reason": reason,
            "total_duration": end - self.started_ns,
            "load_duration": self.submitted_ns - self.started_ns,
            "prompt_eval_count": final.num_prompt_tokens if final else 0,
            "prompt_eval_duration": first - self.submitted_ns,
            "eval_count": final.num_output_tokens if final else len(self.output_ids),
            "eval_duration": end - first,
        }

    def _line(self, fields: dict[str, Any], *, done: bool) -> dict[str, Any]:
        return {"model": self.model, "created_at": now_iso(), **fields, "done": done}

    def whole(self) -> dict[str, Any]:
        raise NotImplementedError

    def _pieces(self, text: str) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _last_pieces(self) -> list[dict[str, Any]]:
        return []

    def _empty(self) -> dict[str, Any]:
        raise NotImplementedError


class ChatLines(OllamaLines):
    """`message` lines; with tools, calls leave one line each once complete."""

    def __init__(self, model: str, started_ns: int, *, tools: bool) -> None:
        super().__init__(model, started_ns)
        self.parser = ToolCallParser() if tools else None

    def _message(self, content: str, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {"message": message}

    def _empty(self) -> dict[str, Any]:
        return self._message("")

    def _pieces(self, text: str) -> list[dict[str, Any]]:
        if self.parser is None:
            return [self._line(self._message(text), done=False)] if text else []
        return self._deltas(self.parser.feed(text))

    def _last_pieces(self) -> list[dict[str, Any]]:
        return self._deltas(self.parser.finish()) if self.parser is not None else []

    def _deltas(self, deltas: list[Any]) -> list[dict[str, Any]]:
        assert self.parser is not None
        lines = []
        for d in deltas:
            if d.content:
                lines.append(self._line(self._message(d.content), done=False))
            elif d.done:
                lines.append(self._line(self._message("", [self.parser.calls[d.index].ollama()]), done=False))
        return lines

    def whole(self) -> dict[str, Any]:
        if self.parser is None:
            return self._line(self._message(self.text), done=True) | self.stats()
        reply = parse_reply(self.text)
        calls = [call.ollama() for call in reply.calls]
        return self._line(self._message(reply.content or "", calls), done=True) | self.stats()


class GenerateLines(OllamaLines):
    """`response` lines; the last carries `context` (prompt and answer ids)
    unless the prompt was raw."""

    def __init__(self, model: str, started_ns: int, *, context: list[int] | None) -> None:
        super().__init__(model, started_ns)
        self.context = context

    def _empty(self) -> dict[str, Any]:
        return {"response": ""}

    def _pieces(self, text: str) -> list[dict[str, Any]]:
        return [self._line({"response": text}, done=False)] if text else []

    def stats(self) -> dict[str, Any]:
        stats = super().stats()
        if self.context is not None:
            stats["context"] = [*self.context, *self.output_ids]
        return stats

    def whole(self) -> dict[str, Any]:
        return self._line({"response": self.text}, done=True) | self.stats()


def _monotonic_ns() -> int:
    return time.monotonic_ns()


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
        await self.response.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n")


async def ollama_stream(
    request: web.Request, merged: MergedStreams, lines: OllamaLines, writer: NdjsonWriter
) -> web.StreamResponse:
    """Stream an answer's lines; a client that leaves aborts it."""
    try:
        async for _, event in merged:
            for line in lines.add(event):
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
    finally:
        merged.abort()
    return writer.response
