"""The batch runner: validates new batches, runs their lines through the
endpoints at `batch` priority, and writes their output files.

Two background tasks share the work:

* housekeeping - validates `validating` batches at once (a malformed file
  fails in seconds, whatever else runs), finalizes batches cancelled or
  expired while queued, and deletes files past their `expires_at`;
* execution - runs the oldest `in_progress` batch, a bounded number of lines
  at a time (the model's parallel slots: interactive requests outrank these
  in the scheduler, and the batch soaks up what they leave idle).

A line counts an attempt in the store before it runs and stores its answer
when it ends, so a restart redoes only the lines that were running. A batch
that is claimed by one task is left alone by the other.

A full or read-only disk pauses the batch (jobs/storage_wait.py): finished
answers wait in memory and are stored when the disk takes them again, no
line is lost or run twice; past `storage_timeout_s` the batch fails with an
error file that says why. Output files are published whole or not at all.

While a batch runs, the runner holds its model (`hold_model`, a `ModelHold` in the
server): each line holds it too, but between two lines nothing would, and
LRU eviction or a short keep_alive could unload it under the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from localserve.disk import is_storage_error
from localserve.errors import LocalServeError
from localserve.jobs.output import CANCELLED, EXPIRED, NOT_RUN, publish_outputs
from localserve.jobs.storage_wait import StorageGaveUp, StorageWait
from localserve.jobs.store import JobStore
from localserve.jobs.types import BatchError, BatchRecord, BatchStatus, LineRef, LineResult
from localserve.jobs.validate import Limits, read_bodies, validate_file

log = logging.getLogger(__name__)

MAX_PASSES = 3  # passes over a batch's lines when some fail inside the runner itself
NUM_RECENT = 5  # finished batches still shown in the stats snapshot


#: Holds a model loaded for the duration of an `async with` block (None: the
#: batch names no single model).
ModelHolder = Callable[[str | None], AbstractAsyncContextManager[object]]


@contextlib.asynccontextmanager
async def hold_nothing(model: str | None) -> AsyncIterator[None]:
    yield None


class LineExecutor(Protocol):
    """Runs one request of a batch exactly as its endpoint would."""

    async def execute(self, endpoint: str, body: dict[str, Any]) -> LineResult: ...

    def max_in_flight(self, endpoint: str, model: str | None) -> int: ...


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    limits: Limits = field(default_factory=Limits)
    sweep_interval_s: float = 30.0  # checks for expiry without being woken
    prefetch: int = 64  # line bodies read from the input file at a time
    retry_wait_s: float = 0.25  # first wait before resending a "not now" line
    max_retry_wait_s: float = 5.0
    storage_retry_s: float = 5.0  # wait between tries of a write that met a full or read-only disk
    storage_timeout_s: float = 3600.0  # a batch paused on the disk this long fails, with an error file saying why


class BatchRunner:
    """See the module docstring. `start()` / `stop()` from the event loop."""

    def __init__(
        self,
        store: JobStore,
        executor: LineExecutor,
        config: RunnerConfig | None = None,
        *,
        hold_model: ModelHolder = hold_nothing,
    ) -> None:
        self.store = store
        self.executor = executor
        self.config = config or RunnerConfig()
        self.hold_model = hold_model
        self.storage = StorageWait(store, retry_s=self.config.storage_retry_s, timeout_s=self.config.storage_timeout_s)
        self._housekeeping_due = asyncio.Event()
        self._execution_due = asyncio.Event()
        self._claimed: set[str] = set()
        self._stops: dict[str, asyncio.Event] = {}  # batch being executed -> set to stop it
        self._live: dict[str, BatchRecord] = {}  # unfinished and recent batches, for stats
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for batch in await self.store.call(self.store.recent_batches, NUM_RECENT):
            self._live[batch.id] = batch
        for batch in await self.store.call(self.store.unfinished_batches):
            self._live[batch.id] = batch
        self._tasks = [
            asyncio.create_task(self._loop(self._housekeeping_due, self._housekeep), name="batch-housekeeping"),
            asyncio.create_task(self._loop(self._execution_due, self._execute_next), name="batch-execution"),
        ]

    async def stop(self) -> None:
        """Stop at once; lines in flight are aborted and will be redone after a restart."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    # ---- signals from the API -------------------------------------------------------

    def notify(self, batch: BatchRecord) -> None:
        """A batch was created or changed: look at it now."""
        self._update(batch)
        self._housekeeping_due.set()
        self._execution_due.set()

    def cancel(self, batch: BatchRecord) -> None:
        """`batch` is now `cancelling`: stop its lines if it runs, else finalize it."""
        self._update(batch)
        stop = self._stops.get(batch.id)
        if stop is not None:
            stop.set()
        self._housekeeping_due.set()

    def snapshot(self) -> list[dict[str, Any]]:
        """Batch objects for the dashboard: unfinished ones and the last few finished."""
        return [batch.to_openai() for batch in sorted(self._live.values(), key=lambda b: b.created_at)]

    def _update(self, batch: BatchRecord) -> None:
        self._live[batch.id] = batch
        finished = [b for b in self._live.values() if b.status.terminal]
        for old in sorted(finished, key=lambda b: b.created_at)[:-NUM_RECENT]:
            del self._live[old.id]

    # ---- loops ----------------------------------------------------------------------

    async def _loop(self, due: asyncio.Event, work: Any) -> None:
        while True:
            due.clear()  # before working, so a signal during the work is not lost
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if is_storage_error(exc):  # a full or read-only disk: wait it out, one warning
                    self.storage.pause(exc)
                    await asyncio.sleep(self.config.storage_retry_s)
                else:
                    log.exception("batch runner: %s failed; retrying", work.__name__)
                    await asyncio.sleep(1.0)
            # asyncio.timeout, not wait_for: in 3.11 wait_for may swallow a
            # cancel (stop()) that comes as the event is set.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.sweep_interval_s):
                    await due.wait()

    async def _housekeep(self) -> None:
        now = self.store.now()
        for batch in await self.store.call(self.store.unfinished_batches):
            if batch.id in self._claimed:
                continue
            if batch.status is BatchStatus.VALIDATING:
                await self._claimed_run(batch, self._validate(batch))
            elif batch.status is BatchStatus.CANCELLING:
                await self._claimed_run(batch, self._finalize(batch.id, BatchStatus.CANCELLED))
            elif batch.status is BatchStatus.IN_PROGRESS and now >= batch.expires_at:
                await self._claimed_run(batch, self._finalize(batch.id, BatchStatus.EXPIRED))
        for file_id in await self.store.call(self.store.expired_file_ids):
            with contextlib.suppress(LocalServeError):  # still the input of a running batch
                await self.store.call(self.store.delete_file, file_id)

    async def _execute_next(self) -> None:
        """Run batches, oldest first, until none is left to run."""
        while True:
            runnable = (BatchStatus.IN_PROGRESS, BatchStatus.FINALIZING)
            batches = await self.store.call(self.store.unfinished_batches)
            batch = next((b for b in batches if b.status in runnable and b.id not in self._claimed), None)
            if batch is None:
                return
            await self._claimed_run(batch, self._execute(batch))

    async def _claimed_run(self, batch: BatchRecord, work: Any) -> None:
        if batch.id in self._claimed:  # claimed by the other loop since the listing
            work.close()
            return
        self._claimed.add(batch.id)
        try:
            await work
        finally:
            self._claimed.discard(batch.id)

    # ---- one batch ------------------------------------------------------------------

    async def _validate(self, batch: BatchRecord) -> None:
        path = self.store.blob_path(batch.input_file_id)
        result = await asyncio.to_thread(validate_file, path, batch.endpoint, self.config.limits)
        if result.ok:
            updated = await self.storage.write(self.store.start_batch, batch.id, result.lines, result.model)
        else:
            updated = await self.storage.write(self.store.fail_validation, batch.id, result.errors)
        log.info(
            "batch %s: %s (%d lines, %d errors)", batch.id, updated.status.value, len(result.lines), result.num_errors
        )
        self.notify(updated)

    async def _execute(self, batch: BatchRecord) -> None:
        # The stop event exists before the status is read: a cancel that comes
        # meanwhile is not lost.
        stop = self._stops[batch.id] = asyncio.Event()
        try:
            batch = await self.store.call(self.store.get_batch, batch.id)
            if batch.status is BatchStatus.FINALIZING:  # caught by a restart
                outcome = BatchStatus.COMPLETED
            elif batch.status is BatchStatus.IN_PROGRESS:
                async with self.hold_model(batch.model):  # no eviction or keep_alive unload mid-batch
                    outcome = await self._run_lines(batch, stop)
                if outcome is BatchStatus.COMPLETED:
                    updated = await self.storage.write(self._set_finalizing, batch.id)
                    self._update(updated)
                    if updated.status is BatchStatus.CANCELLING:  # cancelled as the last line ended
                        outcome = BatchStatus.CANCELLED
            else:
                return  # cancelling: housekeeping finalizes it
            await self._finalize(batch.id, outcome)
        finally:
            del self._stops[batch.id]
            self._housekeeping_due.set()  # whatever this claim kept it from

    def _set_finalizing(self, batch_id: str) -> BatchRecord:
        return self.store.set_status(batch_id, BatchStatus.FINALIZING, expect=(BatchStatus.IN_PROGRESS,))

    async def _run_lines(self, batch: BatchRecord, stop: asyncio.Event) -> BatchStatus:
        for _ in range(MAX_PASSES):
            pending = await self.store.call(self.store.pending_lines, batch.id)
            if not pending:
                break
            stopped = await self._dispatch(batch, pending, stop)
            if stopped is not None:
                return stopped
        return BatchStatus.COMPLETED

    async def _dispatch(
        self, batch: BatchRecord, pending: Sequence[LineRef], stop: asyncio.Event
    ) -> BatchStatus | None:
        """Run `pending` lines, a bounded number at a time; the status to end
        in if a cancel or the deadline stops them, else None."""
        in_flight: set[asyncio.Task[None]] = set()
        stop_waiter = asyncio.create_task(stop.wait())
        input_path = self.store.blob_path(batch.input_file_id)
        try:
            for start in range(0, len(pending), self.config.prefetch):
                refs = pending[start : start + self.config.prefetch]
                bodies = await asyncio.to_thread(read_bodies, input_path, refs)
                for ref, body in zip(refs, bodies, strict=True):
                    while True:
                        if stopped := self._stopped(batch, stop):
                            return stopped
                        if len(in_flight) < max(1, self.executor.max_in_flight(batch.endpoint, batch.model)):
                            break
                        await self._wait(in_flight, stop_waiter, batch)
                    in_flight.add(asyncio.create_task(self._run_line(batch, ref, body)))
            while in_flight:
                await self._wait(in_flight, stop_waiter, batch)
                if stopped := self._stopped(batch, stop):
                    return stopped
            return None
        finally:
            stop_waiter.cancel()
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, stop_waiter, return_exceptions=True)

    def _stopped(self, batch: BatchRecord, stop: asyncio.Event) -> BatchStatus | None:
        if stop.is_set():
            return BatchStatus.CANCELLED
        if self.storage.timed_out():
            return BatchStatus.FAILED
        if self.store.now() >= batch.expires_at:
            return BatchStatus.EXPIRED
        return None

    async def _wait(
        self, in_flight: set[asyncio.Task[None]], stop_waiter: asyncio.Task[Any], batch: BatchRecord
    ) -> None:
        """Until a line ends, a cancel comes or the batch's deadline passes."""
        timeout = max(0.0, batch.expires_at - self.store.clock())
        done, _ = await asyncio.wait({*in_flight, stop_waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for task in done - {stop_waiter}:
            in_flight.discard(task)
            if not task.cancelled() and isinstance(task.exception(), StorageGaveUp):
                continue  # the disk stayed full: `_stopped` fails the batch
            if not task.cancelled() and task.exception() is not None:
                log.error("batch %s: a line failed in the runner", batch.id, exc_info=task.exception())

    async def _run_line(self, batch: BatchRecord, ref: LineRef, body: dict[str, Any]) -> None:
        await self.storage.write(self.store.start_line, batch.id, ref.line_no, give_up=True)
        wait_s = self.config.retry_wait_s
        while True:
            result = await self.executor.execute(batch.endpoint, body)
            if result.retry_after_s is None:
                break
            await asyncio.sleep(min(max(wait_s, result.retry_after_s), self.config.max_retry_wait_s))
            wait_s = min(wait_s * 2, self.config.max_retry_wait_s)
        # The answer waits here while the disk is full: stored once, never lost (a line that already
        # has a result is left as it is).
        if await self.storage.write(self.store.finish_line, batch.id, ref.line_no, result, give_up=True):
            live = self._live.get(batch.id)
            if live is not None:
                if result.status_code == 200:
                    live.num_completed += 1
                else:
                    live.num_failed += 1

    async def _finalize(self, batch_id: str, status: BatchStatus) -> None:
        """Write the output and error files and enter the final `status` (tried
        until the disk takes them: never half a file reported as complete)."""
        batch = await self.store.call(self.store.get_batch, batch_id)
        unfinished = {BatchStatus.CANCELLED: CANCELLED, BatchStatus.EXPIRED: EXPIRED}.get(status, NOT_RUN)
        errors = None
        if status is BatchStatus.FAILED:  # the disk stayed full or read-only
            unfinished = {"code": "insufficient_storage", "message": self.storage.why()}
            errors = [BatchError("insufficient_storage", self.storage.why())]
        final = await self.storage.write(publish_outputs, self.store, batch, status, unfinished, errors)
        log.info(
            "batch %s: %s (%d completed, %d failed of %d)",
            batch_id, status.value, final.num_completed, final.num_failed, final.num_total,
        )  # fmt: skip
        self._update(final)
