"""What the registry keeps per model: the loaded backend (generative, or
one-shot behind its queue), the record of its life (state, holds, idle
clock, keep_alive) and the `ModelHold` a caller holds it with."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import StrEnum

from localserve.engine.backend import GenerativeBackend, OneShotBackend
from localserve.engine.oneshot.queue import OneShotQueue
from localserve.models.kinds import ModelKind
from localserve.models.plan import LoadReport
from localserve.models.policy import FOREVER
from localserve.models.registry.specs import ModelSpec


class RecordState(StrEnum):
    """Where a model is in its life (`GET /api/v1/loaded` shows it)."""

    PENDING = "pending"  # waiting for room among the loaded models of its kind
    LOADING = "loading"  # opening its backend
    LOADED = "loaded"  # serving
    DRAINING = "draining"  # being swapped out: finishing the answers in flight, taking no new ones
    UNLOADING = "unloading"  # closing


@dataclass(slots=True)
class LoadedModel:
    """A generative model, in the engine."""

    spec: ModelSpec
    backend: GenerativeBackend
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0
    report: LoadReport | None = None  # the effective options (ctx per slot, slots, GPU layers, KV size)


@dataclass(slots=True)
class LoadedOneShot:
    """An embeddings or speech model: its backend behind its queue."""

    spec: ModelSpec
    kind: ModelKind  # EMBEDDINGS or TRANSCRIPTION
    backend: OneShotBackend  # type: ignore[type-arg]
    queue: OneShotQueue  # type: ignore[type-arg]
    loaded_at: float = field(default_factory=time.time)
    load_seconds: float = 0.0


@dataclass(slots=True, eq=False)
class ModelRecord:
    """One model of the registry, from the start of its load to its unload."""

    spec: ModelSpec
    kind: ModelKind  # and so the `--max-loaded-models` limit it counts against
    default_keep_alive_s: float
    state: RecordState = RecordState.PENDING
    num_users: int = 0  # holds, and requests waiting for the load
    last_used: float = field(default_factory=time.monotonic)
    keep_alive_s: float = FOREVER  # once idle; set by each release
    task: asyncio.Task[None] | None = None  # the load or the unload in progress
    model: LoadedModel | LoadedOneShot | None = None  # set, with state LOADED, once it serves

    @property
    def model_id(self) -> str:
        return self.spec.model_id


@dataclass(frozen=True, slots=True)
class ModelHold:
    """A model held loaded for one call; give it back with `ModelRegistry.release`."""

    record: ModelRecord
    keep_alive_s: float | None  # None: the model's default

    @property
    def model_id(self) -> str:
        return self.record.model_id
