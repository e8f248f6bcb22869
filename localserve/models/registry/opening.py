"""Opening a model's backend (blocking: run in a thread): its options
resolved (request > flag > config file > catalog > default, models/options.py),
a GGUF fitted to memory (models/plan.py), through the backend the backend
registry names for it (models/backend_registry.py)."""

from __future__ import annotations

import logging

from localserve.config import ServerSettings
from localserve.engine.backend import GenerativeBackend, OneShotBackend
from localserve.engine.oneshot.queue import OneShotQueueConfig
from localserve.errors import InvalidRequestError
from localserve.models.backend_registry import BackendContext, Opened, as_opened, named
from localserve.models.kinds import ModelKind, kind_of
from localserve.models.oneshot import BATCHING
from localserve.models.options import resolve_options
from localserve.models.plan import LoadReport, plain_report
from localserve.models.registry.specs import ModelSpec

log = logging.getLogger(__name__)


def open_backend(spec: ModelSpec, settings: ServerSettings) -> Opened:
    """The backend, its load report and its batching (each may be None)."""
    backend_spec = named(spec.backend, kind_of(spec.labels))
    backend_spec.require(spec.model_id)
    options = resolve_options(spec.model_id, settings, spec.options)
    context = BackendContext(spec.model_id, settings, options, spec.options)
    return as_opened(backend_spec.open(spec.path, context))


def open_generative(spec: ModelSpec, settings: ServerSettings) -> tuple[GenerativeBackend, LoadReport]:
    """A chat model's backend and what it was loaded with."""
    opened = open_backend(spec, settings)
    backend, report = opened.backend, opened.report
    if not isinstance(backend, GenerativeBackend):
        raise InvalidRequestError(f"model {spec.model_id!r}: its backend {spec.backend!r} made no chat backend")
    if not isinstance(report, LoadReport):
        options = resolve_options(spec.model_id, settings, spec.options)
        report = plain_report(options, backend.capacity(), backend.info().device)
    sources = ", ".join(f"{name} from {source}" for name, source in report.sources.items())
    log.info("%s loads with %s (%s)", spec.model_id, report.summary(), sources)
    return backend, report


def open_oneshot(
    spec: ModelSpec, kind: ModelKind, settings: ServerSettings
) -> tuple[OneShotBackend, OneShotQueueConfig]:  # type: ignore[type-arg]
    """An embeddings or speech model's backend (converted on first use) and its batching."""
    opened = open_backend(spec, settings)
    backend, batching = opened.backend, opened.batching
    if not isinstance(backend, OneShotBackend):
        raise InvalidRequestError(f"model {spec.model_id!r}: its backend {spec.backend!r} made no {kind} backend")
    if not isinstance(batching, OneShotQueueConfig):
        batching = OneShotQueueConfig(max_queue=settings.max_queue, **BATCHING[kind])  # type: ignore[arg-type]
    return backend, batching
