"""The batch runner's store writes, waiting out a full or read-only disk.

A write that meets `ENOSPC`, SQLite's "database or disk is full" or a
read-only file system is not lost and not a bug: the runner pauses (one
warning), tries again every `retry_s` seconds, and goes on once a write
succeeds (one line more). Writes of a line's progress may give up once the
disk has refused every write for `timeout_s` (`StorageGaveUp`): the batch then
fails, with an error file saying why, as soon as the disk takes that file.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

from localserve.disk import free_bytes, human, is_read_only, is_storage_error
from localserve.jobs.store import JobStore

log = logging.getLogger(__name__)

T = TypeVar("T")


class StorageGaveUp(Exception):
    """The disk refused every write for longer than the runner's timeout."""


class StorageWait:
    """Store writes that wait while the disk is full or read-only (see the module docstring)."""

    def __init__(
        self, store: JobStore, *, retry_s: float, timeout_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.store = store
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.paused_since: float | None = None  # when the disk first refused a write; None: it takes them
        self.reason = ""

    async def write(self, fn: Callable[..., T], *args: Any, give_up: bool = False) -> T:
        """`fn(*args)` on the store's thread, tried until the disk takes it (or,
        with `give_up`, until `timed_out()`: then `StorageGaveUp`)."""
        while True:
            try:
                result = await self.store.call(fn, *args)
            except (OSError, sqlite3.Error) as exc:
                if not is_storage_error(exc):
                    raise
                self.pause(exc)
                if give_up and self.timed_out():
                    raise StorageGaveUp(self.why()) from exc
                await asyncio.sleep(self.retry_s)
                continue
            self.resume()
            return result

    def pause(self, exc: BaseException) -> None:
        """A write met a full or read-only disk: warn once per pause."""
        if self.paused_since is not None:
            return
        self.paused_since = self.clock()
        self.reason = "read-only" if is_read_only(exc) else "full"
        try:
            free = human(free_bytes(self.store.root))
        except OSError:
            free = "unknown"
        log.warning(
            "batch jobs paused: the disk of %s is %s (%s; %s free); retrying every %g s, failing their batches "
            "after %g s",
            self.store.root, self.reason, exc, free, self.retry_s, self.timeout_s,
        )  # fmt: skip

    def resume(self) -> None:
        if self.paused_since is not None:
            log.warning("batch jobs resumed: the disk of %s takes writes again", self.store.root)
        self.paused_since = None

    def timed_out(self) -> bool:
        return self.paused_since is not None and self.clock() - self.paused_since >= self.timeout_s

    def why(self) -> str:
        return (
            f"The server's data disk ({self.store.root}) was {self.reason or 'full'} for more than "
            f"{self.timeout_s:g} s, so this batch's results could not be stored; free some space and submit "
            "the requests that did not run again."
        )
