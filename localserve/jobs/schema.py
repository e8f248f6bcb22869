"""The job store's SQLite schema and the mapping of its rows to records."""

from __future__ import annotations

import json
from typing import Any

from localserve.jobs.types import BatchRecord, BatchStatus, FileRecord

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    num_bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE TABLE IF NOT EXISTS batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    metadata TEXT,
    model TEXT,
    errors TEXT,
    output_file_id TEXT,
    error_file_id TEXT,
    in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER,
    expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
    num_total INTEGER NOT NULL DEFAULT 0,
    num_completed INTEGER NOT NULL DEFAULT 0,
    num_failed INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL,
    line_no INTEGER NOT NULL,
    custom_id TEXT NOT NULL,
    offset INTEGER NOT NULL,
    length INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    started_at REAL,
    finished_at REAL,
    result_id TEXT,
    status_code INTEGER,
    request_id TEXT,
    response TEXT,
    PRIMARY KEY (batch_id, line_no)
) WITHOUT ROWID;
"""

BATCH_COLUMNS = (
    "id, endpoint, input_file_id, completion_window, status, created_at, expires_at, metadata, model, errors, "
    "output_file_id, error_file_id, in_progress_at, finalizing_at, completed_at, failed_at, expired_at, "
    "cancelling_at, cancelled_at, num_total, num_completed, num_failed, input_tokens, cached_tokens, output_tokens"
)
FILE_COLUMNS = "id, filename, purpose, num_bytes, created_at, expires_at"


def where_clause(conditions: list[str]) -> str:
    return f"WHERE {' AND '.join(conditions)}" if conditions else ""


def direction(order: str) -> str:
    return "ASC" if order == "asc" else "DESC"


def batch_from_row(row: tuple[Any, ...]) -> BatchRecord:
    (batch_id, endpoint, input_file_id, window, status, created_at, expires_at, metadata, model, errors,
     output_file_id, error_file_id, in_progress_at, finalizing_at, completed_at, failed_at, expired_at,
     cancelling_at, cancelled_at, num_total, num_completed, num_failed, input_tokens, cached_tokens,
     output_tokens) = row  # fmt: skip
    return BatchRecord(
        id=batch_id,
        endpoint=endpoint,
        input_file_id=input_file_id,
        completion_window=window,
        status=BatchStatus(status),
        created_at=created_at,
        expires_at=expires_at,
        metadata=json.loads(metadata) if metadata else None,
        model=model,
        errors=json.loads(errors) if errors else None,
        output_file_id=output_file_id,
        error_file_id=error_file_id,
        in_progress_at=in_progress_at,
        finalizing_at=finalizing_at,
        completed_at=completed_at,
        failed_at=failed_at,
        expired_at=expired_at,
        cancelling_at=cancelling_at,
        cancelled_at=cancelled_at,
        num_total=num_total,
        num_completed=num_completed,
        num_failed=num_failed,
        usage={"input_tokens": input_tokens, "cached_tokens": cached_tokens, "output_tokens": output_tokens},
    )


def file_from_row(row: tuple[Any, ...]) -> FileRecord:
    return FileRecord(*row)
