"""Where files and batch jobs persist: metadata and per-line progress in
SQLite (WAL), file contents as blobs beside it.

    <data dir>/jobs/jobs.sqlite3     files, batches, lines (one row per request)
    <data dir>/jobs/files/<file id>  the bytes of each file

Every method is synchronous and takes the store's lock; the server calls them
through `call()`, which runs them one after another on the store's own
thread, so the event loop never waits on the disk and writes keep their order.

Durability: each finished line is committed on its own (WAL with
`synchronous=NORMAL`), so a killed process loses at most the lines that were
running; a power cut may lose the last few commits too. A blob is renamed into
place before the row naming it commits, and blobs that no row names are
removed when the store opens, so no reader ever sees half a file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from localserve.errors import InvalidRequestError, JobStoreBusyError, NotFoundError
from localserve.jobs.schema import (
    BATCH_COLUMNS,
    FILE_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    batch_from_row,
    direction,
    file_from_row,
    where_clause,
)
from localserve.jobs.types import (
    UNFINISHED,
    BatchError,
    BatchRecord,
    BatchStatus,
    FileRecord,
    LineRef,
    LineResult,
    new_id,
)

T = TypeVar("T")
Clock = Callable[[], float]

_PAGE = 1000  # rows per query when reading a batch's lines


class JobStore:
    """Files and batches of one data directory. See the module docstring."""

    def __init__(self, root: Path, *, clock: Clock = time.time) -> None:
        self.root = root
        self.blobs = root / "files"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self._lock_file = _lock_exclusively(root / ".lock")
        self.clock = clock
        self._lock = threading.RLock()
        self._db = sqlite3.connect(root / "jobs.sqlite3", check_same_thread=False, isolation_level=None)
        try:
            self._open_schema()
            self._remove_orphan_blobs()
        except BaseException:  # e.g. a full disk: nothing stays open, the next try starts clean
            self._db.close()
            self._lock_file.close()
            raise
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="localserve-jobs")

    def _open_schema(self) -> None:
        # Only what changes is written: an existing store opens on a full disk.
        if self._db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        if self._db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` (a store method, or any function that
        uses the store) on the store's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        with self._lock:
            self._db.close()
        self._lock_file.close()  # releases the lock

    def now(self) -> int:
        return int(self.clock())

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")  # may fail too ("database or disk is full"): then nothing is kept
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # ---- blobs --------------------------------------------------------------------

    def blob_path(self, file_id: str) -> Path:
        return self.blobs / file_id

    def temp_path(self) -> Path:
        """A fresh temporary file name in the blob folder (same file system,
        so `os.replace` into place is atomic)."""
        return self.blobs / f".tmp-{uuid.uuid4().hex}.part"

    def _remove_orphan_blobs(self) -> None:
        known = {row[0] for row in self._query("SELECT id FROM files")}
        for path in self.blobs.iterdir():
            if path.name not in known:
                path.unlink(missing_ok=True)

    # ---- files --------------------------------------------------------------------

    def add_file(
        self, tmp: Path, filename: str, purpose: str, *, expires_at: int | None = None, file_id: str | None = None
    ) -> FileRecord:
        """Take the finished temporary file `tmp` in as a new file."""
        record = FileRecord(
            id=file_id or new_id("file-"),
            filename=filename,
            purpose=purpose,
            num_bytes=tmp.stat().st_size,
            created_at=self.now(),
            expires_at=expires_at,
        )
        moved = False
        try:
            with self._transaction() as db:
                db.execute(
                    f"INSERT INTO files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                    (record.id, filename, purpose, record.num_bytes, record.created_at, expires_at),
                )
                os.replace(tmp, self.blob_path(record.id))  # before COMMIT: a crash leaves an orphan, never a hole
                moved = True
        except BaseException:
            if moved:  # the COMMIT failed (a full disk): no row, so no blob
                self.blob_path(record.id).unlink(missing_ok=True)
            raise
        return record

    def get_file(self, file_id: str) -> FileRecord:
        rows = self._query(f"SELECT {FILE_COLUMNS} FROM files WHERE id = ?", (file_id,))
        if not rows:
            raise NotFoundError(f"No such File object: {file_id}", param="file_id")
        return file_from_row(rows[0])

    def list_files(
        self, *, purpose: str | None = None, after: str | None = None, limit: int = 10_000, order: str = "desc"
    ) -> tuple[list[FileRecord], bool]:
        """A page of files (newest first unless `order="asc"`) and whether more follow."""
        where, params = self._page_filter("files", after, order)
        if purpose:
            where.append("purpose = ?")
            params.append(purpose)
        rows = self._query(
            f"SELECT {FILE_COLUMNS} FROM files {where_clause(where)} ORDER BY seq {direction(order)} LIMIT ?",
            (*params, limit + 1),
        )
        return [file_from_row(row) for row in rows[:limit]], len(rows) > limit

    def delete_file(self, file_id: str) -> None:
        """Remove a file; refused while an unfinished batch reads it."""
        self.get_file(file_id)
        users = self._query(
            "SELECT id FROM batches WHERE input_file_id = ? AND status IN (?, ?, ?, ?)",
            (file_id, *(s.value for s in UNFINISHED)),
        )
        if users:
            raise InvalidRequestError(
                f"File {file_id} is the input of batch {users[0][0]}, which has not finished; "
                "cancel the batch or wait for it before deleting the file.",
                param="file_id",
            )
        with self._transaction() as db:
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        self.blob_path(file_id).unlink(missing_ok=True)

    def expired_file_ids(self) -> list[str]:
        rows = self._query("SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ?", (self.now(),))
        return [row[0] for row in rows]

    # ---- batches ------------------------------------------------------------------

    def create_batch(
        self, endpoint: str, input_file_id: str, completion_window: str, window_s: int, metadata: dict[str, str] | None
    ) -> BatchRecord:
        source = self.get_file(input_file_id)
        if source.purpose != "batch":
            raise InvalidRequestError(
                f"File {input_file_id} was uploaded with purpose {source.purpose!r}; a batch input needs purpose 'batch'.",
                param="input_file_id",
            )
        now = self.now()
        batch = BatchRecord(
            id=new_id("batch_"),
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            status=BatchStatus.VALIDATING,
            created_at=now,
            expires_at=now + window_s,
            metadata=metadata,
        )
        with self._transaction() as db:
            db.execute(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, created_at, expires_at, "
                "metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (batch.id, endpoint, input_file_id, completion_window, batch.status.value, now, batch.expires_at,
                 json.dumps(metadata) if metadata is not None else None),
            )  # fmt: skip
        return batch

    def get_batch(self, batch_id: str) -> BatchRecord:
        rows = self._query(f"SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?", (batch_id,))
        if not rows:
            raise NotFoundError(f"No such Batch object: {batch_id}", param="batch_id")
        return batch_from_row(rows[0])

    def list_batches(self, *, after: str | None = None, limit: int = 20) -> tuple[list[BatchRecord], bool]:
        """A page of batches, newest first, and whether more follow."""
        where, params = self._page_filter("batches", after, "desc")
        rows = self._query(
            f"SELECT {BATCH_COLUMNS} FROM batches {where_clause(where)} ORDER BY seq DESC LIMIT ?", (*params, limit + 1)
        )
        return [batch_from_row(row) for row in rows[:limit]], len(rows) > limit

    def unfinished_batches(self) -> list[BatchRecord]:
        """Batches not in a final status, oldest first (what a restart resumes)."""
        rows = self._query(
            f"SELECT {BATCH_COLUMNS} FROM batches WHERE status IN (?, ?, ?, ?) ORDER BY seq",
            [s.value for s in UNFINISHED],
        )
        return [batch_from_row(row) for row in rows]

    def recent_batches(self, limit: int) -> list[BatchRecord]:
        rows = self._query(f"SELECT {BATCH_COLUMNS} FROM batches ORDER BY seq DESC LIMIT ?", (limit,))
        return [batch_from_row(row) for row in rows]

    def _page_filter(self, table: str, after: str | None, order: str) -> tuple[list[str], list[Any]]:
        if after is None:
            return [], []
        rows = self._query(f"SELECT seq FROM {table} WHERE id = ?", (after,))  # table is ours, never user input
        if not rows:
            raise InvalidRequestError(f"after: no object with id {after!r}", param="after")
        return [f"seq {'<' if order != 'asc' else '>'} ?"], [rows[0][0]]

    def set_status(
        self, batch_id: str, status: BatchStatus, *, expect: Sequence[BatchStatus] = (), **fields: Any
    ) -> BatchRecord:
        """Move a batch to `status`, stamping its `*_at` time (once), with more
        columns in `fields`; unchanged unless its status is one of `expect`
        (when given): a cancel may have come in meanwhile."""
        with self._transaction() as db:
            self._set_status(db, batch_id, status, expect, fields)
        return self.get_batch(batch_id)

    def _set_status(
        self, db: sqlite3.Connection, batch_id: str, status: BatchStatus, expect: Sequence[BatchStatus], fields: Any
    ) -> bool:
        row = db.execute("SELECT status FROM batches WHERE id = ?", (batch_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"No such Batch object: {batch_id}", param="batch_id")
        if expect and BatchStatus(row[0]) not in expect:
            return False
        stamp = status.timestamp_field
        if stamp:
            db.execute(f"UPDATE batches SET {stamp} = COALESCE({stamp}, ?) WHERE id = ?", (self.now(), batch_id))
        values: dict[str, Any] = {"status": status.value, **fields}
        assignments = ", ".join(f"{name} = ?" for name in values)
        db.execute(f"UPDATE batches SET {assignments} WHERE id = ?", (*values.values(), batch_id))
        return True

    def fail_validation(self, batch_id: str, errors: Sequence[BatchError]) -> BatchRecord:
        errors_json = json.dumps([e.to_openai() for e in errors])
        return self.set_status(batch_id, BatchStatus.FAILED, expect=(BatchStatus.VALIDATING,), errors=errors_json)

    def start_batch(self, batch_id: str, lines: Sequence[LineRef], model: str | None) -> BatchRecord:
        """A validated batch: record its lines and move it to in_progress."""
        fields = {"num_total": len(lines), "model": model}
        with self._transaction() as db:
            if self._set_status(db, batch_id, BatchStatus.IN_PROGRESS, (BatchStatus.VALIDATING,), fields):
                db.execute("DELETE FROM lines WHERE batch_id = ?", (batch_id,))
                db.executemany(
                    "INSERT INTO lines (batch_id, line_no, custom_id, offset, length) VALUES (?, ?, ?, ?, ?)",
                    [(batch_id, ref.line_no, ref.custom_id, ref.offset, ref.length) for ref in lines],
                )
        return self.get_batch(batch_id)

    def request_cancel(self, batch_id: str) -> BatchRecord:
        """validating / in_progress -> cancelling; a batch already cancelling is returned as is."""
        batch = self.get_batch(batch_id)
        if batch.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
            return self.set_status(batch_id, BatchStatus.CANCELLING)
        if batch.status is BatchStatus.CANCELLING:
            return batch
        raise InvalidRequestError(
            f"Batch {batch_id} cannot be cancelled: its status is {batch.status.value!r}.", param="batch_id"
        )

    # ---- lines --------------------------------------------------------------------

    def pending_lines(self, batch_id: str) -> list[LineRef]:
        """Lines with no result yet, in file order."""
        rows = self._query(
            "SELECT line_no, custom_id, offset, length FROM lines WHERE batch_id = ? AND finished_at IS NULL "
            "ORDER BY line_no",
            (batch_id,),
        )
        return [LineRef(*row) for row in rows]

    def start_line(self, batch_id: str, line_no: int) -> None:
        """Count an attempt at a line (committed before the line runs)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE lines SET attempts = attempts + 1, started_at = ? WHERE batch_id = ? AND line_no = ?",
                (self.clock(), batch_id, line_no),
            )

    def finish_line(self, batch_id: str, line_no: int, result: LineResult) -> bool:
        """Record a line's answer and count it in its batch, in one commit.
        False (and nothing changes) if the line already has a result."""
        usage = result.usage()
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE lines SET finished_at = ?, result_id = ?, status_code = ?, request_id = ?, response = ? "
                "WHERE batch_id = ? AND line_no = ? AND finished_at IS NULL",
                (self.clock(), new_id("batch_req_"), result.status_code, result.request_id,
                 json.dumps(result.body, ensure_ascii=False), batch_id, line_no),
            )  # fmt: skip
            if cursor.rowcount != 1:
                return False
            counter = "num_completed" if result.status_code == 200 else "num_failed"
            db.execute(
                f"UPDATE batches SET {counter} = {counter} + 1, input_tokens = input_tokens + ?, "
                "cached_tokens = cached_tokens + ?, output_tokens = output_tokens + ? WHERE id = ?",
                (usage.get("input_tokens", 0), usage.get("cached_tokens", 0), usage.get("output_tokens", 0), batch_id),
            )
        return True

    def iter_lines(self, batch_id: str) -> Iterator[tuple[Any, ...]]:
        """(line_no, custom_id, result_id, status_code, request_id, response JSON) of every
        line in file order, a page at a time (unfinished lines have None results)."""
        last = 0
        while True:
            rows = self._query(
                "SELECT line_no, custom_id, result_id, status_code, request_id, response FROM lines "
                "WHERE batch_id = ? AND line_no > ? ORDER BY line_no LIMIT ?",
                (batch_id, last, _PAGE),
            )
            yield from rows
            if len(rows) < _PAGE:
                return
            last = rows[-1][0]

    def line_stats(self, batch_id: str) -> list[dict[str, Any]]:
        """Per line: custom_id, attempts, started/finished times, status (tests, benchmarks)."""
        rows = self._query(
            "SELECT line_no, custom_id, attempts, started_at, finished_at, status_code FROM lines "
            "WHERE batch_id = ? ORDER BY line_no",
            (batch_id,),
        )
        keys = ("line_no", "custom_id", "attempts", "started_at", "finished_at", "status_code")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def finish_batch(
        self,
        batch_id: str,
        status: BatchStatus,
        outputs: dict[str, tuple[Path, str] | None],
        errors: Sequence[BatchError] | None = None,
    ) -> BatchRecord:
        """Final status, with the output and error files (`outputs["output"/"error"]`
        = (finished temporary file, filename), or None) and `errors` (why it failed)
        taken in atomically."""
        columns: dict[str, Any] = {}
        now = self.now()
        try:
            with self._transaction() as db:
                for kind, output in outputs.items():
                    if output is None:
                        continue
                    tmp, filename = output
                    file_id = new_id("file-")
                    db.execute(
                        f"INSERT INTO files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL)",
                        (file_id, filename, "batch_output", tmp.stat().st_size, now),
                    )
                    os.replace(tmp, self.blob_path(file_id))
                    columns[f"{kind}_file_id"] = file_id
                if errors is not None:
                    columns["errors"] = json.dumps([e.to_openai() for e in errors])
                self._set_status(db, batch_id, status, (), columns)
        except BaseException:  # not committed (a full disk): the batch stays unfinished, its outputs are written again
            for name, file_id in columns.items():
                if name.endswith("_file_id"):
                    self.blob_path(file_id).unlink(missing_ok=True)
            raise
        return self.get_batch(batch_id)


def _lock_exclusively(path: Path) -> Any:
    """Hold an exclusive lock on `path` for the store's life: two processes
    running one data directory's batches would run every line twice."""
    f = path.open("a+")
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks here; one server per data directory
        return f
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise JobStoreBusyError(
            f"another localserve process runs the batch jobs in {path.parent}; stop it, or give this "
            "server its own data directory (LOCALSERVE_HOME)"
        ) from None
    return f
