"""Which models are loaded, and for how long: loading on demand, a limit per
kind with LRU eviction of idle models, and `keep_alive` (Ollama's semantics).

* `acquire(model_id)` returns a `Lease` once the model is loaded, loading a
  known model first (in a thread: other models keep serving). Concurrent
  acquires of one model share one load.
* Each kind (chat, embeddings, asr) holds at most `--max-loaded-models`; to
  make room, the least recently used *idle* model of that kind is unloaded.
  A model is idle when no lease is held and neither its engine queue nor its
  batcher has work. If every model of the kind is busy, the load waits for
  one to become idle (up to EVICT_WAIT_S, then 503).
* `release(lease)` sets how long the model stays loaded once idle: the
  request's keep_alive, else the model's default (`--keep-alive`; without it,
  5 minutes for models loaded on demand and forever for the start-up ones).
  0 unloads it as soon as it is idle, a negative value keeps it forever.
* A reaper task unloads idle models whose keep_alive has run out.
* `acquire(..., options=...)` (`POST /api/v1/load`) loads with options above
  every other level (models/options.py); a model loaded with other options
  must be unloaded first.

Everything here runs on the event loop; only the loads and unloads
themselves run in threads (inside `ModelManager`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from localserve.config import ServerSettings
from localserve.errors import InvalidRequestError, ModelNotFoundError, QueueFullError
from localserve.models.catalog import ModelOptions
from localserve.models.names import validate_model_id
from localserve.models.policy import (
    ASR,
    CHAT,
    DEFAULT_ON_DEMAND_KEEP_ALIVE_S,
    EMBEDDINGS,
    FOREVER,
    format_keep_alive,
    kind_of,
    parse_keep_alive,
    parse_max_loaded_models,
)
from localserve.models.registry import LoadedModel, LoadedOneShot, ModelManager, ModelSpec, spec_of
from localserve.models.store.discovery import find

log = logging.getLogger(__name__)

PENDING, LOADING, LOADED, UNLOADING = "pending", "loading", "loaded", "unloading"
EVICT_WAIT_S = 60.0  # how long a load waits for a busy model of its kind to become idle
REAP_INTERVAL_S = 1.0
_ROUTES = {CHAT: "/v1/chat/completions", EMBEDDINGS: "/v1/embeddings", ASR: "/v1/audio/transcriptions"}


@dataclass(slots=True, eq=False)
class ModelRecord:
    """One model the lifecycle tracks, from the start of its load to its unload."""

    spec: ModelSpec
    kind: str
    default_keep_alive_s: float
    state: str = PENDING
    num_users: int = 0  # leases held, and requests waiting for the load
    last_used: float = field(default_factory=time.monotonic)
    keep_alive_s: float = FOREVER  # once idle; set by each release
    task: asyncio.Task[None] | None = None  # the load or the unload in progress

    @property
    def model_id(self) -> str:
        return self.spec.model_id


@dataclass(frozen=True, slots=True)
class Lease:
    """A model held loaded for one request; give it back with `release`."""

    record: ModelRecord
    keep_alive_s: float | None  # None: the model's default

    @property
    def model_id(self) -> str:
        return self.record.model_id


class ModelLifecycle:
    """Loads, keeps and unloads the models of one `ModelManager`."""

    def __init__(
        self,
        manager: ModelManager,
        settings: ServerSettings,
        *,
        find_spec: Callable[[str], ModelSpec | None] | None = None,
    ) -> None:
        self.manager = manager
        self.limits = parse_max_loaded_models(settings.max_loaded_models)
        self.keep_alive_s = parse_keep_alive(settings.keep_alive, param="keep_alive setting")
        self.records: dict[str, ModelRecord] = {}
        self.known_specs: dict[str, ModelSpec] = {}  # models loaded once (start-up ID=PATH models too)
        self.names: dict[str, str] = {}  # a name clients used -> the id its model is served under
        self._find_spec = find_spec or find_known_spec
        self._kind_locks: dict[str, asyncio.Lock] = {}
        self._changed = asyncio.Event()
        self._reaper: asyncio.Task[None] | None = None

    # ---- leases ----------------------------------------------------------------------

    async def acquire(
        self, model_id: str, *, kind: str | None = None, keep_alive: object = None, options: ModelOptions | None = None
    ) -> Lease:
        """Hold `model_id` loaded (loading it first if needed, with `options`
        if given); 400 for a bad id, the wrong kind or other options than the
        loaded model's, 404 for an unknown model, 503 if no room frees up."""
        validate_model_id(model_id)
        keep_alive_s = parse_keep_alive(keep_alive)  # type: ignore[arg-type]
        options = options if options is not None and options.given() else None
        while True:
            self.sync()
            model_id = self.names.get(model_id, model_id)
            record = self.records.get(model_id)
            if record is None:
                spec = self.known_specs.get(model_id)
                if spec is None:
                    spec = await asyncio.to_thread(self._spec, model_id)
                    if spec.model_id != model_id:  # `llama3.2` is served as `llama3.2:latest`
                        self.names[model_id] = spec.model_id
                        continue
                _check_kind(model_id, kind_of(spec.labels), kind)
                if options is not None:
                    spec = dataclasses.replace(spec, options=options)
                record = self.records.get(model_id)  # another request may have started it meanwhile
                if record is None:
                    record = self._start_load(spec)
            _check_kind(model_id, record.kind, kind)
            if options is not None and record.spec.options != options and record.state != UNLOADING:
                raise InvalidRequestError(
                    f"model {model_id!r} is loaded with other options ({record.spec.options.given() or 'its defaults'}); "
                    "unload it first (POST /api/v1/unload) to load it with these",
                    param="options",
                )
            if record.state == UNLOADING:
                assert record.task is not None
                await asyncio.shield(record.task)
                continue
            break
        record.num_users += 1
        try:
            if record.state in (PENDING, LOADING):
                assert record.task is not None
                await asyncio.shield(record.task)  # a cancelled request does not cancel the shared load
        except BaseException:
            record.num_users -= 1
            raise
        record.last_used = time.monotonic()
        return Lease(record, keep_alive_s)

    def release(self, lease: Lease) -> None:
        """The request is done with the model: start its keep_alive clock."""
        record = lease.record
        record.num_users = max(0, record.num_users - 1)
        record.last_used = time.monotonic()
        record.keep_alive_s = record.default_keep_alive_s if lease.keep_alive_s is None else lease.keep_alive_s
        self._changed.set()

    def _spec(self, model_id: str) -> ModelSpec:
        spec = self._find_spec(model_id)
        if spec is None:
            loaded = ", ".join(sorted(self.records)) or "none"
            raise ModelNotFoundError(
                f"The model {model_id!r} does not exist (loaded: {loaded}; `localserve list` shows the known models)",
                param="model",
            )
        return spec

    # ---- loading ---------------------------------------------------------------------

    def _start_load(self, spec: ModelSpec) -> ModelRecord:
        kind = kind_of(spec.labels)
        default = self.keep_alive_s if self.keep_alive_s is not None else DEFAULT_ON_DEMAND_KEEP_ALIVE_S
        record = ModelRecord(spec, kind, default, keep_alive_s=default)
        self.records[spec.model_id] = record
        record.task = asyncio.create_task(self._load(record), name=f"localserve-load-{spec.model_id}")
        record.task.add_done_callback(_retrieve)
        return record

    async def _load(self, record: ModelRecord) -> None:
        try:
            await self._make_room(record)
            log.info("loading %s (%s) on demand", record.model_id, record.kind)
            loaded = await self.manager.load(record.spec)
        except BaseException:
            if self.records.get(record.model_id) is record:
                del self.records[record.model_id]
            self._changed.set()
            raise
        record.state = LOADED
        record.last_used = time.monotonic()
        self.known_specs[record.model_id] = dataclasses.replace(record.spec, options=ModelOptions())  # next: its own
        log.info("model %s ready (%.1f s)", record.model_id, loaded.load_seconds)
        self._changed.set()

    async def _make_room(self, record: ModelRecord) -> None:
        """Reserve a place for `record` among the loaded models of its kind,
        unloading the least recently used idle ones as needed."""
        limit = self.limits.get(record.kind, 0)
        lock = self._kind_locks.setdefault(record.kind, asyncio.Lock())
        async with lock:
            deadline = time.monotonic() + EVICT_WAIT_S
            while limit:
                self.sync()
                others = [
                    r
                    for r in self.records.values()
                    if r.kind == record.kind and r is not record and r.state in (LOADING, LOADED, UNLOADING)
                ]
                if len(others) < limit:
                    break
                unloading = next((r for r in others if r.state == UNLOADING), None)
                idle = [r for r in others if r.state == LOADED and not self.busy(r)]
                if unloading is not None:
                    assert unloading.task is not None
                    await asyncio.shield(unloading.task)
                elif idle:
                    victim = min(idle, key=lambda r: r.last_used)
                    await self._unload(victim, f"least recently used of {len(others)} {record.kind} models")
                elif time.monotonic() >= deadline:
                    raise QueueFullError(
                        f"cannot load {record.model_id!r}: all {limit} loaded {record.kind} models are busy "
                        "(--max-loaded-models); retry shortly",
                        retry_after_s=5,
                    )
                else:
                    await self._wait_for_change(0.25)  # in-flight counts change without a signal
            record.state = LOADING

    # ---- unloading -------------------------------------------------------------------

    async def unload(self, model_id: str) -> None:
        """Unload now (requests in flight on it end with an error); 404 if not loaded."""
        validate_model_id(model_id)
        self.sync()
        model_id = self.names.get(model_id, model_id)
        record = self.records.get(model_id)
        if record is not None and record.state in (PENDING, LOADING) and record.task is not None:
            await asyncio.shield(record.task)
            record = self.records.get(model_id)
        if record is None:
            raise ModelNotFoundError(f"model {model_id!r} is not loaded", param="model")
        if record.state == UNLOADING and record.task is not None:
            await asyncio.shield(record.task)
            return
        await self._unload(record, "asked to")

    def forget(self, model_id: str) -> None:
        """Drop what we remember of a model's files (after it left the store)."""
        self.known_specs.pop(model_id, None)
        for name in [name for name, target in self.names.items() if model_id in (name, target)]:
            del self.names[name]

    async def _unload(self, record: ModelRecord, reason: str) -> None:
        record.state = UNLOADING
        record.task = asyncio.create_task(self._do_unload(record, reason), name=f"localserve-unload-{record.model_id}")
        record.task.add_done_callback(_retrieve)
        await asyncio.shield(record.task)

    async def _do_unload(self, record: ModelRecord, reason: str) -> None:
        try:
            with contextlib.suppress(ModelNotFoundError):  # someone else unloaded it
                await self.manager.unload(record.model_id)
            log.info("unloaded %s (%s)", record.model_id, reason)
        finally:
            if self.records.get(record.model_id) is record:
                del self.records[record.model_id]
            self._changed.set()

    # ---- state -----------------------------------------------------------------------

    def sync(self) -> None:
        """Adopt models loaded behind our back (the start-up loader) and drop
        the ones unloaded behind it (`POST /api/v1/unload`)."""
        loaded: dict[str, LoadedModel | LoadedOneShot] = {**self.manager.oneshot, **self.manager.loaded}
        for model_id, model in loaded.items():
            if model_id not in self.records:
                spec = model.spec
                default = FOREVER if self.keep_alive_s is None else self.keep_alive_s
                self.records[model_id] = ModelRecord(spec, kind_of(spec.labels), default, LOADED, keep_alive_s=default)
                self.known_specs[model_id] = spec
        for model_id, record in list(self.records.items()):
            if record.state == LOADED and model_id not in loaded:
                del self.records[model_id]

    def busy(self, record: ModelRecord) -> bool:
        """Leases held, or work queued or running in the engine or the batcher."""
        if record.num_users:
            return True
        engine = self.manager.engine
        if engine.has_model(record.model_id) and engine.num_in_flight(record.model_id):
            return True
        oneshot = self.manager.oneshot.get(record.model_id)
        if oneshot is not None:
            stats = oneshot.batcher.stats(0.0)
            return bool(stats.get("in_flight") or stats.get("queue_items"))
        return False

    def describe(self) -> list[dict[str, object]]:
        """The tracked models, for `GET /api/v1/loaded` and `localserve list`."""
        self.sync()
        now = time.monotonic()
        out = []
        for record in sorted(self.records.values(), key=lambda r: r.model_id):
            idle = record.state == LOADED and not self.busy(record)
            expires_in = record.last_used + record.keep_alive_s - now if idle else None
            out.append(
                {
                    "id": record.model_id,
                    "kind": record.kind,
                    "state": record.state,
                    "in_use": not idle and record.state == LOADED,
                    "keep_alive": format_keep_alive(record.keep_alive_s),
                    "expires_in_s": None if expires_in is None or expires_in == FOREVER else max(0.0, expires_in),
                    "options": self.manager.load_report(record.model_id) if record.state == LOADED else {},
                }
            )
        return out

    # ---- the reaper ------------------------------------------------------------------

    def start(self) -> None:
        if self._reaper is None:
            self._reaper = asyncio.create_task(self._reap_forever(), name="localserve-model-reaper")

    async def stop(self) -> None:
        """Stop the reaper and abandon loads still waiting (server shutdown)."""
        for record in list(self.records.values()):
            if record.state in (PENDING, LOADING) and record.task is not None:
                record.task.cancel()
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
            self._reaper = None

    async def reap(self) -> float:
        """Unload every idle model whose keep_alive ran out; seconds until the next one may."""
        self.sync()
        next_check = REAP_INTERVAL_S
        for record in list(self.records.values()):
            if record.state != LOADED:
                continue
            now = time.monotonic()
            if self.busy(record):
                record.last_used = now  # its clock starts when the last request ends
                continue
            remaining = record.last_used + record.keep_alive_s - now
            if remaining <= 0:
                await self._unload(record, f"idle for keep_alive={format_keep_alive(record.keep_alive_s)}")
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
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        self._changed.clear()


def find_known_spec(model_id: str) -> ModelSpec | None:
    """The spec of a model by name (never a path: names come from clients);
    its id may differ (`llama3.2` is `llama3.2:latest`). Blocking (reads small files)."""
    found = find(model_id)
    return None if found is None else spec_of(found)


def _check_kind(model_id: str, kind: str, wanted: str | None) -> None:
    if wanted is not None and kind != wanted:
        raise InvalidRequestError(
            f"model {model_id!r} is a {kind} model, not a {wanted} model; use {_ROUTES[kind]}", param="model"
        )


def _retrieve(task: asyncio.Task[None]) -> None:
    """Mark a shared task's exception as seen: its waiters may all be gone."""
    if not task.cancelled():
        task.exception()
