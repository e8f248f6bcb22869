"""The job store: files, batches, per-line results, crash leftovers."""

from __future__ import annotations

from pathlib import Path

import pytest

from localserve.errors import InvalidRequestError, JobStoreBusyError, NotFoundError
from localserve.jobs.store import JobStore
from localserve.jobs.types import BatchStatus, LineRef, LineResult
from tests.jobs.fakes import request_line, write_input

DAY = 24 * 3600


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    s = JobStore(tmp_path / "jobs")
    yield s
    s.close()


def test_file_round_trip_and_blob(store: JobStore) -> None:
    record = write_input(store, [request_line("a")])
    assert record.id.startswith("file-") and record.purpose == "batch"
    assert store.get_file(record.id) == record
    assert store.blob_path(record.id).read_bytes().startswith(b'{"custom_id"')
    assert record.to_openai()["object"] == "file" and record.to_openai()["bytes"] == record.num_bytes
    store.delete_file(record.id)
    assert not store.blob_path(record.id).exists()
    with pytest.raises(NotFoundError):
        store.get_file(record.id)


def test_file_list_pages_newest_first_and_filters_purpose(store: JobStore) -> None:
    ids = [write_input(store, ["x"]).id for _ in range(5)]
    other = store.temp_path()
    other.write_text("notes")
    store.add_file(other, "notes.txt", "user_data")
    page, more = store.list_files(purpose="batch", limit=2)
    assert [f.id for f in page] == ids[::-1][:2] and more
    page, more = store.list_files(purpose="batch", limit=10, after=page[-1].id)
    assert [f.id for f in page] == ids[::-1][2:] and not more
    ascending, _ = store.list_files(purpose="batch", order="asc")
    assert [f.id for f in ascending] == ids
    with pytest.raises(InvalidRequestError):
        store.list_files(after="file-nope")


def test_batch_life_and_line_results(store: JobStore) -> None:
    source = write_input(store, [request_line("a"), request_line("b")])
    batch = store.create_batch("/v1/chat/completions", source.id, "24h", DAY, {"k": "v"})
    assert batch.status is BatchStatus.VALIDATING and batch.expires_at == batch.created_at + DAY
    refs = [LineRef(1, "a", 0, 10), LineRef(2, "b", 10, 10)]
    batch = store.start_batch(batch.id, refs, "m")
    assert batch.status is BatchStatus.IN_PROGRESS and batch.in_progress_at and batch.num_total == 2
    store.start_line(batch.id, 1)
    usage = {"usage": {"prompt_tokens": 5, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 2}}}
    assert store.finish_line(batch.id, 1, LineResult(200, usage, "r1"))
    assert not store.finish_line(batch.id, 1, LineResult(200, usage, "r1")), "a line is counted once"
    store.finish_line(batch.id, 2, LineResult(400, {"error": {}}, "r2"))
    batch = store.get_batch(batch.id)
    assert (batch.num_completed, batch.num_failed) == (1, 1)
    assert batch.usage == {"input_tokens": 5, "cached_tokens": 2, "output_tokens": 7}
    assert store.pending_lines(batch.id) == []
    assert [s["attempts"] for s in store.line_stats(batch.id)] == [1, 0]
    wire = batch.to_openai()
    assert wire["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    assert wire["usage"]["total_tokens"] == 12 and wire["metadata"] == {"k": "v"}


def test_batch_needs_a_batch_file(store: JobStore) -> None:
    notes = store.temp_path()
    notes.write_text("x")
    record = store.add_file(notes, "n.txt", "user_data")
    with pytest.raises(InvalidRequestError, match="purpose 'batch'"):
        store.create_batch("/v1/chat/completions", record.id, "24h", DAY, None)
    with pytest.raises(NotFoundError):
        store.create_batch("/v1/chat/completions", "file-missing", "24h", DAY, None)


def test_cancel_rules_and_input_file_is_kept_while_running(store: JobStore) -> None:
    source = write_input(store, [request_line("a")])
    batch = store.create_batch("/v1/chat/completions", source.id, "24h", DAY, None)
    with pytest.raises(InvalidRequestError, match="has not finished"):
        store.delete_file(source.id)
    assert store.request_cancel(batch.id).status is BatchStatus.CANCELLING
    assert store.request_cancel(batch.id).status is BatchStatus.CANCELLING  # idempotent
    # A validation that ends after the cancel does not undo it.
    assert store.start_batch(batch.id, [], None).status is BatchStatus.CANCELLING
    store.finish_batch(batch.id, BatchStatus.CANCELLED, {})
    with pytest.raises(InvalidRequestError, match="cannot be cancelled"):
        store.request_cancel(batch.id)
    store.delete_file(source.id)


def test_batch_list_pages(store: JobStore) -> None:
    source = write_input(store, [request_line("a")])
    ids = [store.create_batch("/v1/completions", source.id, "24h", DAY, None).id for _ in range(5)]
    page, more = store.list_batches(limit=3)
    assert [b.id for b in page] == ids[::-1][:3] and more
    page, more = store.list_batches(limit=3, after=page[-1].id)
    assert [b.id for b in page] == ids[::-1][3:] and not more


def test_reopen_keeps_everything_and_drops_orphan_blobs(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs")
    source = write_input(store, [request_line("a")])
    batch = store.create_batch("/v1/chat/completions", source.id, "24h", DAY, None)
    orphan = store.blobs / "file-never-committed"
    orphan.write_text("half")
    store.temp_path().write_text("upload in progress")
    store.close()
    again = JobStore(tmp_path / "jobs")
    try:
        assert again.get_batch(batch.id).status is BatchStatus.VALIDATING
        assert again.get_file(source.id).num_bytes == source.num_bytes
        assert sorted(p.name for p in again.blobs.iterdir()) == [source.id]
    finally:
        again.close()


def test_one_process_at_a_time_runs_a_data_directory(store: JobStore) -> None:
    with pytest.raises(JobStoreBusyError, match="another localserve process"):
        JobStore(store.root)
