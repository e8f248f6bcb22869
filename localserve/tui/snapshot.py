"""The server's stats snapshot (`GET /api/v1/stats`) as typed, read-only data,
and how its figures are written on screen.

Parsing is lenient: a missing or odd field takes its default, so the
dashboard keeps working against a server a version older or newer. A
figure the server did not measure (no request in the window, a request
with too few tokens for a rate) is None and is shown as `DASH`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localserve.tui.fmt import DASH, fmt_duration

PRIORITY_CLASSES = ("interactive", "default", "batch")
LATENCY_KINDS = ("ttft", "queue_wait", "itl")


def _num(data: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = data.get(key, default)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _opt(data: Mapping[str, Any], key: str) -> float | None:
    """A figure that may be missing (None: not measured)."""
    value = data.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


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
class ClassView:
    """One priority class of one model: p50/p95 of each latency kind over the last minute."""

    num_requests: int = 0  # first tokens in the window
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    queue_wait_p50_s: float | None = None
    queue_wait_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None


@dataclass(frozen=True, slots=True)
class KeepAlive:
    """When the server unloads a model (`ollama ps`'s UNTIL)."""

    keep_alive: str = ""  # "forever", "5m", "" when the server does not say
    expires_in_s: float | None = None  # None: in use, or never
    in_use: bool = False

    def describe(self) -> str:
        if not self.keep_alive:
            return DASH
        if self.in_use:
            return "in use"
        if self.expires_in_s is None:
            return self.keep_alive
        return f"in {fmt_duration(self.expires_in_s)}"


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
    busy_fraction: float = 0.0
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0
    classes: Mapping[str, ClassView] = field(default_factory=dict)
    keep_alive: KeepAlive = field(default_factory=KeepAlive)
    weights_mib: float = 0.0  # 0: not known
    kv_mib: float = 0.0
    n_gpu_layers: int = 0
    n_layers: int = 0  # 0: not known

    @property
    def num_running(self) -> int:
        return sum(self.running.values())

    @property
    def num_waiting(self) -> int:
        return sum(self.waiting.values())

    def of_class(self, name: str) -> ClassView:
        return self.classes.get(name) or ClassView()


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
    keep_alive: KeepAlive = field(default_factory=KeepAlive)


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

    def worst(self, priority_class: str, figure: str) -> float | None:
        """The highest `figure` (e.g. `ttft_p95_s`) of a class over the models; None if none measured it."""
        values = [v for m in self.models if (v := getattr(m.of_class(priority_class), figure)) is not None]
        return max(values, default=None)

    def model(self, model_id: str) -> ModelView | None:
        return next((m for m in self.models if m.model_id == model_id), None)


def _model(data: Mapping[str, Any]) -> ModelView:
    def counts(key: str) -> dict[str, int]:
        return {str(k): int(v) for k, v in _map(data, key).items() if isinstance(v, int | float)}

    floats = {
        name: _num(data, name)
        for name in (
            "prefix_cache_hit_rate",
            "mean_batch_size",
            "busy_fraction",
            "prefill_tokens_per_s",
            "decode_tokens_per_s",
        )
    }
    options = _map(data, "options")
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
        classes={str(k): _class(v) for k, v in _map(data, "classes").items() if isinstance(v, Mapping)},
        keep_alive=_keep_alive(data),
        weights_mib=_num(options, "weights_mib"),
        kv_mib=_num(options, "kv_mib"),
        n_gpu_layers=_int(options, "n_gpu_layers"),
        n_layers=_int(options, "n_layers"),
        **floats,
    )


def _class(data: Mapping[str, Any]) -> ClassView:
    figures = {f"{kind}_p{q}_s": _opt(data, f"{kind}_p{q}_s") for kind in LATENCY_KINDS for q in (50, 95)}
    return ClassView(num_requests=_int(data, "num_requests"), **figures)


def _keep_alive(data: Mapping[str, Any]) -> KeepAlive:
    return KeepAlive(
        keep_alive=_str(data, "keep_alive"), expires_in_s=_opt(data, "expires_in_s"), in_use=data.get("in_use") is True
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
        max_tokens=_int(data, "max_tokens"),
        age_s=_num(data, "age_s"),
        queue_wait_s=_opt(data, "queue_wait_s"),
        ttft_s=_opt(data, "ttft_s"),
        tokens_per_s=_opt(data, "tokens_per_s"),
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
        keep_alive=_keep_alive(data),
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
