"""How long the registry's models stay loaded: room per kind by LRU
eviction (an idle model goes at once, a busy one drains first), unloads,
and the reaper that ends idle models' keep_alive (see `core` for the rules)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from localserve.errors import InvalidRequestError, QueueFullError
from localserve.models.kinds import ROUTES, Kinds, ModelKind, kind_in, kinds_text
from localserve.models.policy import format_keep_alive
from localserve.models.registry.records import ModelRecord, RecordState

log = logging.getLogger(__name__)

EVICT_WAIT_S = 60.0  # how long a load waits for a model of its kind that is still loading
DRAIN_WAIT_S = 60.0  # how long a model being swapped out may finish its answers in flight
DRAIN_POLL_S = 0.05
REAP_INTERVAL_S = 1.0
LEAVING = (RecordState.DRAINING, RecordState.UNLOADING)


class KeptModels(Protocol):
    """What a `Keeper` needs of its registry (`ModelRegistry` is one): the
    records, which it edits (an unloaded model's record goes), the limit per
    kind, whether a model is busy, how to end its answers in flight and how
    to close one."""

    @property
    def records(self) -> dict[str, ModelRecord]: ...

    @property
    def limits(self) -> Mapping[ModelKind, int]: ...

    def busy(self, record: ModelRecord) -> bool: ...

    def end_requests(self, record: ModelRecord) -> int: ...

    async def unload_record(self, record: ModelRecord) -> None: ...


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
        """Reserve a place for `record` among the loaded models of its kind:
        unload the least recently used idle one, or else drain the least
        recently used busy one (it finishes its answers in flight, up to
        DRAIN_WAIT_S, and takes no new ones) and unload it."""
        limit = self.registry.limits.get(record.kind, 0)
        lock = self._kind_locks.setdefault(record.kind, asyncio.Lock())
        async with lock:
            deadline = time.monotonic() + EVICT_WAIT_S
            while limit:
                others = [
                    r
                    for r in self.registry.records.values()
                    if r.kind == record.kind and r is not record and r.state != RecordState.PENDING
                ]
                if len(others) < limit:
                    break
                leaving = next((r for r in others if r.state in LEAVING), None)
                loaded = [r for r in others if r.state == RecordState.LOADED]
                if leaving is not None:
                    assert leaving.task is not None
                    await asyncio.shield(leaving.task)
                elif loaded:
                    idle = [r for r in loaded if not self.registry.busy(r)]
                    victim = min(idle or loaded, key=lambda r: r.last_used)
                    reason = f"least recently used of {len(others)} {record.kind} models, for {record.model_id}"
                    await self.unload(victim, reason, drain=not idle)
                elif time.monotonic() >= deadline:
                    raise QueueFullError(
                        f"cannot load {record.model_id!r}: all {limit} {record.kind} models are still loading "
                        "(--max-loaded-models); retry shortly",
                        retry_after_s=5,
                    )
                else:
                    await self._wait_for_change(0.25)
            record.state = RecordState.LOADING

    async def unload(self, record: ModelRecord, reason: str, *, drain: bool = False) -> None:
        """Unload `record` now, or with `drain` once its answers in flight are done."""
        record.state = RecordState.DRAINING if drain else RecordState.UNLOADING
        record.task = asyncio.create_task(
            self._unload(record, reason, drain), name=f"localserve-unload-{record.model_id}"
        )
        record.task.add_done_callback(retrieve)
        await asyncio.shield(record.task)

    async def _unload(self, record: ModelRecord, reason: str, drain: bool) -> None:
        try:
            if drain:
                await self._drain(record, reason)
            record.state = RecordState.UNLOADING
            await self.registry.unload_record(record)  # closes the backend: the hook for what outlives the model
            log.info("unloaded %s (%s)", record.model_id, reason)
        finally:
            if self.registry.records.get(record.model_id) is record:
                del self.registry.records[record.model_id]
            self.changed()

    async def _drain(self, record: ModelRecord, reason: str) -> None:
        """Wait, up to DRAIN_WAIT_S, until no request holds `record` or runs on
        it (new requests for it wait for the unload, then load it again);
        then end what still runs, with an error that says why."""
        bound_s = DRAIN_WAIT_S
        log.info(
            "%s: finishing its answers in flight before it unloads (%s; up to %g s)", record.model_id, reason, bound_s
        )
        deadline = time.monotonic() + bound_s
        while self.registry.busy(record) and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)  # streams end without a signal to the registry
        if self.registry.busy(record):
            num_ended = self.registry.end_requests(record)
            log.warning(
                "%s: ended %d answers still running after %g s, to unload it (%s)",
                record.model_id,
                num_ended,
                bound_s,
                reason,
            )

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


def check_kind(model_id: str, kind: ModelKind, wanted: Kinds | None) -> None:
    """400 when a request for a `wanted` model names a model of another kind."""
    if not kind_in(kind, wanted):
        assert wanted is not None
        raise InvalidRequestError(
            f"model {model_id!r} is {kinds_text(kind)} model, not {kinds_text(wanted)} model; use {ROUTES[kind]}",
            param="model",
        )


def retrieve(task: asyncio.Task[None]) -> None:
    """Mark a shared task's exception as seen: its waiters may all be gone."""
    if not task.cancelled():
        task.exception()
