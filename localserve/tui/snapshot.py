"""The server's stats snapshot (`GET /api/v1/stats`) as typed, read-only data.

Parsing is lenient: a missing or odd field takes its default, so the
dashboard keeps working against a server a version older or newer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PRIORITY_CLASSES = ("interactive", "default", "batch")


def _num(data: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = data.get(key, default)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _int(data: Mapping[str, Any], key: str) -> int:
    return int(_num(data, key))


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    return value if isinstance(value, str) else ""


def _map(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    return value if isinstance(value, Mapping) else {}


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class ProcessView:
    pid: int = 0
    cpu_percent: float = 0.0
    rss_bytes: int = 0
    num_cpus: int = 1


@dataclass(frozen=True, slots=True)
class ModelView:
    model_id: str
    backend: str = ""
    device: str = ""
    running: Mapping[str, int] = field(default_factory=dict)  # priority class -> count
    waiting: Mapping[str, int] = field(default_factory=dict)
    kv_used: int = 0
    kv_total: int = 0
    max_num_seqs: int = 0
    n_ctx: int = 0
    prefix_cache_hit_rate: float = 0.0
    mean_batch_size: float = 0.0
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    ttft_p50_s: float = 0.0
    ttft_p95_s: float = 0.0
    itl_p50_s: float = 0.0
    itl_p95_s: float = 0.0

    @property
    def num_running(self) -> int:
        return sum(self.running.values())

    @property
    def num_waiting(self) -> int:
        return sum(self.waiting.values())


@dataclass(frozen=True, slots=True)
class OneShotView:
    """An embeddings or speech model behind its micro-batcher."""

    model_id: str
    kind: str = ""
    queue_items: int = 0
    in_flight: int = 0
    items_per_s: float = 0.0
    mean_batch_size: float = 0.0
    padding_ratio: float = 0.0
    busy_fraction: float = 0.0


@dataclass(frozen=True, slots=True)
class RequestView:
    request_id: str
    model: str = ""
    priority: float = 1.0
    priority_class: str = "default"
    state: str = ""
    prompt_tokens: int = 0
    generated_tokens: int = 0
    age_s: float = 0.0
    tokens_per_s: float = 0.0


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Snapshot:
        process = _map(data, "process")
        return cls(
            version=_str(data, "version"),
            uptime_s=_num(data, "uptime_s"),
            process=ProcessView(
                pid=_int(process, "pid"),
                cpu_percent=_num(process, "cpu_percent"),
                rss_bytes=_int(process, "rss_bytes"),
                num_cpus=max(1, _int(process, "num_cpus")),
            ),
            models=tuple(_model(m) for m in _list(data, "models") if isinstance(m, Mapping)),
            requests=tuple(_request(r) for r in _list(data, "requests") if isinstance(r, Mapping)),
            batches=tuple(_batch(b) for b in _list(data, "batches") if isinstance(b, Mapping)),
            one_shot=tuple(_one_shot(k, v) for k, v in _map(data, "one_shot").items() if isinstance(v, Mapping) and v),
            loading=tuple(str(m) for m in _list(data, "loading")),
            load_errors={str(k): str(v) for k, v in _map(data, "load_errors").items()},
            devices=tuple(
                f"{_str(d, 'backend')}: {','.join(str(x) for x in _list(d, 'devices'))}"
                for d in _list(data, "devices")
                if isinstance(d, Mapping) and d.get("available")
            ),
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

    @property
    def ttft_p95_s(self) -> float:
        return max((m.ttft_p95_s for m in self.models), default=0.0)


def _model(data: Mapping[str, Any]) -> ModelView:
    def counts(key: str) -> dict[str, int]:
        return {str(k): int(v) for k, v in _map(data, key).items() if isinstance(v, int | float)}

    floats = {
        name: _num(data, name)
        for name in (
            "prefix_cache_hit_rate",
            "mean_batch_size",
            "prefill_tokens_per_s",
            "decode_tokens_per_s",
            "ttft_p50_s",
            "ttft_p95_s",
            "itl_p50_s",
            "itl_p95_s",
        )
    }
    return ModelView(
        model_id=_str(data, "id"),
        backend=_str(data, "backend"),
        device=_str(data, "device"),
        running=counts("running"),
        waiting=counts("waiting"),
        kv_used=_int(data, "kv_used"),
        kv_total=_int(data, "kv_total"),
        max_num_seqs=_int(data, "max_num_seqs"),
        n_ctx=_int(data, "n_ctx"),
        **floats,
    )


def _request(data: Mapping[str, Any]) -> RequestView:
    return RequestView(
        request_id=_str(data, "id"),
        model=_str(data, "model"),
        priority=_num(data, "priority", 1.0),
        priority_class=_str(data, "priority_class") or "default",
        state=_str(data, "state"),
        prompt_tokens=_int(data, "prompt_tokens"),
        generated_tokens=_int(data, "generated_tokens"),
        age_s=_num(data, "age_s"),
        tokens_per_s=_num(data, "tokens_per_s"),
    )


def _one_shot(model_id: str, data: Mapping[str, Any]) -> OneShotView:
    return OneShotView(
        model_id=str(model_id),
        kind=_str(data, "kind"),
        queue_items=_int(data, "queue_items"),
        in_flight=_int(data, "in_flight"),
        items_per_s=_num(data, "items_per_s"),
        mean_batch_size=_num(data, "mean_batch_size"),
        padding_ratio=_num(data, "recent_padding_ratio"),
        busy_fraction=_num(data, "busy_fraction"),
    )


def _batch(data: Mapping[str, Any]) -> BatchView:
    counts = _map(data, "request_counts")
    return BatchView(
        batch_id=_str(data, "id"),
        status=_str(data, "status"),
        model=_str(data, "model"),
        total=_int(counts, "total"),
        completed=_int(counts, "completed"),
        failed=_int(counts, "failed"),
    )


# ---- formatting ----------------------------------------------------------------------


def fmt_bytes(num_bytes: float) -> str:
    if num_bytes < 1e6:
        return f"{num_bytes / 1e3:.0f} KB"
    if num_bytes < 1e9:
        return f"{num_bytes / 1e6:.0f} MB"
    return f"{num_bytes / 1e9:.1f} GB"


def fmt_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h04m`, `3d02h`."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def fmt_latency(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.2f} s"
