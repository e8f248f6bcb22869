"""Ollama's answers as JSON, without HTTP: the lines of /api/chat and
/api/generate (`ChatLines`, `GenerateLines`: streamed, or the one line of a
whole answer), the answer to an empty request, and the embeddings' objects.
`api/ollama/` writes them (NDJSON when streamed)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from localserve.models.policy import parse_keep_alive
from localserve.serving.answer import Answer
from localserve.serving.embeddings import Embeddings
from localserve.serving.types import (
    ChoiceEnd,
    ChoiceResult,
    Delta,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallEnd,
    Usage,
)


def now_iso() -> str:
    """Ollama's `created_at`: RFC 3339 in UTC."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def loaded_line(name: str, keep_alive: str | float | None, fields: dict[str, Any]) -> dict[str, Any]:
    """Ollama's answer to an empty request: the model is loaded (and held till
    now); with `keep_alive: 0` the hold's release unloads it once idle."""
    reason = "unload" if parse_keep_alive(keep_alive) == 0 else "load"
    return {"model": name, "created_at": now_iso(), **fields, "done_reason": reason, "done": True}


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


def embed_json(model: str, result: Embeddings, started_ns: int) -> dict[str, Any]:
    """/api/embed's object: `{"embeddings": [[...], ...]}` (unit vectors)."""
    return {
        "model": model,
        "embeddings": [v.astype(np.float32).tolist() for v in result.vectors],
        "total_duration": time.monotonic_ns() - started_ns,
        "load_duration": 0,
        "prompt_eval_count": result.num_tokens,
    }


def embedding_json(result: Embeddings) -> dict[str, Any]:
    """/api/embeddings' object (Ollama's older route): `{"embedding": [...]}`."""
    vector = result.vectors[0].astype(np.float32).tolist() if result.vectors else []
    return {"embedding": vector}
