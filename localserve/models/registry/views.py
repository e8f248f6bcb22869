"""What the registry's models look like from outside: the loaded ones by
kind, one of them by id (with the right error when it is not there), the
load reports, queue stats and the list `GET /api/v1/loaded` shows. All
derived from the registry's records; nothing here keeps state."""

from __future__ import annotations

import time
from dataclasses import dataclass

from localserve.engine.engine import Engine
from localserve.engine.oneshot.stats import OneShotQueueSnapshot
from localserve.errors import InvalidRequestError, ModelLoadingError, ModelNotFoundError
from localserve.models.kinds import ROUTES, Kinds, ModelKind, kind_in, kinds_text
from localserve.models.policy import FOREVER, format_keep_alive
from localserve.models.registry.records import LoadedModel, LoadedOneShot, ModelRecord, RecordState

#: The states in which a model answers the requests that hold it.
SERVING = (RecordState.LOADED, RecordState.DRAINING)
_COMING = (RecordState.PENDING, RecordState.LOADING)


@dataclass(frozen=True, slots=True)
class OneShotStats:
    """A loaded one-shot model's kind and its queue's snapshot."""

    kind: ModelKind
    queue: OneShotQueueSnapshot


class RegistryViews:
    """Read-only views of `ModelRegistry.records` (a base class of the registry)."""

    engine: Engine
    records: dict[str, ModelRecord]

    @property
    def loaded(self) -> dict[str, LoadedModel]:
        """The generative models that serve, by id."""
        return {i: m for i, m in self._serving().items() if isinstance(m, LoadedModel)}

    @property
    def oneshot(self) -> dict[str, LoadedOneShot]:
        """The embeddings and speech models that serve, by id."""
        return {i: m for i, m in self._serving().items() if isinstance(m, LoadedOneShot)}

    def _serving(self) -> dict[str, LoadedModel | LoadedOneShot]:
        return {i: r.model for i, r in list(self.records.items()) if r.state in SERVING and r.model is not None}

    @property
    def loading(self) -> list[str]:
        """The models whose load has started and not ended, sorted."""
        return sorted(i for i, r in list(self.records.items()) if r.state in (RecordState.PENDING, RecordState.LOADING))

    def sole_model(self, kind: Kinds) -> str | None:
        """The id of the only model of `kind` loaded or loading, else None:
        where llama-server sends a request without a model or with a name it
        does not serve (its one model)."""
        ids = [i for i, r in list(self.records.items()) if kind_in(r.kind, kind) and r.state in SERVING + _COMING]
        return ids[0] if len(ids) == 1 else None

    def is_loaded(self, model_id: str) -> bool:
        """`model_id` serves (loaded, or draining its answers in flight)."""
        record = self.records.get(model_id)
        return record is not None and record.state in SERVING

    def get(self, model_id: str) -> LoadedModel:
        """A loaded generative model; 400 for another kind, 503 while it loads, else 404."""
        record = self.records.get(model_id)
        model = record.model if record is not None and record.state in SERVING else None
        if isinstance(model, LoadedModel):
            return model
        if isinstance(model, LoadedOneShot):
            kind = model.kind
            raise InvalidRequestError(f"model {model_id!r} is a {kind} model; use {ROUTES[kind]}", param="model")
        if record is not None and record.state in (RecordState.PENDING, RecordState.LOADING):
            raise ModelLoadingError(f"model {model_id!r} is still loading; retry in a moment")
        known = ", ".join(sorted(self.loaded)) or "none"
        raise ModelNotFoundError(
            f"The model {model_id!r} does not exist or is not loaded (loaded: {known})", param="model"
        )

    def get_oneshot(self, model_id: str, kind: Kinds) -> LoadedOneShot:
        """A loaded one-shot model of `kind` (or of one of them); 503 while
        loading, 400 for the wrong kind, else 404."""
        record = self.records.get(model_id)
        model = record.model if record is not None and record.state in SERVING else None
        if isinstance(model, LoadedOneShot) and kind_in(model.kind, kind):
            return model
        if model is not None:
            what = model.kind if isinstance(model, LoadedOneShot) else ModelKind.CHAT
            raise InvalidRequestError(
                f"model {model_id!r} is {kinds_text(what)} model, not {kinds_text(kind)} model", param="model"
            )
        if record is not None and record.state in (RecordState.PENDING, RecordState.LOADING):
            raise ModelLoadingError(f"model {model_id!r} is still loading; retry in a moment")
        known = ", ".join(sorted(m for m, o in self.oneshot.items() if kind_in(o.kind, kind))) or "none"
        raise ModelNotFoundError(
            f"The {kinds_text(kind, article=False)} model {model_id!r} is not loaded (loaded: {known})", param="model"
        )

    def load_report(self, model_id: str) -> dict[str, object]:
        """The effective options of a loaded generative model, as JSON ({} if unknown)."""
        model = self.loaded.get(model_id)
        return model.report.to_json() if model is not None and model.report is not None else {}

    def oneshot_stats(self) -> dict[str, OneShotStats]:
        """OneShotQueue stats per one-shot model, for the dashboard and /metrics."""
        return {model_id: OneShotStats(m.kind, m.queue.stats()) for model_id, m in self.oneshot.items()}

    def busy(self, record: ModelRecord) -> bool:
        """Holds, or work queued or running in the engine or the queue."""
        if record.num_users:
            return True
        if isinstance(record.model, LoadedOneShot):
            stats = record.model.queue.stats(0.0)
            return bool(stats.in_flight or stats.queue_items)
        return self.engine.has_model(record.model_id) and bool(self.engine.num_in_flight(record.model_id))

    def describe(self) -> list[dict[str, object]]:
        """Every model of the registry, for `GET /api/v1/loaded`, `ollama ps` and the dashboard."""
        now = time.monotonic()
        out = []
        for record in sorted(list(self.records.values()), key=lambda r: r.model_id):
            idle = record.state == RecordState.LOADED and not self.busy(record)
            expires_in = record.last_used + record.keep_alive_s - now if idle else None
            out.append(
                {
                    "id": record.model_id,
                    "kind": record.kind,
                    "state": record.state,
                    "in_use": not idle and record.state in SERVING,
                    "keep_alive": format_keep_alive(record.keep_alive_s),
                    "expires_in_s": None if expires_in is None or expires_in == FOREVER else max(0.0, expires_in),
                    "options": self.load_report(record.model_id) if record.state in SERVING else {},
                }
            )
        return out
