"""Stream one completion and time it: first token, every later chunk, the end."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass(slots=True)
class RequestResult:
    """The timings of one request. Times are seconds on `time.perf_counter()`."""

    class_name: str
    sent_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0  # the server's usage count, else the number of text chunks
    error: str | None = None
    cancelled: bool = False  # stopped by the runner at the end of a timed level

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cancelled and self.finished_at > 0

    @property
    def ttft(self) -> float:
        return self.first_token_at - self.sent_at

    @property
    def latency(self) -> float:
        return self.finished_at - self.sent_at

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first (0 for one token)."""
        if self.num_output_tokens < 2:
            return 0.0
        return (self.finished_at - self.first_token_at) / (self.num_output_tokens - 1)

    def itls(self) -> list[float]:
        """Gaps between successive text chunks."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]

    def record(self) -> dict[str, Any]:
        """A compact JSON record (ms) for the raw results."""
        return {
            "class": self.class_name,
            "ok": self.ok,
            "cancelled": self.cancelled,
            "error": self.error,
            "ttft_ms": round(self.ttft * 1e3, 2) if self.first_token_at else None,
            "latency_ms": round(self.latency * 1e3, 2) if self.finished_at else None,
            "tpot_ms": round(self.tpot * 1e3, 3) if self.ok else None,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_output_tokens": self.num_output_tokens,
        }


def _text_of(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return (choice.get("delta") or {}).get("content") or ""
    return choice.get("text") or ""


async def stream_request(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], result: RequestResult, headers: dict[str, str]
) -> None:
    """POST `body` with `stream: true` and time the SSE answer into `result`
    (the caller keeps it, so a cancelled request still counts its tokens).
    Never raises for a server's fault: HTTP errors, in-band errors and broken
    connections land in `error`; cancellation marks `cancelled` and re-raises."""
    result.sent_at = time.perf_counter()
    num_text_chunks = 0
    try:
        async with session.post(url, json=body, headers=headers) as response:
            if response.status != 200:
                text = await response.text()
                result.error = f"HTTP {response.status}: {text[:200]}"
                return
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"in-band error: {json.dumps(chunk['error'])[:200]}"
                    return
                if _text_of(chunk):
                    num_text_chunks += 1
                    result.chunk_times.append(now)
                    if not result.first_token_at:
                        result.first_token_at = now
                usage = chunk.get("usage")
                if usage:
                    result.num_prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    result.num_output_tokens = int(usage.get("completion_tokens") or 0)
        result.finished_at = time.perf_counter()
        if not result.num_output_tokens:
            result.num_output_tokens = num_text_chunks
        if not result.first_token_at:
            result.error = "the answer carried no text"
    except asyncio.CancelledError:
        result.cancelled = True
        result.num_output_tokens = result.num_output_tokens or num_text_chunks
        raise
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
