"""What the Files and Batch routes share: the job store and the batch runner
of the app (opened lazily, resumed at start-up), whose lines the serving
layer answers (`serving.openai.batch_lines`) with the app's models."""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
from pathlib import Path
from typing import Any

from aiohttp import web

from localserve.api.holds import holding
from localserve.api.hosting import app_models
from localserve.api.state import SETTINGS
from localserve.disk import is_storage_error, storage_error
from localserve.errors import LocalServeError
from localserve.jobs.runner import BatchRunner, RunnerConfig
from localserve.jobs.store import JobStore
from localserve.jobs.validate import Limits
from localserve.serving.openai.batch_lines import ServingLineExecutor

log = logging.getLogger(__name__)


class BatchService:
    """The app's job store and runner. Opened on first use of the Files or
    Batch API, or at start-up when a store exists (to resume its batches)."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.store: JobStore | None = None
        self.runner: BatchRunner | None = None
        self._lock = asyncio.Lock()

    @property
    def root(self) -> Path:
        return self.app[SETTINGS].data_path() / "jobs"

    def limits(self) -> Limits:
        settings = self.app[SETTINGS]
        return Limits(max_lines=settings.batch_max_lines, max_bytes=settings.batch_max_file_bytes)

    def runner_config(self) -> RunnerConfig:
        return RunnerConfig(limits=self.limits(), storage_timeout_s=self.app[SETTINGS].batch_disk_timeout_s)

    async def open(self) -> tuple[JobStore, BatchRunner]:
        async with self._lock:
            if self.store is None or self.runner is None:
                try:
                    store = await asyncio.to_thread(JobStore, self.root)
                except (OSError, sqlite3.Error) as exc:  # a full or read-only disk: 507, and tried again next time
                    if not is_storage_error(exc):
                        raise
                    raise storage_error(exc, self.root, "opening the batch job store") from None
                executor = ServingLineExecutor(app_models(self.app), self.app[SETTINGS].batch_concurrency)
                hold = functools.partial(holding, self.app)  # the batch's model stays loaded while it runs
                runner = BatchRunner(store, executor, self.runner_config(), hold_model=hold)
                await runner.start()
                self.store, self.runner = store, runner
                log.info("batch jobs in %s", self.root)
        return self.store, self.runner

    async def resume(self) -> None:
        """At start-up: open an existing store, so its unfinished batches go on."""
        if await asyncio.to_thread((self.root / "jobs.sqlite3").exists):
            try:
                await self.open()
            except LocalServeError as exc:  # e.g. another server runs them: serve the rest anyway
                log.warning("batch jobs not resumed: %s", exc.message)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.stop()
        if self.store is not None:
            await asyncio.to_thread(self.store.close)
        self.store = self.runner = None

    def snapshot(self) -> list[dict[str, Any]]:
        """The stats hook: batch objects of unfinished and recent batches."""
        return self.runner.snapshot() if self.runner is not None else []


JOBS = web.AppKey("jobs", BatchService)


async def jobs_of(request: web.Request) -> tuple[JobStore, BatchRunner]:
    return await request.app[JOBS].open()
