"""The Files and Batch APIs against the shared real server (SmolLM2), through
the official `openai` SDK: upload, create, poll, download; a bad line; a
malformed file; cancel; pagination; and interactive requests overtaking
batch lines that wait in the scheduler."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from localserve.api.admin.stats_json import request_json
from localserve.api.openai.batch_service import JOBS
from localserve.api.state import REGISTRY
from tests.api.harness import MODEL_ID, ServerThread

pytestmark = pytest.mark.slow

POLL_TIMEOUT_S = 300  # generous: a loaded 2-core machine is slow, the answer is not


def chat_line(custom_id: str, content: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def upload(client: openai.OpenAI, lines: list[Any], name: str = "batch.jsonl") -> str:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    return client.files.create(file=(name, text.encode()), purpose="batch").id


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = POLL_TIMEOUT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch.request_counts}"
        time.sleep(0.2)


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line.strip()]


def test_round_trip_every_custom_id_once(client: openai.OpenAI, http: httpx.Client, server: ServerThread) -> None:
    lines = [chat_line(f"req-{i}", f"Name a color. ({i})", temperature=0) for i in range(24)]
    lines[0]["body"]["stream"] = True  # a batch answers whole: stream is ignored
    input_id = upload(client, lines)
    created = client.batches.create(
        input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"job": "colors"}
    )
    assert created.object == "batch" and created.status == "validating" and created.metadata == {"job": "colors"}
    assert created.expires_at == created.created_at + 24 * 3600
    batch = wait_done(client, created.id)
    assert batch.status == "completed", batch.errors
    assert (
        batch.request_counts.total == 24 and batch.request_counts.completed == 24 and batch.request_counts.failed == 0
    )
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at and batch.error_file_id is None
    assert batch.model == MODEL_ID and batch.usage.output_tokens > 0
    output = jsonl(client, batch.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(24))
    for o in output:
        assert o["id"].startswith("batch_req_") and o["error"] is None
        assert o["response"]["status_code"] == 200 and o["response"]["request_id"]
        body = o["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == MODEL_ID
        assert body["choices"][0]["message"]["content"] and 1 <= body["usage"]["completion_tokens"] <= 8
    assert client.files.retrieve(batch.output_file_id).purpose == "batch_output"
    registry = server.app[REGISTRY]  # every line gave back its hold on the model
    assert server.call(lambda: registry.records[MODEL_ID].num_users) == 0
    stats = http.get("/api/v1/stats").json()["batches"]
    assert {"id": batch.id, "status": "completed", "endpoint": "/v1/chat/completions", "model": MODEL_ID,
            "request_counts": {"total": 24, "completed": 24, "failed": 0}, "created_at": batch.created_at} in stats  # fmt: skip


def test_completions_batch_under_api_v1_prefix(client: openai.OpenAI, server: ServerThread) -> None:
    api_v1 = openai.OpenAI(base_url=f"{server.base_url}/api/v1", api_key=client.api_key, max_retries=0)
    lines = [
        {"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions",
         "body": {"model": MODEL_ID, "prompt": f"{i} + {i} =", "max_tokens": 4}}
        for i in range(3)
    ]  # fmt: skip
    batch = api_v1.batches.create(
        input_file_id=upload(api_v1, lines), endpoint="/v1/completions", completion_window="24h"
    )
    batch = wait_done(api_v1, batch.id)
    output = jsonl(api_v1, batch.output_file_id)
    assert batch.status == "completed" and len(output) == 3
    assert {o["response"]["body"]["object"] for o in output} == {"text_completion"}


def test_one_bad_line_lands_in_the_error_file(client: openai.OpenAI) -> None:
    lines = [chat_line(f"ok-{i}", "Say yes.", max_tokens=4) for i in range(3)]
    lines.insert(1, {"custom_id": "broken", "method": "POST", "url": "/v1/chat/completions",
                     "body": {"model": MODEL_ID, "messages": [], "max_tokens": 4}})  # fmt: skip
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_done(client, batch.id)
    assert batch.status == "completed"
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    assert sorted(o["custom_id"] for o in jsonl(client, batch.output_file_id)) == ["ok-0", "ok-1", "ok-2"]
    (error,) = jsonl(client, batch.error_file_id)
    assert error["custom_id"] == "broken" and error["error"] is None
    assert error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["param"] == "messages"
    assert error["response"]["body"]["error"]["type"] == "invalid_request_error"


def test_malformed_file_fails_validation(client: openai.OpenAI) -> None:
    lines: list[Any] = [chat_line("a", "hi"), "{this is not json", chat_line("a", "dup"), chat_line("b", "hi")]
    lines[3]["url"] = "/v1/embeddings"
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_done(client, batch.id, timeout=60)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert batch.errors.object == "list"
    found = [(e.code, e.line, e.param) for e in batch.errors.data]
    assert found == [("invalid_json_line", 2, None), ("duplicate_custom_id", 3, "custom_id"), ("invalid_url", 4, "url")]
    assert all(e.message for e in batch.errors.data)


def test_cancel_keeps_partial_output(client: openai.OpenAI) -> None:
    lines = [chat_line(f"long-{i}", "Write a long story about the sea.", max_tokens=64) for i in range(48)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).status == "validating":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    batch = wait_done(client, batch.id, timeout=60)
    assert batch.status == "cancelled" and batch.cancelled_at
    output, errors = jsonl(client, batch.output_file_id), jsonl(client, batch.error_file_id)
    assert len(output) == batch.request_counts.completed < 48
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert sorted(o["custom_id"] for o in output + errors) == sorted(f"long-{i}" for i in range(48))
    with pytest.raises(openai.BadRequestError, match="cannot be cancelled"):
        client.batches.cancel(batch.id)


def test_list_pagination(client: openai.OpenAI) -> None:
    input_id = upload(client, [chat_line("x", "Hi", max_tokens=1)])
    ids = [client.batches.create(input_file_id=input_id, endpoint="/v1/chat/completions", completion_window="24h").id
           for _ in range(3)]  # fmt: skip
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    second = client.batches.list(limit=2, after=first.data[-1].id)
    assert second.data[0].id == ids[0]
    every = [b.id for b in client.batches.list(limit=2)]  # the SDK follows `after` by itself
    assert every[:3] == ids[::-1] and len(every) == len(set(every))
    for batch_id in ids:
        wait_done(client, batch_id)


def test_files_api(client: openai.OpenAI, http: httpx.Client) -> None:
    notes = client.files.create(file=("notes.txt", b"hello files"), purpose="user_data")
    assert (notes.object, notes.bytes, notes.filename, notes.purpose) == ("file", 11, "notes.txt", "user_data")
    assert client.files.retrieve(notes.id).id == notes.id
    assert client.files.content(notes.id).content == b"hello files"
    assert notes.id in [f.id for f in client.files.list(purpose="user_data")]
    assert notes.id not in [f.id for f in client.files.list(purpose="batch")]
    with pytest.raises(openai.BadRequestError, match="purpose 'batch'"):
        client.batches.create(input_file_id=notes.id, endpoint="/v1/chat/completions", completion_window="24h")
    deleted = client.files.delete(notes.id)
    assert deleted.deleted and deleted.id == notes.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(notes.id)
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", b"{}"), purpose="nonsense")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=notes.id, endpoint="/v1/chat/completions", completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=notes.id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    assert http.post("/v1/files", json={"purpose": "batch"}).status_code == 400  # not multipart


def test_upload_is_streamed_past_the_body_limit_but_capped(small_server: ServerThread) -> None:
    """A file upload is not a JSON body: the 64 KiB body limit of this server
    does not apply, the file size cap does (413)."""
    client = openai.OpenAI(base_url=f"{small_server.base_url}/v1", api_key="unused", max_retries=0)
    big = b'{"custom_id": "x"}\n' * 10_000  # 190 KB
    assert client.files.create(file=("big.jsonl", big), purpose="batch").bytes == len(big)
    settings = small_server.settings
    settings.batch_max_file_bytes, saved = 100_000, settings.batch_max_file_bytes
    try:
        with pytest.raises(openai.APIStatusError) as exc:
            client.files.create(file=("big.jsonl", big), purpose="batch")
        assert exc.value.status_code == 413 and "100000 bytes" in exc.value.message
    finally:
        settings.batch_max_file_bytes = saved


@pytest.fixture
def wide_batches(server: ServerThread, client: openai.OpenAI) -> Iterator[None]:
    """Let 48 batch lines be in flight (16 slots): 32 wait in the scheduler."""
    client.files.list(limit=1)  # opens the job store
    executor = server.app[JOBS].runner.executor  # type: ignore[union-attr]
    executor.concurrency = 48  # type: ignore[attr-defined]
    try:
        yield
    finally:
        executor.concurrency = 0  # type: ignore[attr-defined]


def scheduler_requests(server: ServerThread) -> list[dict[str, Any]]:
    """The requests the scheduler holds, as `/api/v1/stats` lists them."""
    sequences = server.call(lambda: server.engine.stats()[MODEL_ID].scheduler.sequences)
    return [request_json(MODEL_ID, seq) for seq in sequences]


def test_interactive_request_overtakes_waiting_batch_lines(
    server: ServerThread, client: openai.OpenAI, wide_batches: None
) -> None:
    """Batch lines queued in the scheduler before an interactive request are
    still waiting when it has its first token (with FIFO they would all have
    started before it). Judged on one consistent scheduler snapshot, not on time."""
    lines = [chat_line(f"bg-{i}", "Tell me about rivers.", max_tokens=16) for i in range(48)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + POLL_TIMEOUT_S
    while True:  # until batch lines wait in the scheduler, not yet started
        waiting = {r["id"] for r in scheduler_requests(server) if r["state"] == "waiting" and r["priority"] >= 2 and not r["generated_tokens"]}  # fmt: skip
        if len(waiting) >= 8:
            break
        assert time.monotonic() < deadline, "batch lines never queued up"
        time.sleep(0.02)

    answer: dict[str, Any] = {}
    patient = client.with_options(timeout=POLL_TIMEOUT_S)
    thread = threading.Thread(
        target=lambda: answer.update(
            reply=patient.chat.completions.create(
                model=MODEL_ID,
                messages=[{"role": "user", "content": "Write a poem."}],
                max_tokens=48,  # long enough to be seen running between two snapshots
                extra_body={"priority": "interactive"},
            )
        )
    )
    thread.start()
    overtaken: set[str] | None = None
    while thread.is_alive() and overtaken is None:
        snapshot = scheduler_requests(server)  # one consistent view of the scheduler
        if any(r["priority"] < 1 and r["generated_tokens"] >= 1 for r in snapshot):
            overtaken = waiting & {r["id"] for r in snapshot if r["state"] == "waiting" and not r["generated_tokens"]}
        time.sleep(0.005)
    thread.join(POLL_TIMEOUT_S)
    assert answer["reply"].choices[0].message.content
    assert overtaken is not None, "never saw the interactive request running"
    assert overtaken, (
        "the interactive request got its first token only after every batch line queued before it had started"
    )
    client.batches.cancel(batch.id)  # the point is made; free the server for the next tests
    assert wait_done(client, batch.id).status == "cancelled"
