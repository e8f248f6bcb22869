"""Operations routes for the dashboard (`localserve top`) and scripts.

* `GET  /api/v1/stats` - one JSON snapshot of the server (shape below)
* `GET  /api/v1/stats/stream?interval_ms=500` - the same snapshot as SSE,
  `data: {json}\\n\\n` every `interval_ms` (100..5000) until the client leaves
  or the server shuts down

A snapshot::

    {"object": "localserve.stats", "version", "time" (unix s), "uptime_s",
     "process": {"pid", "cpu_percent", "rss_bytes", "num_threads", "num_cpus", "memory_total_bytes"},
     "models": [{"id", "backend", "device", "running": {class: n}, "waiting": {class: n},
                 "in_flight", "kv_used", "kv_total", "max_num_seqs", "n_ctx",
                 "prefix_cache_hit_rate", "recent_batch_sizes", "prefill_tokens_per_s",
                 "decode_tokens_per_s", "mean_batch_size", "busy_fraction",
                 "ttft_p50_s", "ttft_p95_s", "queue_wait_p50_s", "itl_p50_s", ... (all classes),
                 "classes": {class: {"num_requests", "ttft_p50_s", "ttft_p95_s", "queue_wait_p50_s",
                                     "queue_wait_p95_s", "itl_p50_s", "itl_p95_s"}},
                 "keep_alive", "expires_in_s", "in_use",
                 "options": {"ctx_per_slot", "parallel", "kv_tokens", "kv_mib", "weights_mib", "n_gpu_layers",
                             "n_layers", "device", "sources": {option: where from}, "fit": [notes]}}],
     "loading": [model ids], "load_errors": {name: reason},
     "not_loaded": {name: why} (start-up models beyond --max-loaded-models: loaded on first request),
     "requests": [{"id", "model", "priority", "priority_class", "state", "prompt_tokens",
                   "generated_tokens", "max_tokens", "age_s", "queue_wait_s", "ttft_s", "tokens_per_s"}],
     "one_shot": {model id or hook name: {"kind", ...the queue's stats(), "keep_alive", "expires_in_s"}},
     "batches": [{"id", "status", "endpoint", "model", "request_counts": {"total", "completed", "failed"},
                  "created_at"}],
     "disk": {"data_dir", "free_bytes", "total_bytes", "writable", "low"} (the data directory's disk)}

Priority classes are always all present: `interactive`, `default`, `batch`.
Latencies are seconds over the last minute: `ttft` time to first token,
`queue_wait` submission to the first engine step, `itl` between tokens; a
figure with nothing measured is `null`, and so is a request's
`tokens_per_s` until it has a few tokens. `keep_alive` is how long the model
stays loaded once idle (`forever`, `5m`), `expires_in_s` when it will be
unloaded (`null`: in use, or never).

Hooks for parts that live elsewhere (set them before the server starts or
at any time after; the hooks object is mutable):

* `set_batches_provider(app, fn)` - `fn()` returns OpenAI Batch objects
  (the Batch API's job list); until then `batches` is `[]`.
* `add_one_shot_provider(app, name, fn)` - `fn()` returns a one-shot
  queue's `stats()` dict, shown under `one_shot[name]`. The one-shot
  models in the `ModelRegistry` (embeddings, ASR) are listed without a hook.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil
from aiohttp import web

from localserve import __version__
from localserve.api.admin.disk_watch import DISK_WATCH
from localserve.api.admin.stats_json import model_json, oneshot_queue_json, request_json
from localserve.api.routes import Route, add_routes
from localserve.api.sse import SseWriter
from localserve.api.state import REGISTRY
from localserve.backends.devices import cached_snapshot
from localserve.engine.step.stats import ModelSnapshot
from localserve.engine.types import PRIORITY_ALIASES, priority_class
from localserve.errors import InvalidRequestError
from localserve.models.registry import ModelRegistry

log = logging.getLogger(__name__)

BatchesProvider = Callable[[], Sequence[Mapping[str, Any]]]
OneShotProvider = Callable[[], Mapping[str, Any]]

NO_KEEP_ALIVE: dict[str, Any] = {"keep_alive": None, "expires_in_s": None, "in_use": None}
DEFAULT_INTERVAL_MS = 500
MIN_INTERVAL_MS, MAX_INTERVAL_MS = 100, 5000
CPU_SAMPLE_S = 0.4  # psutil's cpu_percent measures since its last call


@dataclass(slots=True)
class StatsState:
    """Process sampling and the hooks other parts of the server fill."""

    started_at: float = field(default_factory=time.monotonic)
    process: psutil.Process = field(default_factory=psutil.Process)
    batches: BatchesProvider | None = None
    one_shot: dict[str, OneShotProvider] = field(default_factory=dict)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    _cpu_percent: float = 0.0
    _cpu_sampled_at: float = 0.0
    _devices: asyncio.Future[tuple[dict[str, object], ...]] | None = None

    def devices(self) -> list[dict[str, object]]:
        """What each backend sees (`localserve devices`). Probing imports the
        backends and asks the hardware, so it runs once, off the event loop,
        on the first snapshot; until it is done the list is empty."""
        if self._devices is None:
            self._devices = asyncio.get_running_loop().run_in_executor(None, cached_snapshot)
        if self._devices.done() and self._devices.exception() is None:
            return list(self._devices.result())
        return []

    def cpu_percent(self) -> float:
        """Process CPU use (100 = one core), resampled at most every CPU_SAMPLE_S,
        so that several stream clients do not shorten each other's window."""
        now = time.monotonic()
        if now - self._cpu_sampled_at >= CPU_SAMPLE_S:
            self._cpu_percent = self.process.cpu_percent(None)
            self._cpu_sampled_at = now
        return self._cpu_percent


STATS = web.AppKey("stats", StatsState)


def _state(app: web.Application) -> StatsState:
    """The app's stats state, made on first use: hooks may be set before or
    after the routes are registered."""
    if STATS not in app:
        app[STATS] = StatsState()
    return app[STATS]


def register_stats_routes(app: web.Application) -> None:
    """Add the stats routes and their state to `app`."""
    _state(app)
    app.on_startup.append(_on_startup)
    app.on_shutdown.append(_on_shutdown)
    add_routes(
        app,
        Route("GET", "/api/v1/stats", get_stats),
        Route("GET", "/api/v1/stats/stream", stream_stats, query=("interval_ms",), media_types=("text/event-stream",)),
    )


def set_batches_provider(app: web.Application, provider: BatchesProvider | None) -> None:
    """Hook for the Batch API: `provider()` lists OpenAI Batch objects."""
    _state(app).batches = provider


def add_one_shot_provider(app: web.Application, name: str, provider: OneShotProvider) -> None:
    """Hook for one-shot queues (embeddings, ASR): `provider()` is its `stats()`."""
    _state(app).one_shot[name] = provider


async def _on_startup(app: web.Application) -> None:
    state = app[STATS]
    state.started_at = time.monotonic()
    state.process.cpu_percent(None)  # the first call only starts the measurement


async def _on_shutdown(app: web.Application) -> None:
    # Open streams end now, instead of holding the shutdown for its whole timeout.
    app[STATS].closing.set()


# ---- the snapshot ------------------------------------------------------------------


def build_snapshot(app: web.Application) -> dict[str, Any]:
    """Everything the dashboard shows, as plain JSON data."""
    state, registry = app[STATS], app[REGISTRY]
    keep_alive = _keep_alive(app)
    models, requests = [], []
    for model_id, stats in registry.engine.stats().items():
        entry, model_requests = _model_entry(model_id, stats)
        entry.update(keep_alive.get(model_id, NO_KEEP_ALIVE))
        entry["options"] = registry.load_report(model_id)  # effective ctx per slot, slots, GPU layers, KV MiB
        models.append(entry)
        requests += model_requests
    return {
        "object": "localserve.stats",
        "version": __version__,
        "time": time.time(),
        "uptime_s": round(time.monotonic() - state.started_at, 3),
        "process": _process_stats(state),
        "models": models,
        "loading": registry.loading,
        "load_errors": dict(registry.load_errors),
        "not_loaded": dict(registry.not_loaded),
        "requests": requests,
        "one_shot": {
            name: {**entry, **keep_alive.get(name, {})} for name, entry in _one_shot_stats(state, registry).items()
        },
        "batches": [_batch_entry(batch) for batch in _call_hook(state.batches, [])],
        "devices": state.devices(),
        "disk": app[DISK_WATCH].snapshot() if DISK_WATCH in app else None,
    }


def _model_entry(model_id: str, stats: ModelSnapshot) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A model's engine stats with every priority class counted, and its requests."""
    entry = model_json(model_id, stats)
    # The step thread publishes its snapshot at most every 100 ms and may go
    # idle right after an abort without publishing again; with nothing in
    # flight on the event loop's side, nothing runs or waits.
    idle = not stats.in_flight
    for key, counts in (("running", stats.scheduler.running_by_class), ("waiting", stats.scheduler.waiting_by_class)):
        entry[key] = {name: 0 if idle else int(counts.get(name, 0)) for name in PRIORITY_ALIASES}
    if idle:
        return entry, []
    requests = [request_json(model_id, seq) for seq in stats.scheduler.sequences]
    return entry, [{**r, "priority_class": priority_class(float(r["priority"]))} for r in requests]


def _keep_alive(app: web.Application) -> dict[str, dict[str, Any]]:
    """Model id -> when the registry unloads it (`ollama ps`'s UNTIL)."""
    entries = _call_hook(app[REGISTRY].describe, [])
    return {str(e["id"]): {key: e.get(key) for key in ("keep_alive", "expires_in_s", "in_use")} for e in entries}


def _one_shot_stats(state: StatsState, registry: ModelRegistry) -> dict[str, Any]:
    """OneShotQueue stats of the hooks and of every loaded one-shot model (these win)."""
    hooked = {name: dict(_call_hook(provider, {})) for name, provider in state.one_shot.items()}
    loaded = _call_hook(registry.oneshot_stats, {})
    return {**hooked, **{name: {"kind": s.kind, **oneshot_queue_json(s.queue)} for name, s in loaded.items()}}


def _call_hook(provider: Callable[[], Any] | None, default: Any) -> Any:
    """A hook's answer; a failing hook must not take the whole snapshot down."""
    if provider is None:
        return default
    try:
        return provider()
    except Exception:
        log.exception("stats hook %r failed", provider)
        return default


def _process_stats(state: StatsState) -> dict[str, Any]:
    with state.process.oneshot():
        return {
            "pid": state.process.pid,
            "cpu_percent": state.cpu_percent(),
            "rss_bytes": state.process.memory_info().rss,
            "num_threads": state.process.num_threads(),
            "num_cpus": os.cpu_count() or 1,
            "memory_total_bytes": psutil.virtual_memory().total,
        }


def _batch_entry(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of an OpenAI Batch object the dashboard needs."""
    counts = batch.get("request_counts") or {}
    metadata = batch.get("metadata") or {}
    return {
        "id": batch.get("id", ""),
        "status": batch.get("status", ""),
        "endpoint": batch.get("endpoint", ""),
        "model": batch.get("model") or metadata.get("model", ""),
        "request_counts": {key: int(counts.get(key, 0)) for key in ("total", "completed", "failed")},
        "created_at": batch.get("created_at", 0),
    }


# ---- handlers ----------------------------------------------------------------------


async def get_stats(request: web.Request) -> web.Response:
    """`GET /api/v1/stats`: one snapshot."""
    return web.json_response(build_snapshot(request.app))


async def stream_stats(request: web.Request) -> web.StreamResponse:
    """`GET /api/v1/stats/stream`: a snapshot every `interval_ms`, as SSE."""
    interval_s = _interval_ms(request.query.get("interval_ms")) / 1000
    closing = request.app[STATS].closing
    writer = SseWriter(request, {})
    with contextlib.suppress(ConnectionResetError):  # the client left
        while not closing.is_set():
            await writer.send(build_snapshot(request.app))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(closing.wait(), interval_s)
    return writer.response


def _interval_ms(raw: str | None) -> int:
    """The query's interval, clamped to MIN..MAX_INTERVAL_MS."""
    try:
        value = int(raw) if raw else DEFAULT_INTERVAL_MS
    except ValueError:
        raise InvalidRequestError(
            f"interval_ms must be a whole number of milliseconds; got {raw!r}", param="interval_ms"
        ) from None
    return max(MIN_INTERVAL_MS, min(MAX_INTERVAL_MS, value))
