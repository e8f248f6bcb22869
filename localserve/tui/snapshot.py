"""The server's stats snapshot (`GET /api/v1/stats`) as typed, read-only data
(the models' part in `models_view`).

Parsing is lenient: a missing or odd field takes its default, so the
dashboard keeps working against a server a version older or newer. A
figure the server did not measure (no request in the window, a request
with too few tokens for a rate) is None and is shown as a dash (`fmt.DASH`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localserve.tui.fields import int_, list_, map_, num, opt, str_
from localserve.tui.models_view import ModelView, OneShotView, parse_model, parse_one_shot

PRIORITY_CLASSES = ("interactive", "default", "batch")


@dataclass(frozen=True, slots=True)
class ProcessView:
    pid: int = 0
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    num_cpus: int = 1


@dataclass(frozen=True, slots=True)
class RequestView:
    request_id: str
    model: str = ""
    priority: float = 1.0
    priority_class: str = "default"
    state: str = ""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    max_tokens: int = 0  # 0: not known
    age_s: float = 0.0
    queue_wait_s: float | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None  # None until the request has a few tokens

    def matches(self, needle: str) -> bool:
        """Whether the `/` filter text occurs in its id, model, class or state."""
        needle = needle.lower()
        return any(needle in text.lower() for text in (self.request_id, self.model, self.priority_class, self.state))


@dataclass(frozen=True, slots=True)
class BatchView:
    batch_id: str
    status: str = ""
    model: str = ""
    total: int = 0
    completed: int = 0
    failed: int = 0

    @property
    def num_done(self) -> int:
        return self.completed + self.failed


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One stats snapshot of the whole server."""

    version: str = ""
    uptime_s: float = 0.0
    process: ProcessView = field(default_factory=ProcessView)
    models: tuple[ModelView, ...] = ()
    requests: tuple[RequestView, ...] = ()
    batches: tuple[BatchView, ...] = ()
    one_shot: tuple[OneShotView, ...] = ()
    loading: tuple[str, ...] = ()
    load_errors: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()  # "backend: DEV,DEV" per backend that is installed
    disk_free_bytes: int = -1  # free on the data directory's disk (-1: not reported)
    disk_low: bool = False  # under the server's low-space threshold
    disk_writable: bool = True

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        process, disk = map_(data, "process"), map_(data, "disk")
        return cls(
            version=str_(data, "version"),
            uptime_s=num(data, "uptime_s"),
            process=ProcessView(
                pid=int_(process, "pid"),
                cpu_percent=num(process, "cpu_percent"),
                rss_bytes=int_(process, "rss_bytes"),
                num_cpus=max(1, int_(process, "num_cpus")),
            ),
            models=tuple(parse_model(m) for m in list_(data, "models") if isinstance(m, Mapping)),
            requests=tuple(_request(r) for r in list_(data, "requests") if isinstance(r, Mapping)),
            batches=tuple(_batch(b) for b in list_(data, "batches") if isinstance(b, Mapping)),
            one_shot=tuple(
                parse_one_shot(k, v) for k, v in map_(data, "one_shot").items() if isinstance(v, Mapping) and v
            ),
            loading=tuple(str(m) for m in list_(data, "loading")),
            load_errors={str(k): str(v) for k, v in map_(data, "load_errors").items()},
            devices=tuple(
                f"{str_(d, 'backend')}: {','.join(str(x) for x in list_(d, 'devices'))}"
                for d in list_(data, "devices")
                if isinstance(d, Mapping) and d.get("available")
            ),
            disk_free_bytes=int_(disk, "free_bytes") if "free_bytes" in disk else -1,
            disk_low=bool(disk.get("low", False)),
            disk_writable=bool(disk.get("writable", True)),
        )

    def by_class(self, key: str) -> dict[str, int]:
        """Running (`key="running"`) or waiting counts per priority class, summed over models."""
        totals = dict.fromkeys(PRIORITY_CLASSES, 0)
        for model in self.models:
            for name, count in getattr(model, key).items():
                totals[name] = totals.get(name, 0) + count
        return totals

    @property
    def decode_tokens_per_s(self) -> float:
        return sum(m.decode_tokens_per_s for m in self.models)

    def worst(self, priority_class: str, figure: str) -> float | None:
        """The highest `figure` (e.g. `ttft_p95_s`) of a class over the models; None if none measured it."""
        values = [v for m in self.models if (v := getattr(m.of_class(priority_class), figure)) is not None]
        return max(values, default=None)

    def model(self, model_id: str) -> ModelView | None:
        return next((m for m in self.models if m.model_id == model_id), None)


def _request(data: Mapping[str, Any]) -> RequestView:
    return RequestView(
        request_id=str_(data, "id"),
        model=str_(data, "model"),
        priority=num(data, "priority", 1.0),
        priority_class=str_(data, "priority_class") or "default",
        state=str_(data, "state"),
        prompt_tokens=int_(data, "prompt_tokens"),
        generated_tokens=int_(data, "generated_tokens"),
        max_tokens=int_(data, "max_tokens"),
        age_s=num(data, "age_s"),
        queue_wait_s=opt(data, "queue_wait_s"),
        ttft_s=opt(data, "ttft_s"),
        tokens_per_s=opt(data, "tokens_per_s"),
    )


def _batch(data: Mapping[str, Any]) -> BatchView:
    counts = map_(data, "request_counts")
    return BatchView(
        batch_id=str_(data, "id"),
        status=str_(data, "status"),
        model=str_(data, "model"),
        total=int_(counts, "total"),
        completed=int_(counts, "completed"),
        failed=int_(counts, "failed"),
    )
