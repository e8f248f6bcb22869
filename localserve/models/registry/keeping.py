"""How long the registry's models stay loaded: room per kind by LRU
eviction of idle models, unloads, and the reaper that ends idle models'
keep_alive (see `core` for the rules)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from localserve.errors import InvalidRequestError, QueueFullError
from localserve.models.kinds import ROUTES, ModelKind
from localserve.models.policy import format_keep_alive
from localserve.models.registry.records import ModelRecord, RecordState

log = logging.getLogger(__name__)

EVICT_WAIT_S = 60.0  # how long a load waits for a busy model of its kind to become idle
REAP_INTERVAL_S = 1.0


class KeptModels(Protocol):
    """What a `Keeper` needs of its registry (`ModelRegistry` is one): the
    records, which it edits (an unloaded model's record goes), the limit per
    kind, whether a model is busy, and how to close one."""

    @property
    def records(self) -> dict[str, ModelRecord]: ...

    @property
    def limits(self) -> Mapping[ModelKind, int]: ...

    def busy(self, record: ModelRecord) -> bool: ...

    async def uninstall(self, record: ModelRecord) -> None: ...


class Keeper:
    """Eviction, unloads and the reaper of one registry."""

    def __init__(self, registry: KeptModels) -> None:
        self.registry = registry
        self._kind_locks: dict[ModelKind, asyncio.Lock] = {}
        self._changed = asyncio.Event()
        self._reaper: asyncio.Task[None] | None = None

    def changed(self) -> None:
        """A model was released, loaded or unloaded: wake whoever waits on that."""
        self._changed.set()

    async def make_room(self, record: ModelRecord) -> None:
        """Reserve a place for `record` among the loaded models of its kind,
        unloading the least recently used idle ones as needed."""
        limit = self.registry.limits.get(record.kind, 0)
        lock = self._kind_locks.setdefault(record.kind, asyncio.Lock())
        async with lock:
            deadline = time.monotonic() + EVICT_WAIT_S
            while limit:
                others = [
                    r
                    for r in self.registry.records.values()
                    if r.kind == record.kind
                    and r is not record
                    and r.state in (RecordState.LOADING, RecordState.LOADED, RecordState.UNLOADING)
                ]
                if len(others) < limit:
                    break
                unloading = next((r for r in others if r.state == RecordState.UNLOADING), None)
                idle = [r for r in others if r.state == RecordState.LOADED and not self.registry.busy(r)]
                if unloading is not None:
                    assert unloading.task is not None
                    await asyncio.shield(unloading.task)
                elif idle:
                    victim = min(idle, key=lambda r: r.last_used)
                    await self.unload(victim, f"least recently used of {len(others)} {record.kind} models")
                elif time.monotonic() >= deadline:
                    raise QueueFullError(
                        f"cannot load {record.model_id!r}: all {limit} loaded {record.kind} models are busy "
                        "(--max-loaded-models); retry shortly",
                        retry_after_s=5,
                    )
                else:
                    await self._wait_for_change(0.25)  # in-flight counts change without a signal
            record.state = RecordState.LOADING

    async def unload(self, record: ModelRecord, reason: str) -> None:
        record.state = RecordState.UNLOADING
        record.task = asyncio.create_task(self._unload(record, reason), name=f"localserve-unload-{record.model_id}")
        record.task.add_done_callback(retrieve)
        await asyncio.shield(record.task)

    async def _unload(self, record: ModelRecord, reason: str) -> None:
        try:
            await self.registry.uninstall(record)
            log.info("unloaded %s (%s)", record.model_id, reason)
        finally:
            if self.registry.records.get(record.model_id) is record:
                del self.registry.records[record.model_id]
            self.changed()

    # ---- the reaper ------------------------------------------------------------------

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="localserve-model-reaper")

    async def stop(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None

    async def reap(self) -> float:
        """Unload every idle model whose keep_alive ran out; seconds until the next one may."""
        next_check = REAP_INTERVAL_S
        for record in list(self.registry.records.values()):
            if record.state != RecordState.LOADED:
                continue
            now = time.monotonic()
            if self.registry.busy(record):
                record.last_used = now  # its clock starts when the last request ends
                continue
            remaining = record.last_used + record.keep_alive_s - now
            if remaining <= 0:
                await self.unload(record, f"idle for keep_alive={format_keep_alive(record.keep_alive_s)}")
            else:
                next_check = min(next_check, remaining)
        return next_check

    async def _reap_forever(self) -> None:
        while True:
            try:
                delay = await self.reap()
            except Exception:
                log.exception("model reaper failed; retrying")
                delay = REAP_INTERVAL_S
            await self._wait_for_change(delay)

    async def _wait_for_change(self, timeout: float) -> None:
        # Cleared after waking, so that a change made while the caller was busy is not lost.
        # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel that
        # arrives as the event is set, and the reaper would then never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        self._changed.clear()


def check_kind(model_id: str, kind: ModelKind, wanted: ModelKind | None) -> None:
    """400 when a request for a `wanted` model names a model of another kind."""
    if wanted is not None and kind != wanted:
        raise InvalidRequestError(
            f"model {model_id!r} is a {kind} model, not a {wanted} model; use {ROUTES[kind]}", param="model"
        )


def retrieve(task: asyncio.Task[None]) -> None:
    """Mark a shared task's exception as seen: its waiters may all be gone."""
    if not task.cancelled():
        task.exception()
