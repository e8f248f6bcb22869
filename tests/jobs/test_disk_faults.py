"""The job store and the batch runner on a full or read-only disk: every
write site meets `OSError(ENOSPC)` / SQLite's "database or disk is full"
(injected here, real on a filled tmpfs below); the batch pauses, nothing
accepted is lost or run twice, and it finishes once the disk takes writes
again, or fails after the timeout with an error file that says why."""

from __future__ import annotations

import asyncio
import errno
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from localserve.disk import is_disk_full, is_read_only, is_storage_error
from localserve.jobs import output as output_module
from localserve.jobs.runner import BatchRunner, RunnerConfig
from localserve.jobs.store import JobStore
from localserve.jobs.types import BatchStatus
from tests.fixtures.small_disk import fill, small_tmpfs
from tests.jobs.fakes import FakeExecutor, read_jsonl, request_line
from tests.jobs.test_runner import finished, submit, wait_for

FAST = {"storage_retry_s": 0.02, "sweep_interval_s": 0.05}


def enospc() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


def sqlite_full() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("database or disk is full")


class Failing:
    """Wraps a store method: the first `times` calls raise `error()` (None: until `heal()`)."""

    def __init__(self, method: Callable[..., Any], error: Callable[[], BaseException], times: int | None) -> None:
        self.method, self.error, self.times = method, error, times
        self.num_failed = 0

    def heal(self) -> None:
        self.times = self.num_failed

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.times is None or self.num_failed < self.times:
            self.num_failed += 1
            raise self.error()
        return self.method(*args, **kwargs)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[JobStore]:
    s = JobStore(tmp_path / "jobs")
    yield s
    await asyncio.to_thread(s.close)


async def run_batch(store: JobStore, executor: FakeExecutor, num_lines: int, **config: Any) -> tuple[Any, Any]:
    runner = BatchRunner(store, executor, RunnerConfig(**{**FAST, **config}))
    await runner.start()
    batch = await submit(store, runner, [request_line(f"c{i}", n=i) for i in range(num_lines)])
    return runner, batch


def test_storage_errors_are_recognised() -> None:
    assert is_disk_full(enospc()) and is_disk_full(OSError(errno.EDQUOT, "quota")) and is_disk_full(sqlite_full())
    assert is_read_only(OSError(errno.EROFS, "ro")) and is_read_only(sqlite3.OperationalError("readonly database"))
    assert not is_storage_error(OSError(errno.ENOENT, "gone")) and not is_storage_error(sqlite3.OperationalError("x"))


@pytest.mark.parametrize("site", ["start_line", "finish_line", "start_batch", "set_status", "finish_batch"])
@pytest.mark.parametrize("error", [enospc, sqlite_full])
async def test_each_write_site_pauses_and_loses_nothing(
    store: JobStore, site: str, error: Callable[[], BaseException]
) -> None:
    failing = Failing(getattr(store, site), error, times=3)
    setattr(store, site, failing)
    executor = FakeExecutor(concurrency=2)
    runner, batch = await run_batch(store, executor, 6)
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert failing.num_failed == 3
    assert done.status is BatchStatus.COMPLETED and done.num_completed == 6 and done.num_failed == 0
    assert sorted(executor.calls) == list(range(6))  # every line ran exactly once
    output = read_jsonl(store.blob_path(done.output_file_id))
    assert [o["custom_id"] for o in output] == [f"c{i}" for i in range(6)]
    assert not list(store.blobs.glob(".tmp-*"))  # no temporary file left behind


async def test_output_file_write_fails_then_is_written_whole(store: JobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    real = output_module.write_outputs
    calls = []

    def full_disk_twice(*args: Any) -> Any:
        calls.append(1)
        if len(calls) <= 2:
            paths = real(*args)  # temporary files written, then the disk fills before they are published
            for kept in paths.values():
                if kept is not None:
                    kept[0].unlink()
            raise enospc()
        return real(*args)

    monkeypatch.setattr(output_module, "write_outputs", full_disk_twice)
    executor = FakeExecutor()
    runner, batch = await run_batch(store, executor, 4)
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert len(calls) == 3 and done.status is BatchStatus.COMPLETED
    assert len(read_jsonl(store.blob_path(done.output_file_id))) == 4
    files, _ = store.list_files(purpose="batch_output")
    assert len(files) == 1  # the failed tries published nothing


async def test_answers_wait_in_memory_while_the_disk_is_full(store: JobStore) -> None:
    failing = Failing(store.finish_line, sqlite_full, times=None)
    store.finish_line = failing  # type: ignore[method-assign]
    executor = FakeExecutor(concurrency=3)
    runner, batch = await run_batch(store, executor, 5)
    await wait_for(store, batch.id, lambda b: failing.num_failed >= 10, timeout=10)
    paused = await store.call(store.get_batch, batch.id)
    assert paused.status is BatchStatus.IN_PROGRESS and runner.storage.paused_since is not None
    assert len(executor.calls) == 3  # no new line starts beyond those in flight
    failing.heal()
    done = await wait_for(store, batch.id, finished)
    await runner.stop()
    assert done.status is BatchStatus.COMPLETED and done.num_completed == 5
    assert sorted(executor.calls) == list(range(5))
    assert runner.storage.paused_since is None


async def test_a_disk_full_past_the_timeout_fails_the_batch_saying_why(store: JobStore) -> None:
    store.finish_line = Failing(store.finish_line, enospc, times=None)  # type: ignore[method-assign]
    publish = Failing(store.finish_batch, enospc, times=2)  # the error file waits for room too
    store.finish_batch = publish  # type: ignore[method-assign]
    executor = FakeExecutor(concurrency=2)
    runner, batch = await run_batch(store, executor, 4, storage_timeout_s=0.3)
    done = await wait_for(store, batch.id, finished, timeout=20)
    await runner.stop()
    assert publish.num_failed == 2 and sorted(executor.calls) == [0, 1]  # nothing new starts, nothing runs twice
    assert done.status is BatchStatus.FAILED and done.failed_at
    assert done.errors is not None and done.errors[0]["code"] == "insufficient_storage"
    assert "full for more than 0.3 s" in done.errors[0]["message"]
    assert done.output_file_id is None
    errors = read_jsonl(store.blob_path(done.error_file_id))
    assert [e["custom_id"] for e in errors] == [f"c{i}" for i in range(4)]
    assert all(e["error"]["code"] == "insufficient_storage" and e["response"] is None for e in errors)


async def test_real_full_tmpfs_pauses_the_batch_until_space_is_back(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        store = JobStore(disk / "jobs")
        try:
            executor = FakeExecutor(concurrency=2)
            executor.held = {0, 1, 2, 3}  # wait at the gate until the disk is full
            runner, batch = await run_batch(store, executor, 12)
            await wait_for(store, batch.id, lambda b: len(executor.calls) >= 2, timeout=10)
            filler = fill(disk)
            executor.gate.set()
            await wait_for(store, batch.id, lambda b: runner.storage.paused_since is not None, timeout=10)
            still = await store.call(store.get_batch, batch.id)
            assert still.status is BatchStatus.IN_PROGRESS
            filler.unlink()
            done = await wait_for(store, batch.id, finished, timeout=30)
            await runner.stop()
            assert done.status is BatchStatus.COMPLETED and done.num_completed == 12
            assert sorted(executor.calls) == list(range(12))
            assert [o["custom_id"] for o in read_jsonl(store.blob_path(done.output_file_id))] == [
                f"c{i}" for i in range(12)
            ]
        finally:
            await asyncio.to_thread(store.close)


def test_a_store_that_cannot_open_on_a_full_disk_opens_once_space_is_back(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        JobStore(disk / "jobs").close()  # made while there was room
        filler = fill(disk)
        with pytest.raises((OSError, sqlite3.Error)) as raised:  # SQLite must make its -shm file
            JobStore(disk / "jobs")
        assert is_storage_error(raised.value)
        filler.unlink()
        store = JobStore(disk / "jobs")  # the failed try left nothing locked or open
        try:
            tmp = store.temp_path()
            tmp.write_text('{"a": 1}\n')
            record = store.add_file(tmp, "in.jsonl", "batch")
            assert store.get_file(record.id).num_bytes == 9
        finally:
            store.close()


async def test_batch_run_on_a_full_output_disk_keeps_its_answers_for_the_rerun(tmp_path: Path) -> None:
    from localserve.jobs.offline import run_file
    from tests.jobs.test_offline import opener, write

    source = write(tmp_path / "in.jsonl", [request_line(f"c{i}", n=i) for i in range(8)])
    with small_tmpfs(tmp_path / "out", "1m") as out:
        output = out / "answers.jsonl"
        filler = fill(out)
        first = FakeExecutor(concurrency=2)
        with pytest.raises(OSError) as raised:
            await run_file(source, str(output), opener(first, []), work_dir=tmp_path / "work")
        assert is_disk_full(raised.value)
        assert not output.exists() and [p.name for p in out.iterdir()] == ["filler"]  # no half file
        filler.unlink()
        second = FakeExecutor()
        summary = await run_file(source, str(output), opener(second, []), work_dir=tmp_path / "work")
        assert sorted(first.calls) == list(range(8)) and second.calls == []  # the journal kept every answer
        assert [line["custom_id"] for line in read_jsonl(output)] == [f"c{i}" for i in range(8)]
        assert summary.num_skipped == 8
