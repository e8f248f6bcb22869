"""`ModelRegistry`: the one owner of the server's models.

* **Names.** `hold(name)` resolves a name a client gave in one pass
  (`specs.find_spec`), remembers the specs of models it loaded (start-up
  `ID=PATH` models too, which no name finds) and the names served under
  another id (`llama3.2` is `llama3.2:latest`).
* **Loads.** A generative model goes into the engine, a one-shot model
  (embeddings, speech) behind a new queue; the backend opens in a thread
  (`open_model`, `open_oneshot`), so other models keep serving. Concurrent
  asks for one model share one load.
* **Start-up.** `start()` loads `settings.models` in the background, the
  first ones named of each kind up to its `--max-loaded-models`; the others
  are remembered in `not_loaded` (/health, one log line each) and load on
  their first request. While it runs, a model that is not loaded yet
  answers 503 (`check_ready`). A start-up model that fails is remembered in
  `load_errors` (/health).
* **Holds and keep_alive.** `hold` returns a `ModelHold` once the model is
  loaded; `release(hold)` sets how long the model stays loaded once idle:
  the hold's keep_alive, else the model's default (`--keep-alive`; without
  it 5 minutes for models loaded on demand, forever for start-up models).
  0 unloads it as soon as it is idle, a negative value keeps it forever.
  A reaper task unloads idle models whose keep_alive has run out.
* **Limits.** Each kind (chat, embeddings, transcription) holds at most
  `--max-loaded-models` models loaded on demand; to make room, the least
  recently used *idle* model of the kind is unloaded. A model is idle when
  nothing holds it and neither its engine queue nor its queue has work.
  If every model of the kind is busy, the least recently used one *drains*
  (`keeping.Keeper`): it takes no new requests (they wait for the swap, then
  load it again) and finishes its answers in flight, for up to DRAIN_WAIT_S;
  what still runs then ends with a 503 that says why, and it unloads.
* **Options.** `hold(..., options=...)` (`POST /api/v1/load`) loads with
  options above every other level (models/options.py); a model loaded with
  other options must be unloaded first.

Everything here runs on the event loop; only opening and closing backends
run in threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from localserve.config import ServerSettings
from localserve.engine.backend import GenerativeBackend, OneShotBackend
from localserve.engine.engine import SWAPPED_OUT_MESSAGE, Engine, EngineConfig
from localserve.engine.oneshot.queue import OneShotQueue, OneShotQueueConfig
from localserve.engine.step.scheduler import SchedulerConfig
from localserve.engine.types import Capacity
from localserve.errors import InvalidRequestError, LocalServeError, ModelLoadingError, ModelNotFoundError
from localserve.models.catalog import ModelOptions
from localserve.models.kinds import Kinds, ModelKind, kind_of
from localserve.models.names import validate_model_id
from localserve.models.oneshot import oneshot_kind
from localserve.models.plan import LoadReport
from localserve.models.policy import (
    DEFAULT_ON_DEMAND_KEEP_ALIVE_S,
    FOREVER,
    parse_keep_alive,
    parse_max_loaded_models,
)
from localserve.models.registry.keeping import LEAVING, Keeper, check_kind, retrieve
from localserve.models.registry.opening import open_generative, open_oneshot
from localserve.models.registry.records import LoadedModel, LoadedOneShot, ModelHold, ModelRecord, RecordState
from localserve.models.registry.specs import ModelSpec, find_spec, resolve
from localserve.models.registry.views import RegistryViews

log = logging.getLogger(__name__)


PREFIX_DISK_MAX_AUTO = 4 << 30  # auto: a tenth of the free disk, at most this


def prefix_disk(settings: ServerSettings) -> tuple[Path | None, int]:
    """Where the prefix cache's disk tier lives and its bound (None: off)."""
    if settings.prefix_cache_disk == 0:
        return None, 0
    root = settings.data_path() / "prefix-cache"
    if settings.prefix_cache_disk > 0:
        return root, settings.prefix_cache_disk
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    return root, min(PREFIX_DISK_MAX_AUTO, shutil.disk_usage(existing).free // 10)


class ModelRegistry(RegistryViews):
    """Resolves, loads, keeps alive, evicts and unloads the models of one engine."""

    def __init__(
        self,
        engine: Engine,
        settings: ServerSettings,
        *,
        find: Callable[[str], ModelSpec | None] = find_spec,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.limits = parse_max_loaded_models(settings.max_loaded_models)
        self.keep_alive_s = parse_keep_alive(settings.keep_alive, param="keep_alive setting")
        self.records: dict[str, ModelRecord] = {}  # every model loading, loaded or unloading
        self.load_errors: dict[str, str] = {}  # start-up model (as named in settings) -> why it did not load
        self.not_loaded: dict[str, str] = {}  # start-up model left for its first request (the limit) -> why
        self._find = find
        self._known: dict[str, ModelSpec] = {}  # models loaded once: loaded again without a lookup
        self._names: dict[str, str] = {}  # a name clients used -> the id its model is served under
        self._startup_specs: dict[str, ModelSpec] = {}
        self._startup_ids: set[str] = set()  # start-up models: kept loaded forever by default, even on demand
        self.startup: asyncio.Task[None] | None = None  # the start-up loads, while they run
        self.keeper = Keeper(self)

    # ---- start-up and shutdown -------------------------------------------------------

    def resolve_startup(self) -> None:
        """Resolve the start-up models now (blocking), so that a typo fails
        before the server starts instead of leaving it never ready."""
        self._startup_specs = {name: resolve(name) for name in self.settings.models}

    def start(self, *, stop_on_error: bool = False) -> None:
        """Load the start-up models in the background and start the reaper.
        With `stop_on_error` the first failure stops the start-up loads
        (`localserve serve` then exits naming it)."""
        self.startup = asyncio.create_task(self._load_startup(stop_on_error), name="localserve-load-models")
        self.keeper.start()

    @property
    def starting(self) -> bool:
        return self.startup is not None and not self.startup.done()

    async def _load_startup(self, stop_on_error: bool) -> None:
        num_loaded: Counter[ModelKind] = Counter()
        for name in self.settings.models:
            try:
                spec = self._startup_specs.get(name)
                if spec is None:
                    spec = await asyncio.to_thread(resolve, name)
                self._startup_ids.add(spec.model_id)
                kind = kind_of(spec.labels)
                if 0 < self.limits.get(kind, 0) <= num_loaded[kind]:
                    self._leave_for_later(name, spec, kind)
                    continue
                await self.load(spec)
                num_loaded[kind] += 1
            except LocalServeError as exc:
                self.load_errors[name] = exc.message
            except Exception as exc:  # a bug or a native failure: one line here, the traceback at debug level
                self.load_errors[name] = f"{type(exc).__name__}: {exc}"
                log.debug("loading %s failed", name, exc_info=True)
            else:
                continue
            if stop_on_error:
                return  # `serve` reports it and exits; the other models need not load
            log.error("could not load model %s: %s", name, self.load_errors[name])

    def _leave_for_later(self, name: str, spec: ModelSpec, kind: ModelKind) -> None:
        """A start-up model beyond its kind's limit: known by its id (even an
        `ID=PATH` one), loaded by its first request."""
        self._known[spec.model_id] = spec
        if spec.model_id != name:
            self._names[name] = spec.model_id
        why = f"not loaded at start (--max-loaded-models {kind}={self.limits[kind]}); loads on first request"
        self.not_loaded[name] = why
        log.info("%s: %s", spec.model_id, why)

    async def close(self) -> None:
        """Server shutdown: abandon the loads still running, stop the reaper,
        close the engine and every one-shot model."""
        tasks = [self.startup] + [
            r.task for r in self.records.values() if r.state in (RecordState.PENDING, RecordState.LOADING)
        ]
        for task in tasks:
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await self.keeper.stop()
        await self.engine.close()
        for record in list(self.records.values()):
            if isinstance(record.model, LoadedOneShot):
                await _close_oneshot(record.model)
        self.records.clear()

    # ---- holds -----------------------------------------------------------------------

    def check_ready(self, model_id: str) -> None:
        """400 for a bad id; 503 while the start-up models load, for a model
        that is not loaded yet (it may be one of them)."""
        validate_model_id(model_id)
        if self.starting and not self.is_loaded(model_id):
            raise ModelLoadingError(f"model {model_id!r} is not ready yet: models are still loading; retry in a moment")

    async def hold(
        self,
        name: str,
        *,
        kind: Kinds | None = None,
        keep_alive: object = None,
        options: ModelOptions | None = None,
    ) -> ModelHold:
        """Hold model `name` loaded (loading it first if needed, with `options`
        if given); 400 for a bad id, the wrong kind or other options than the
        loaded model's, 404 for an unknown model, 503 if no room frees up."""
        validate_model_id(name)
        keep_alive_s = parse_keep_alive(keep_alive)  # type: ignore[arg-type]
        record = await self._record(name, kind, options if options is not None and options.given() else None)
        record.num_users += 1
        try:
            if record.state in (RecordState.PENDING, RecordState.LOADING):
                assert record.task is not None
                await asyncio.shield(record.task)  # a cancelled request does not cancel the shared load
        except BaseException:
            record.num_users -= 1
            raise
        record.last_used = time.monotonic()
        return ModelHold(record, keep_alive_s)

    def release(self, hold: ModelHold) -> None:
        """The caller is done with the model: start its keep_alive clock."""
        record = hold.record
        record.num_users = max(0, record.num_users - 1)
        record.last_used = time.monotonic()
        record.keep_alive_s = record.default_keep_alive_s if hold.keep_alive_s is None else hold.keep_alive_s
        self.keeper.changed()

    async def _record(self, name: str, kind: Kinds | None, options: ModelOptions | None) -> ModelRecord:
        """The record of the model `name` means, its load started if needed."""
        model_id = self._names.get(name, name)
        while True:
            record = self.records.get(model_id)
            if record is None:
                spec = self._known.get(model_id)
                if spec is None:
                    spec = await asyncio.to_thread(self._spec, model_id)
                    if spec.model_id != model_id:  # `llama3.2` is served as `llama3.2:latest`
                        self._names[model_id] = spec.model_id
                        model_id = spec.model_id
                check_kind(model_id, kind_of(spec.labels), kind)
                if options is not None:
                    spec = dataclasses.replace(spec, options=options)
                record = self.records.get(model_id)  # another request may have started it meanwhile
                if record is None:
                    record = self._start_load(spec, on_demand=True)
            check_kind(model_id, record.kind, kind)
            if options is not None and record.spec.options != options and record.state not in LEAVING:
                raise InvalidRequestError(
                    f"model {model_id!r} is loaded with other options ({record.spec.options.given() or 'its defaults'}); "
                    "unload it first (POST /api/v1/unload) to load it with these",
                    param="options",
                )
            if record.state not in LEAVING:
                return record
            assert record.task is not None
            await asyncio.shield(record.task)  # a model being swapped out: wait, then load it again

    def _spec(self, model_id: str) -> ModelSpec:
        spec = self._find(model_id)
        if spec is None:
            loaded = ", ".join(sorted(self.records)) or "none"
            raise ModelNotFoundError(
                f"The model {model_id!r} does not exist (loaded: {loaded}; `localserve list` shows the known models)",
                param="model",
            )
        return spec

    # ---- loading ---------------------------------------------------------------------

    async def load(self, spec: ModelSpec) -> LoadedModel | LoadedOneShot:
        """Load `spec` without a hold and without evicting (start-up models,
        `localserve run`, `batch run`); it stays loaded per `--keep-alive`,
        else forever. Callers that ask while it loads share that load."""
        record = self.records.get(spec.model_id)
        while record is not None and record.state in LEAVING:
            assert record.task is not None
            await asyncio.shield(record.task)
            record = self.records.get(spec.model_id)
        if record is None:
            record = self._start_load(spec, on_demand=False)
        record.default_keep_alive_s = record.keep_alive_s = self._default_keep_alive(on_demand=False)
        if record.state != RecordState.LOADED:
            assert record.task is not None
            await asyncio.shield(record.task)
        assert record.model is not None
        return record.model

    def _default_keep_alive(self, *, on_demand: bool) -> float:
        if self.keep_alive_s is not None:
            return self.keep_alive_s
        return DEFAULT_ON_DEMAND_KEEP_ALIVE_S if on_demand else FOREVER

    def _start_load(self, spec: ModelSpec, *, on_demand: bool) -> ModelRecord:
        default = self._default_keep_alive(on_demand=on_demand and spec.model_id not in self._startup_ids)
        record = ModelRecord(spec, kind_of(spec.labels), default, keep_alive_s=default)
        self.records[spec.model_id] = record
        record.task = asyncio.create_task(self._load(record, on_demand), name=f"localserve-load-{spec.model_id}")
        record.task.add_done_callback(retrieve)
        return record

    async def _load(self, record: ModelRecord, on_demand: bool) -> None:
        try:
            if on_demand:
                await self.keeper.make_room(record)
                log.info("loading %s (%s) on demand", record.model_id, record.kind)
            record.state = RecordState.LOADING
            record.model = await self._install(record.spec)
        except BaseException:
            if self.records.get(record.model_id) is record:
                del self.records[record.model_id]
            self.keeper.changed()
            raise
        record.state = RecordState.LOADED
        record.last_used = time.monotonic()
        self._known[record.model_id] = dataclasses.replace(record.spec, options=ModelOptions())  # next: its own
        log.info("model %s ready (%s, %.1f s)", record.model_id, record.spec.path, record.model.load_seconds)
        self.keeper.changed()

    async def _install(self, spec: ModelSpec) -> LoadedModel | LoadedOneShot:
        """Open the backend in a thread; a generative one goes into the
        engine, a one-shot one behind a new queue."""
        started = time.monotonic()
        kind = oneshot_kind(spec.labels)
        if kind is not None:
            oneshot, batching = await asyncio.to_thread(self.open_oneshot, spec, kind)
            queue = OneShotQueue(spec.model_id, oneshot, batching, adaptive_threads=self.settings.adaptive_threads)
            return LoadedOneShot(spec, kind, oneshot, queue, load_seconds=time.monotonic() - started)
        backend, report = await asyncio.to_thread(self.open_model, spec)
        self.engine.add_model(spec.model_id, backend, self._engine_config(backend.capacity()))
        await self.engine.warmed_up(spec.model_id)
        return LoadedModel(spec, backend, load_seconds=time.monotonic() - started, report=report)

    def open_model(self, spec: ModelSpec) -> tuple[GenerativeBackend, LoadReport]:
        """Open a generative model's backend (blocking)."""
        return open_generative(spec, self.settings)

    def open_oneshot(self, spec: ModelSpec, kind: ModelKind) -> tuple[OneShotBackend, OneShotQueueConfig]:  # type: ignore[type-arg]
        """Open a one-shot model's backend (blocking: converts on first use)."""
        return open_oneshot(spec, kind, self.settings)

    def _engine_config(self, capacity: Capacity) -> EngineConfig:
        settings = self.settings
        speculative = settings.speculative
        if speculative == "draft" and not capacity.has_draft_model:
            speculative = "ngram"  # no --draft-model, or one of another vocabulary (logged at load)
        scheduler = SchedulerConfig(
            aging_s=settings.aging_s,
            reserved_slots=None if settings.reserved_slots < 0 else settings.reserved_slots,
            itl_target=settings.batch_itl_target,
            ttft_target=settings.batch_ttft_target,
            speculative=speculative,
            draft_max=settings.draft_max,
        )
        disk_root, disk_bytes = prefix_disk(settings)
        return EngineConfig(
            max_queue=settings.max_queue,
            scheduler=scheduler,
            prefix_disk=disk_root,
            prefix_disk_bytes=disk_bytes,
            adaptive_threads=settings.adaptive_threads,
        )

    # ---- unloading -------------------------------------------------------------------

    async def unload(self, model_id: str) -> None:
        """Unload now (requests in flight on it end with an error); 404 if not loaded."""
        validate_model_id(model_id)
        model_id = self._names.get(model_id, model_id)
        record = self.records.get(model_id)
        if (
            record is not None
            and record.state in (RecordState.PENDING, RecordState.LOADING)
            and record.task is not None
        ):
            with contextlib.suppress(Exception):  # a failed load: nothing to unload
                await asyncio.shield(record.task)
            record = self.records.get(model_id)
        if record is None:
            raise ModelNotFoundError(f"model {model_id!r} is not loaded", param="model")
        if record.state in LEAVING and record.task is not None:
            await asyncio.shield(record.task)
            return
        await self.keeper.unload(record, "asked to")

    def forget_files(self, model_id: str) -> None:
        """Drop what is remembered of a model's files (after it left the store)."""
        self._known.pop(model_id, None)
        for name in [name for name, target in self._names.items() if model_id in (name, target)]:
            del self._names[name]

    def end_requests(self, record: ModelRecord) -> int:
        """End the answers still running on a model being swapped out (its
        drain ran out of time); one-shot work ends when its queue closes."""
        if isinstance(record.model, LoadedModel) and self.engine.has_model(record.model_id):
            return self.engine.end_requests(record.model_id, SWAPPED_OUT_MESSAGE)
        return 0

    async def unload_record(self, record: ModelRecord) -> None:
        """Take a loaded model out of the engine or stop its queue (the
        keeper's unload, after a swap's drain), then close its backend."""
        model, record.model = record.model, None
        if isinstance(model, LoadedOneShot):
            await _close_oneshot(model)
        elif model is not None:
            await self.engine.unload_model(record.model_id, close_backend=False)
            await self.close_backend(model)

    async def close_backend(self, model: LoadedModel) -> None:
        """Close a generative model's backend once it is out of the engine:
        its step thread has stopped and no request runs on it. The hook for
        what should outlive the model (e.g. its hot prefixes written to the
        disk prefix cache) before its memory goes."""
        await asyncio.to_thread(model.backend.close)


async def _close_oneshot(model: LoadedOneShot) -> None:
    await asyncio.to_thread(model.queue.close)
    await asyncio.to_thread(model.backend.close)
