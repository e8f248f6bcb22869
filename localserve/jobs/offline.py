"""`localserve batch run`: a batch input file run in this process, without a
server. INPUT and OUTPUT are local paths or fsspec URLs (`s3://`, `gs://`,
`az://`, ...); the errors go to OUTPUT with `.errors.jsonl` for `.jsonl`.

Lines go through the same executor as the server's batches (the serving
layer, `serving.openai.batch_lines`). Results are appended to a local journal as they finish; OUTPUT is
written once at the end, whole and atomically (a rename for a local file, a
single upload for an object store). A run that is interrupted and started
again skips the custom_ids already in OUTPUT or in its journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from localserve.errors import InvalidRequestError
from localserve.jobs.output import result_line
from localserve.jobs.progress import Progress
from localserve.jobs.runner import LineExecutor
from localserve.jobs.types import LineRef, new_id
from localserve.jobs.validate import Limits, Validation, read_bodies, validate_file

#: open_model(name) -> (executor, the model id to put in each body)
ModelOpener = Callable[[str], AbstractAsyncContextManager[tuple[LineExecutor, str]]]
#: run_pending(validation, local input path, lines not yet answered, journal): answers them into the journal
PendingRunner = Callable[[Validation, Path, list[LineRef], "Journal"], Awaitable[None]]


class BatchFileError(InvalidRequestError):
    """The input file is not a valid batch; `validation.errors` says why."""

    def __init__(self, validation: Validation) -> None:
        first = validation.errors[0] if validation.errors else None
        where = f" (line {first.line})" if first and first.line else ""
        super().__init__(f"invalid batch file: {first.message if first else 'unknown error'}{where}")
        self.validation = validation


@dataclass(slots=True)
class Summary:
    num_total: int = 0
    num_skipped: int = 0  # already in OUTPUT or the journal
    num_completed: int = 0
    num_failed: int = 0
    output_url: str = ""
    errors_url: str = ""


def errors_url_for(output_url: str) -> str:
    return (
        output_url[: -len(".jsonl")] + ".errors.jsonl"
        if output_url.endswith(".jsonl")
        else output_url + ".errors.jsonl"
    )


async def run_file(
    input_url: str,
    output_url: str,
    open_model: ModelOpener,
    *,
    work_dir: Path,
    endpoint: str | None = None,
    model: str | None = None,
    concurrency: int = 0,
    limits: Limits | None = None,
    progress: Progress | None = None,
) -> Summary:
    """Run every request of `input_url` not yet answered; see the module docstring."""

    async def run_here(validation: Validation, input_path: Path, pending: list[LineRef], journal: Journal) -> None:
        assert validation.endpoint is not None and validation.model is not None  # a valid file has both
        async with open_model(model or validation.model) as (executor, model_id):
            limit = concurrency or executor.max_in_flight(validation.endpoint, model_id)
            if progress is not None:
                progress.start(len(validation.lines), len(validation.lines) - len(pending))
            await _run_lines(executor, validation.endpoint, model_id, input_path, pending, limit, journal, progress)

    return await process_file(input_url, output_url, run_here, work_dir=work_dir, endpoint=endpoint, limits=limits)


async def process_file(
    input_url: str,
    output_url: str,
    run_pending: PendingRunner,
    *,
    work_dir: Path,
    endpoint: str | None = None,
    limits: Limits | None = None,
) -> Summary:
    """Validate `input_url`, hand the lines not yet answered to `run_pending`
    (which adds their answers to the journal), then publish OUTPUT and the
    errors file. What `run_file` and the Ray runner share."""
    import fsspec  # heavy: only for this command

    work_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(output_url.encode()).hexdigest()[:16]
    journal = Journal(work_dir / f"{key}.output.jsonl", work_dir / f"{key}.errors.jsonl")
    summary = Summary(output_url=output_url, errors_url=errors_url_for(output_url))
    with _local_copy(fsspec, input_url, work_dir / f"{key}.input.jsonl") as input_path:
        validation = await asyncio.to_thread(validate_file, input_path, endpoint, limits or Limits())
        if not validation.ok:
            raise BatchFileError(validation)
        existing = await asyncio.to_thread(_read_lines, fsspec, output_url)
        done = {_custom_id(line) for line in existing} | set(journal.outputs)
        pending = [ref for ref in validation.lines if ref.custom_id not in done]
        summary.num_total, summary.num_skipped = len(validation.lines), len(validation.lines) - len(pending)
        if pending:
            try:
                await run_pending(validation, input_path, pending, journal)
            finally:
                journal.close()
        order = {ref.custom_id: ref.line_no for ref in validation.lines}
        await asyncio.to_thread(_publish, fsspec, summary, existing, journal, order)
    journal.remove()
    return summary


@dataclass(frozen=True, slots=True)
class AnsweredLine:
    """One line's result: its output (or error) line and what progress counts."""

    line: str
    ok: bool
    num_tokens: int


async def answer_line(
    executor: LineExecutor, endpoint: str, model_id: str, custom_id: str, body: dict[str, Any]
) -> AnsweredLine:
    """Run one line through `executor` as model `model_id`, sending it again
    while the model says "not now", and format its result line."""
    body["model"] = model_id
    while True:
        result = await executor.execute(endpoint, body)
        if result.retry_after_s is None:
            break
        await asyncio.sleep(result.retry_after_s)
    body_json = json.dumps(result.body, ensure_ascii=False)
    line = result_line(new_id("batch_req_"), custom_id, result.status_code, result.request_id, body_json)
    usage = result.usage()  # embeddings produce no output tokens: count what they read
    return AnsweredLine(line, result.status_code == 200, usage.get("output_tokens") or usage.get("input_tokens", 0))


async def _run_lines(
    executor: LineExecutor,
    endpoint: str,
    model_id: str,
    input_path: Path,
    pending: list[LineRef],
    limit: int,
    journal: Journal,
    progress: Progress | None,
) -> None:
    queue: asyncio.Queue[LineRef] = asyncio.Queue()
    for ref in pending:
        queue.put_nowait(ref)

    async def worker() -> None:
        while not queue.empty():
            ref = queue.get_nowait()
            (body,) = await asyncio.to_thread(read_bodies, input_path, [ref])
            answer = await answer_line(executor, endpoint, model_id, ref.custom_id, body)
            journal.add(ref.custom_id, answer.line, ok=answer.ok)
            if progress is not None:
                progress.advance(ok=answer.ok, num_tokens=answer.num_tokens)

    workers = [asyncio.create_task(worker()) for _ in range(max(1, min(limit, len(pending))))]
    try:
        await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if progress is not None:
            progress.finish()


class Journal:
    """Finished lines of an unfinished run, appended and flushed one by one."""

    def __init__(self, output_path: Path, errors_path: Path) -> None:
        self.paths = (output_path, errors_path)
        self.outputs = _load(output_path)
        self.errors = _load(errors_path)  # redone on the next run; the last answer is kept
        self._files: list[IO[str]] = []

    def add(self, custom_id: str, line: str, *, ok: bool) -> None:
        if not self._files:
            self._files = [path.open("a", encoding="utf-8") for path in self.paths]
        target = self._files[0] if ok else self._files[1]
        target.write(line)
        target.flush()  # a kill loses at most the lines still running
        (self.outputs if ok else self.errors)[custom_id] = line

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []

    def remove(self) -> None:
        self.close()
        for path in self.paths:
            path.unlink(missing_ok=True)


def _load(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    lines = {}
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        with contextlib.suppress(ValueError):  # a line cut short by a kill
            lines[_custom_id(line)] = line if line.endswith("\n") else line + "\n"
    return lines


def _custom_id(line: str) -> str:
    return str(json.loads(line)["custom_id"])


@contextlib.contextmanager
def _local_copy(fsspec: Any, url: str, scratch: Path) -> Iterator[Path]:
    """The input as a local file (a copy, for a remote URL)."""
    fs, path = fsspec.core.url_to_fs(url)
    if _is_local(fs):
        yield Path(path)
        return
    try:
        with fs.open(path, "rb") as src, scratch.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        yield scratch
    finally:
        scratch.unlink(missing_ok=True)


def _is_local(fs: Any) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def _read_lines(fsspec: Any, url: str) -> list[str]:
    """The lines of an earlier OUTPUT, or none."""
    fs, path = fsspec.core.url_to_fs(url)
    if not fs.exists(path):
        return []
    with fs.open(path, "rt", encoding="utf-8") as f:
        return [line if line.endswith("\n") else line + "\n" for line in f if line.strip()]


def _publish(fsspec: Any, summary: Summary, existing: list[str], journal: Journal, order: dict[str, int]) -> None:
    """Write OUTPUT (earlier lines, then new ones in input order) and the errors file."""
    outputs = [journal.outputs[c] for c in sorted(journal.outputs, key=lambda c: order.get(c, 0))]
    done = {_custom_id(line) for line in existing} | set(journal.outputs)
    errors = [journal.errors[c] for c in sorted(journal.errors, key=lambda c: order.get(c, 0)) if c not in done]
    summary.num_completed, summary.num_failed = len(outputs), len(errors)
    if outputs or not existing:
        _write_whole(fsspec, summary.output_url, [*existing, *outputs])
    if errors:
        _write_whole(fsspec, summary.errors_url, errors)
    else:  # an errors file of an earlier run whose failures have now been answered
        fs, path = fsspec.core.url_to_fs(summary.errors_url)
        if fs.exists(path):
            fs.rm(path)


def _write_whole(fsspec: Any, url: str, lines: list[str]) -> None:
    """All or nothing: a rename into place locally, one upload elsewhere."""
    fs, path = fsspec.core.url_to_fs(url)
    if not _is_local(fs):
        with fs.open(path, "w", encoding="utf-8") as f:
            f.writelines(lines)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
