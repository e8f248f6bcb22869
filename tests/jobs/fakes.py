"""A scripted `LineExecutor` and helpers to write batch input files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from localserve.jobs.store import JobStore
from localserve.jobs.types import FileRecord, LineResult

ENDPOINT = "/v1/chat/completions"


def request_line(custom_id: str, **body: Any) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": {"model": "m", **body}})


def write_input(store: JobStore, lines: list[str]) -> FileRecord:
    tmp = store.temp_path()
    tmp.write_text("\n".join(lines) + "\n")
    return store.add_file(tmp, "input.jsonl", "batch")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class FakeExecutor:
    """Answers `{"echo": body["n"]}` after `delay_s` (lines whose `n` is in
    `held` first wait for `gate` to open);
    a body with `"fail": true` gets a 400, one with `"busy": k` gets k
    "queue full" answers first. Counts every call and the most in flight."""

    def __init__(self, *, concurrency: int = 4, delay_s: float = 0.0) -> None:
        self.concurrency = concurrency
        self.delay_s = delay_s
        self.gate = asyncio.Event()
        self.held: set[Any] = set()
        self.calls: list[Any] = []
        self.num_cancelled = 0
        self.in_flight = 0
        self.max_in_flight_seen = 0
        self._busy_left: dict[Any, int] = {}

    async def execute(self, endpoint: str, body: dict[str, Any]) -> LineResult:
        self.calls.append(body.get("n"))
        self.in_flight += 1
        self.max_in_flight_seen = max(self.max_in_flight_seen, self.in_flight)
        try:
            if body.get("n") in self.held:
                await self.gate.wait()
            await asyncio.sleep(self.delay_s)
        except asyncio.CancelledError:
            self.num_cancelled += 1
            raise
        finally:
            self.in_flight -= 1
        if body.get("busy"):
            left = self._busy_left.setdefault(body["n"], body["busy"])
            if left:
                self._busy_left[body["n"]] = left - 1
                error = {"error": {"message": "busy", "type": "server_overloaded", "param": None, "code": "queue_full"}}
                return LineResult(503, error, "req-busy", retry_after_s=0.01)
        if body.get("fail"):
            error = {"error": {"message": "bad line", "type": "invalid_request_error", "param": "x", "code": None}}
            return LineResult(400, error, f"req-{body.get('n')}")
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 1}}
        return LineResult(200, {"echo": body.get("n"), "usage": usage}, f"req-{body.get('n')}")

    def max_in_flight(self, endpoint: str, model: str | None) -> int:
        return self.concurrency
