"""The batch runner with a scripted executor: it runs every line once, in a
bounded number at a time, persists as it goes, resumes after a crash, and
honours cancel and expiry."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from localserve.jobs.runner import BatchRunner, RunnerConfig
from localserve.jobs.store import JobStore
from localserve.jobs.types import BatchRecord, BatchStatus, LineRef
from localserve.jobs.validate import Limits
from tests.jobs.fakes import ENDPOINT, FakeExecutor, read_jsonl, request_line, write_input

DAY = 24 * 3600


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[JobStore]:
    s = JobStore(tmp_path / "jobs")
    yield s
    await asyncio.to_thread(s.close)


async def wait_for(
    store: JobStore, batch_id: str, done: Callable[[BatchRecord], bool], timeout: float = 10
) -> BatchRecord:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        batch = await store.call(store.get_batch, batch_id)
        if done(batch):
            return batch
        assert asyncio.get_running_loop().time() < deadline, f"batch stuck in {batch.status.value}: {batch}"
        await asyncio.sleep(0.01)


def finished(batch: BatchRecord) -> bool:
    return batch.status.terminal


async def submit(store: JobStore, runner: BatchRunner, lines: list[str], window_s: int = DAY) -> BatchRecord:
    source = write_input(store, lines)
    batch = await store.call(store.create_batch, ENDPOINT, source.id, "24h", window_s, None)
    runner.notify(batch)
    return batch


async def start(store: JobStore, executor: FakeExecutor, **config: object) -> BatchRunner:
    runner = BatchRunner(store, executor, RunnerConfig(**config))  # type: ignore[arg-type]
    await runner.start()
    return runner


async def test_runs_every_line_once_in_bounded_numbers(store: JobStore) -> None:
    executor = FakeExecutor(concurrency=3, delay_s=0.005)
    runner = await start(store, executor)
    lines = [request_line(f"c{i}", n=i) for i in range(25)] + [request_line("bad", n=99, fail=True)]
    batch = await submit(store, runner, lines)
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert done.status is BatchStatus.COMPLETED
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert (done.num_total, done.num_completed, done.num_failed) == (26, 25, 1)
    assert done.usage == {"input_tokens": 75, "cached_tokens": 25, "output_tokens": 50}
    assert sorted(executor.calls) == sorted([*range(25), 99])
    assert executor.max_in_flight_seen == 3
    output = read_jsonl(store.blob_path(done.output_file_id))
    assert [o["custom_id"] for o in output] == [f"c{i}" for i in range(25)]  # input order
    first = output[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"] == {"status_code": 200, "request_id": "req-0", "body": first["response"]["body"]}
    assert first["response"]["body"]["echo"] == 0
    (error,) = read_jsonl(store.blob_path(done.error_file_id))
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["message"] == "bad line"
    assert store.get_file(done.output_file_id).purpose == "batch_output"
    assert runner.snapshot()[-1]["request_counts"] == {"total": 26, "completed": 25, "failed": 1}


async def test_malformed_file_fails_with_errors_and_runs_nothing(store: JobStore) -> None:
    executor = FakeExecutor()
    runner = await start(store, executor)
    batch = await submit(store, runner, [request_line("a"), "{oops", request_line("a")])
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert done.status is BatchStatus.FAILED and done.failed_at
    wire = done.to_openai()["errors"]
    assert wire["object"] == "list"
    assert [(e["code"], e["line"]) for e in wire["data"]] == [("invalid_json_line", 2), ("duplicate_custom_id", 3)]
    assert executor.calls == [] and done.output_file_id is None


async def test_busy_answers_are_retried_not_recorded(store: JobStore) -> None:
    executor = FakeExecutor()
    runner = await start(store, executor, retry_wait_s=0.01)
    batch = await submit(store, runner, [request_line("a", n=1, busy=3), request_line("b", n=2)])
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert (done.num_completed, done.num_failed) == (2, 0)
    assert executor.calls.count(1) == 4
    assert [s["attempts"] for s in store.line_stats(batch.id)] == [1, 1]


async def test_cancel_stops_lines_and_keeps_partial_output(store: JobStore) -> None:
    executor = FakeExecutor(concurrency=2)
    executor.held = {2, 3, 4, 5}
    runner = await start(store, executor)
    batch = await submit(store, runner, [request_line(f"c{i}", n=i) for i in range(6)])
    await wait_for(store, batch.id, lambda b: b.num_completed >= 2)
    while executor.in_flight < 2:
        await asyncio.sleep(0.01)
    cancelling = await store.call(store.request_cancel, batch.id)
    runner.cancel(cancelling)
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert done.status is BatchStatus.CANCELLED and done.cancelling_at and done.cancelled_at
    assert executor.num_cancelled == 2, "lines in flight are aborted"
    assert len(executor.calls) == 4, "no line starts after the cancel"
    assert len(read_jsonl(store.blob_path(done.output_file_id))) == done.num_completed == 2
    errors = read_jsonl(store.blob_path(done.error_file_id))
    assert [e["error"]["code"] for e in errors] == ["batch_cancelled"] * 4
    assert all(e["response"] is None for e in errors)


async def test_cancel_while_queued_behind_another_batch(store: JobStore) -> None:
    executor = FakeExecutor(concurrency=1)
    executor.held = {1}
    runner = await start(store, executor)
    first = await submit(store, runner, [request_line("a", n=1)])
    second = await submit(store, runner, [request_line("b", n=2)])
    await wait_for(store, second.id, lambda b: b.status is BatchStatus.IN_PROGRESS)
    runner.cancel(await store.call(store.request_cancel, second.id))
    done = await wait_for(store, second.id, finished)
    assert done.status is BatchStatus.CANCELLED and done.num_completed == 0
    executor.gate.set()
    assert (await wait_for(store, first.id, finished)).status is BatchStatus.COMPLETED
    await runner.stop()
    assert executor.calls == [1]


async def test_expiry_marks_the_rest_batch_expired(store: JobStore) -> None:
    executor = FakeExecutor(concurrency=1, delay_s=0.3)
    runner = await start(store, executor)
    batch = await submit(store, runner, [request_line(f"c{i}", n=i) for i in range(20)], window_s=1)
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert done.status is BatchStatus.EXPIRED and done.expired_at
    assert done.num_completed < 20
    errors = read_jsonl(store.blob_path(done.error_file_id))
    assert len(errors) == 20 - done.num_completed
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


async def test_restart_resumes_without_redoing_finished_lines(store: JobStore) -> None:
    executor = FakeExecutor(concurrency=2, delay_s=0.01)
    runner = await start(store, executor)
    batch = await submit(store, runner, [request_line(f"c{i}", n=i) for i in range(30)])
    await wait_for(store, batch.id, lambda b: b.num_completed >= 10)
    await runner.stop()  # as a kill would: lines in flight are lost
    done_before = {s["custom_id"] for s in store.line_stats(batch.id) if s["finished_at"]}
    assert 10 <= len(done_before) < 30
    executor2 = FakeExecutor(concurrency=2)
    runner2 = await start(store, executor2)
    done = await wait_for(store, batch.id, finished)
    await runner2.stop()
    assert done.status is BatchStatus.COMPLETED and done.num_completed == 30
    assert not {f"c{n}" for n in executor2.calls} & done_before, "finished lines are not redone"
    stats = store.line_stats(batch.id)
    assert all(s["attempts"] == 1 for s in stats if s["custom_id"] in done_before)
    assert sum(s["attempts"] for s in stats) <= 30 + 2  # at most the lines that were in flight ran twice
    assert sorted(o["custom_id"] for o in read_jsonl(store.blob_path(done.output_file_id))) == sorted(
        f"c{i}" for i in range(30)
    )


async def test_restart_finishes_a_batch_caught_finalizing(store: JobStore) -> None:
    source = write_input(store, [request_line("a", n=1)])
    batch = store.create_batch(ENDPOINT, source.id, "24h", DAY, None)
    store.start_batch(batch.id, [LineRef(1, "a", 0, 10)], "m")
    store.set_status(batch.id, BatchStatus.FINALIZING)  # as left by a crash
    executor = FakeExecutor()
    runner = await start(store, executor)
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert done.status is BatchStatus.COMPLETED and executor.calls == []
    # The line has no result: it is reported, not silently dropped.
    assert read_jsonl(store.blob_path(done.error_file_id))[0]["error"]["code"] == "internal_error"


async def test_validation_limits_come_from_the_config(store: JobStore) -> None:
    runner = await start(store, FakeExecutor(), limits=Limits(max_lines=2))
    batch = await submit(store, runner, [request_line(f"c{i}") for i in range(3)])
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert done.status is BatchStatus.FAILED and done.errors[0]["code"] == "too_many_requests"


async def test_the_batch_model_is_held_while_its_lines_run(store: JobStore) -> None:
    """Every line runs inside the runner's hold on the batch's model (in the
    server: a hold, so LRU and keep_alive cannot unload it between lines)."""
    executor = FakeExecutor(concurrency=2, delay_s=0.005)
    events: list[str] = []
    held_during: list[bool] = []

    @contextlib.asynccontextmanager
    async def hold(model: str | None) -> AsyncIterator[None]:
        events.append(f"hold {model}")
        try:
            yield
        finally:
            events.append(f"release {model}")

    original = executor.execute

    async def execute(endpoint: str, body: dict[str, object]) -> object:
        held_during.append(events[-1:] == ["hold m"])
        return await original(endpoint, body)

    executor.execute = execute  # type: ignore[method-assign]
    runner = BatchRunner(store, executor, RunnerConfig(), hold_model=hold)
    await runner.start()
    batch = await submit(store, runner, [request_line(f"c{i}", n=i) for i in range(6)])
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert done.status is BatchStatus.COMPLETED and done.num_completed == 6
    assert events == ["hold m", "release m"]  # once per batch, released when it ends
    assert held_during == [True] * 6
