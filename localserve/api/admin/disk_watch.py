"""The data directory's disk, watched: its free space every `CHECK_S`
seconds (`localserve_disk_free_bytes` in /metrics, `disk` in the dashboard's
stats), one warning when it drops under `LOW_SPACE_BYTES` (again only once it
has been back above), and whether it can be written at all.

A data directory that is read-only or cannot be made does not stop the
server: it says so in one line at start-up and in `/health`, and serves
with the disk features paused (Batch API uploads answer 507, the prefix
cache restores what it has and writes nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from localserve.api.state import SETTINGS
from localserve.disk import LOW_SPACE_BYTES, existing, human, writable

log = logging.getLogger(__name__)

CHECK_S = 30.0
REARM_FACTOR = 1.25  # warn again only after the free space was back above threshold x this


@dataclass(slots=True)
class DiskWatch:
    """The latest reading of the data directory's disk."""

    path: Path
    low_bytes: int = LOW_SPACE_BYTES
    free_bytes: int = -1
    total_bytes: int = -1
    writable: bool = True
    warned: bool = False

    def check(self) -> None:
        """Read the free space (blocking: run it off the event loop)."""
        try:
            usage = shutil.disk_usage(existing(self.path))
        except OSError:
            return
        self.free_bytes, self.total_bytes = usage.free, usage.total
        if self.free_bytes < self.low_bytes and not self.warned:
            self.warned = True
            log.warning(
                "the data directory %s has %s free (under %s): uploads, batch results, pulls and the prefix "
                "cache may stop writing; free some space (`localserve cache prune`)",
                self.path, human(self.free_bytes), human(self.low_bytes),
            )  # fmt: skip
        elif self.warned and self.free_bytes > self.low_bytes * REARM_FACTOR:
            self.warned = False

    def check_writable(self) -> None:
        """Whether the data directory takes files (blocking); say so once if not."""
        self.writable = writable(self.path)
        if not self.writable:
            log.warning(
                "the data directory %s is read-only or cannot be made: serving with the disk features off "
                "(Batch API uploads, the prefix cache's writes, pulls); set LOCALSERVE_HOME to a writable folder",
                self.path,
            )

    def health(self) -> dict[str, Any] | None:
        """What `/health` says of the disk: None while it can be written (low
        space is in /metrics, the stats and the log, not a health matter)."""
        if self.writable:
            return None
        return {"data_dir": str(self.path), "writable": False}

    def snapshot(self) -> dict[str, Any]:
        return {
            "data_dir": str(self.path),
            "free_bytes": self.free_bytes,
            "total_bytes": self.total_bytes,
            "writable": self.writable,
            "low": 0 <= self.free_bytes < self.low_bytes,
        }


DISK_WATCH = web.AppKey("disk_watch", DiskWatch)


def register(app: web.Application) -> None:
    app[DISK_WATCH] = DiskWatch(app[SETTINGS].data_path())
    app.cleanup_ctx.append(_watching)


async def _watching(app: web.Application) -> AsyncIterator[None]:
    watch = app[DISK_WATCH]
    await asyncio.to_thread(watch.check_writable)
    await asyncio.to_thread(watch.check)
    task = asyncio.create_task(_watch(watch), name="disk-watch")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _watch(watch: DiskWatch) -> None:
    while True:
        await asyncio.sleep(CHECK_S)
        await asyncio.to_thread(watch.check)
        if not watch.writable:  # made writable meanwhile (remounted, permissions fixed)?
            await asyncio.to_thread(watch.check_writable)
