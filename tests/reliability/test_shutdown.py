"""Graceful shutdown. On SIGTERM the server stops accepting connections, lets
the requests in flight finish for up to `--shutdown-timeout` seconds, then
ends the rest with an error, and exits 0:

* a stream still running at the deadline gets a last chunk with
  `finish_reason: "error"`, then one SSE event `data: {"error": {"message":
  SHUTDOWN_MESSAGE, "type": "server_error", "code": "engine_stopped", ...}}`
  and ends without `[DONE]` (the engine ends it with `FinishReason.ERROR`);
* a non-streaming request still running gets a 503 with that envelope and
  `Retry-After` (the request was fine: retry it once the server is back);
* a request that reaches the engine while it drains gets the same 503.

Batch jobs lose nothing: the batch runner stops first (lines in flight are
redone after a restart), and the restarted server finishes the batch."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from localserve.engine.engine import SHUTDOWN_MESSAGE
from tests.api.harness import MODEL_ID, ServerThread
from tests.reliability.conftest import start_server_thread

pytestmark = pytest.mark.slow

SHUTDOWN_TIMEOUT_S = 6.0


def chat(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL_ID, "messages": [{"role": "user", "content": text}], **extra}


class StreamWatcher(threading.Thread):
    """Reads one SSE answer on its own thread, noting when each event came."""

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.url, self.body = f"{base_url}/v1/chat/completions", {**body, "stream": True}
        self.events: list[tuple[float, str]] = []
        self.first_token = threading.Event()
        self.ended_at = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=300) as response:
                assert response.status_code == 200
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append((time.monotonic(), line[6:]))
                        if '"content":"' in line and '"content":""' not in line:
                            self.first_token.set()
        except BaseException as exc:  # noted for the test thread
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.first_token.set()

    def finish_reason(self) -> str | None:
        for _, data in reversed(self.events):
            if data != "[DONE]":
                choices = json.loads(data).get("choices") or [{}]
                if choices[0].get("finish_reason"):
                    return str(choices[0]["finish_reason"])
        return None

    def tokens_after(self, moment: float) -> int:
        return sum(1 for at, data in self.events if at > moment and '"content":"' in data)


# ---- the engine's drain, in process -------------------------------------------------


@pytest.fixture
def drain_server() -> Iterator[ServerThread]:
    srv = start_server_thread(parallel=2, ctx_size=2048, kv_size=4096)
    try:
        yield srv
    finally:
        srv.stop()


def assert_engine_stopped(response: httpx.Response) -> None:
    """A 503 `engine_stopped` envelope that tells the client to retry."""
    assert response.status_code == 503, response.text
    assert response.json()["error"] == {
        "message": SHUTDOWN_MESSAGE,
        "type": "server_error",
        "param": None,
        "code": "engine_stopped",
    }
    assert response.headers["Retry-After"] == "1"
    assert "shutting down" in SHUTDOWN_MESSAGE and "retry" in SHUTDOWN_MESSAGE


def assert_ended_by_shutdown(stream: StreamWatcher) -> None:
    """Its last chunk says `finish_reason: "error"`, then the error event, no `[DONE]`."""
    assert stream.error is None, stream.error
    assert stream.finish_reason() == "error", stream.events[-3:]
    last = json.loads(stream.events[-1][1])
    assert last["error"]["message"] == SHUTDOWN_MESSAGE and last["error"]["code"] == "engine_stopped", last
    assert last["error"]["type"] == "server_error"
    assert all(data != "[DONE]" for _, data in stream.events)


def test_drain_refuses_new_requests_then_ends_the_rest(drain_server: ServerThread) -> None:
    long = StreamWatcher(drain_server.base_url, chat("Write a long essay.", max_tokens=1800, ignore_eos=True))
    plain: list[httpx.Response] = []
    plain_thread = threading.Thread(
        target=lambda: plain.append(
            httpx.post(
                f"{drain_server.base_url}/v1/chat/completions",
                json=chat("Write a book.", max_tokens=1800, ignore_eos=True),
                timeout=300,
            )
        ),
        daemon=True,
    )
    long.start()
    plain_thread.start()
    assert long.first_token.wait(120) and long.error is None
    assert drain_server.wait_in_flight(lambda n: n == 2, timeout=60) == 2
    drained_at = time.monotonic()
    future = asyncio.run_coroutine_threadsafe(drain_server.engine.drain(2.0), drain_server.loop)
    time.sleep(0.3)
    refused = httpx.post(f"{drain_server.base_url}/v1/chat/completions", json=chat("Hi", max_tokens=4), timeout=60)
    assert_engine_stopped(refused)
    assert future.result(60) == 2  # the long stream and the non-streaming request were ended
    long.join(60)
    plain_thread.join(60)
    # The stream went on while the drain waited, then ended with an error finish and event.
    assert long.tokens_after(drained_at + 0.5) > 0
    assert long.ended_at - drained_at >= 1.5  # not before the drain's deadline (2 s)
    assert_ended_by_shutdown(long)
    assert plain, "the non-streaming request got no answer"
    assert_engine_stopped(plain[0])
    assert drain_server.num_in_flight() == 0


# ---- SIGTERM on a real server process -----------------------------------------------------


def _connect_refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def test_sigterm_drains_then_exits_zero(server_process: Any) -> None:
    srv = server_process(
        "--parallel", "4", "--ctx-size", "4096", "--kv-size", "8192", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)
    )
    short = StreamWatcher(srv.base_url, chat("Say hello.", max_tokens=12, ignore_eos=True))
    long = StreamWatcher(srv.base_url, chat("Write a long essay.", max_tokens=3500, ignore_eos=True))
    plain: list[httpx.Response] = []
    plain_thread = threading.Thread(
        target=lambda: plain.append(
            httpx.post(
                f"{srv.base_url}/v1/chat/completions",
                json=chat("Write a book.", max_tokens=3500, ignore_eos=True),
                timeout=300,
            )
        ),
        daemon=True,
    )
    long.start()
    plain_thread.start()
    assert long.first_token.wait(120) and long.error is None
    short.start()
    assert short.first_token.wait(120) and short.error is None

    srv.terminate()
    signalled_at = time.monotonic()
    refused_at = None
    while time.monotonic() - signalled_at < 30 and refused_at is None:
        if _connect_refused(srv.port):
            refused_at = time.monotonic()
        else:
            time.sleep(0.05)
    for thread in (short, long, plain_thread):
        thread.join(SHUTDOWN_TIMEOUT_S + 120)
    exit_code = srv.wait(60)
    log = srv.log()

    assert exit_code == 0, log
    # No new connections once the signal is handled, while the long stream still ran.
    assert refused_at is not None and refused_at < long.ended_at, log
    # The short request, in flight at the signal, finished normally.
    assert short.error is None and short.events[-1][1] == "[DONE]", short.events[-3:]
    assert short.finish_reason() == "length"
    # The long stream went on during the drain, then ended with the error finish and event at the deadline.
    assert long.tokens_after(signalled_at + 0.5) > 0
    assert long.ended_at - signalled_at >= 0.8 * SHUTDOWN_TIMEOUT_S
    assert_ended_by_shutdown(long)
    # The non-streaming one: a 503 envelope that says why and to retry.
    assert plain, "the non-streaming request got no answer"
    assert_engine_stopped(plain[0])
    assert "ended 2 requests still running" in log
    print(
        f"\nSIGTERM: connections refused after {refused_at - signalled_at:.2f} s; short stream done "
        f"after {short.ended_at - signalled_at:.2f} s; long stream ended after {long.ended_at - signalled_at:.2f} s "
        f"(timeout {SHUTDOWN_TIMEOUT_S} s); exit code {exit_code}"
    )


def test_a_second_sigterm_ends_the_drain_at_once(server_process: Any) -> None:
    """A second SIGTERM while the server drains (a long --shutdown-timeout):
    the requests still running end now, as at the timeout (the error finish
    and event, not a stream cut mid-chunk), one log line says so, and the
    server exits 0 as after one signal."""
    srv = server_process("--parallel", "2", "--ctx-size", "4096", "--kv-size", "8192", "--shutdown-timeout", "300")
    long = StreamWatcher(srv.base_url, chat("Write a long essay.", max_tokens=3500, ignore_eos=True))
    long.start()
    assert long.first_token.wait(120) and long.error is None
    srv.terminate()
    time.sleep(1.5)
    assert long.is_alive(), "the stream ended at the first signal: nothing was tested"
    second_at = time.monotonic()
    srv.terminate()
    long.join(60)
    exit_code = srv.wait(60)
    log = srv.log()
    assert exit_code == 0, log
    assert long.ended_at - second_at < 15, log  # not the 300 s drain
    assert_ended_by_shutdown(long)
    lines = [line for line in log.splitlines() if "SIGTERM again" in line]
    assert len(lines) == 1 and "ended the 1 requests still running" in lines[0], log
    assert "Traceback" not in log, log


def _batch_lines(num_lines: int) -> bytes:
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": chat(f"Tell me about the number {i}.", max_tokens=16, ignore_eos=True),
        }
        for i in range(num_lines)
    ]
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


def _wait_batch(base_url: str, batch_id: str, done: Any, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        batch = httpx.get(f"{base_url}/v1/batches/{batch_id}", timeout=30).json()
        if done(batch) or time.monotonic() > deadline:
            return batch
        time.sleep(0.2)


def test_sigterm_loses_no_batch_work(server_process: Any, tmp_path: Path) -> None:
    num_lines = 20
    args = ("--parallel", "4", "--ctx-size", "512", "--kv-size", "2048", "--shutdown-timeout", "10")
    first = server_process(*args, home=tmp_path)
    upload = httpx.post(
        f"{first.base_url}/v1/files",
        files={"file": ("batch.jsonl", _batch_lines(num_lines))},
        data={"purpose": "batch"},
        timeout=60,
    )
    assert upload.status_code == 200, upload.text
    created = httpx.post(
        f"{first.base_url}/v1/batches",
        json={"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        timeout=60,
    )
    assert created.status_code == 200, created.text
    batch_id = created.json()["id"]
    batch = _wait_batch(first.base_url, batch_id, lambda b: b["request_counts"]["completed"] >= 2, timeout=180)
    first.terminate()
    assert first.wait(60) == 0, first.log()
    at_signal = batch["request_counts"]
    assert at_signal["completed"] < num_lines, "the batch finished before the signal: nothing was tested"

    second = server_process(*args, home=tmp_path)
    final = _wait_batch(
        second.base_url, batch_id, lambda b: b["status"] in ("completed", "failed", "cancelled", "expired"), 300
    )
    assert final["status"] == "completed", final
    assert final["request_counts"] == {"total": num_lines, "completed": num_lines, "failed": 0}, final
    output = httpx.get(f"{second.base_url}/v1/files/{final['output_file_id']}/content", timeout=60)
    rows = [json.loads(line) for line in output.text.splitlines() if line.strip()]
    assert sorted(row["custom_id"] for row in rows) == sorted(f"line-{i}" for i in range(num_lines))
    assert all(row["response"]["status_code"] == 200 for row in rows)
    print(f"\nbatch across SIGTERM: {at_signal} at the signal, {final['request_counts']} after the restart")
    assert not final.get("error_file_id")
