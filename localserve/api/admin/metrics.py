"""`GET /metrics`: Prometheus text exposition (prometheus-client), one
registry per app.

Read at scrape time from `Engine.stats()` and the model registry (nothing
is copied on the hot path):

* `localserve_prompt_tokens_total`, `localserve_generation_tokens_total`,
  `localserve_prefix_cache_hit_tokens_total`, `localserve_preemptions_total`,
  `localserve_spec_decode_num_draft_tokens_total` / `..._accepted_tokens_total`,
  `localserve_prefix_disk_{hits,misses,bytes_written,bytes_read,restore_seconds}_total`
* `localserve_queue_depth{priority}` (waiting requests by priority class),
  `localserve_running_sequences`, `localserve_requests_in_flight`
* `localserve_kv_cache_used_tokens`, `localserve_kv_cache_capacity_tokens`,
  `localserve_last_batch_size` (sequences in the last step)
* `localserve_model_load_seconds{kind}` for every loaded model
* `localserve_disk_free_bytes`, `localserve_disk_total_bytes`: the data
  directory's disk (`api.admin.disk_watch`, read every 30 s)
* `localserve_time_to_first_token_seconds{priority}`,
  `localserve_queue_wait_seconds{priority}` and
  `localserve_inter_token_latency_seconds{priority}`: histograms by priority
  class (`interactive`, `default`, `batch`), the engine's own record
  (`engine.step.stats.ModelStats`, timed on the step thread), so that they agree
  with `/api/v1/stats`
* one-shot queues (embeddings, speech): `localserve_oneshot_padding_ratio`,
  `localserve_oneshot_mean_batch_size`, `localserve_oneshot_queue_items`,
  `localserve_oneshot_items_total`, `localserve_oneshot_batches_total`

Observed as they happen: `localserve_requests_total{model, endpoint, status}`
by `metrics_middleware` (endpoint: the route's pattern; `model`: what the
handler noted with `note_model`, empty where it noted none).

Every metric carries a `model` label, except llama-server's own families
(`llamacpp:*`, `api.admin.llamacpp_metrics`), which follow them as
llama-server writes them. The answer's `Process-Start-Time-Unix` header is
when the server started, as llama-server sends it. `--no-metrics` answers
501, as llama-server does without `--metrics`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from localserve.api.admin.disk_watch import DISK_WATCH, DiskWatch
from localserve.api.admin.llamacpp_metrics import llamacpp_text
from localserve.api.http_edge import ABANDONED, CLIENT_CLOSED, log_abandoned
from localserve.api.routes import Route, add_routes
from localserve.api.state import REGISTRY, SETTINGS
from localserve.engine.step.prefix_disk import DiskTierStats
from localserve.engine.step.stats import Histogram, ModelSnapshot
from localserve.engine.types import PRIORITY_ALIASES
from localserve.errors import NotSupportedError
from localserve.models.registry import ModelRegistry
from localserve.models.registry.views import OneShotStats

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MODEL_KEY = "localserve.model"
#: The engine's latency kinds as Prometheus histograms: name and help.
LATENCY_METRICS = {
    "ttft": ("localserve_time_to_first_token_seconds", "Time from submission to a request's first generated token"),
    "queue_wait": ("localserve_queue_wait_seconds", "Time from submission to the first engine step of a request"),
    "itl": ("localserve_inter_token_latency_seconds", "Time between consecutive generated tokens of one request"),
}


class Metrics:
    """The app's registry, its event metrics, and the scrape-time collector."""

    def __init__(self, models: ModelRegistry, disk: DiskWatch | None = None) -> None:
        self.models = models
        self.started_at = int(time.time())  # llama-server's Process-Start-Time-Unix
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "localserve_requests",
            "HTTP requests answered, by model, endpoint (route pattern) and status",
            ["model", "endpoint", "status"],
            registry=self.registry,
        )
        self.registry.register(ServerCollector(models, disk))


METRICS = web.AppKey("metrics", Metrics)


def register(app: web.Application) -> None:
    """Add `/metrics` and the app's registry (`metrics_middleware` must be in
    the app's middlewares to count requests)."""
    app[METRICS] = Metrics(app[REGISTRY], app.get(DISK_WATCH))
    add_routes(app, Route("GET", "/metrics", scrape, media_types=("text/plain",)))


def note_model(request: web.Request, model_id: str) -> None:
    """Label this request's count with `model_id`."""
    request[MODEL_KEY] = model_id


async def scrape(request: web.Request) -> web.Response:
    """`GET /metrics`: localserve's families, then llama-server's."""
    if request.app[SETTINGS].no_metrics:
        raise NotSupportedError("This server does not support metrics endpoint. Start it without --no-metrics.")
    metrics = request.app[METRICS]
    models = metrics.models
    engine = models.engine
    llama = llamacpp_text(engine.stats(), engine.latency_histograms(), models.oneshot_stats())
    body = generate_latest(metrics.registry) + llama.encode()
    headers = {"Content-Type": CONTENT_TYPE_LATEST, "Process-Start-Time-Unix": str(metrics.started_at)}
    return web.Response(body=body, headers=headers)


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count every request by model, route and final status (outermost, so
    error envelopes are counted with their status)."""
    status = 500
    started = time.monotonic()
    try:
        response = await handler(request)
        status = CLIENT_CLOSED if request.get(ABANDONED) else response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        status = CLIENT_CLOSED
        log_abandoned(request, status, time.monotonic() - started)
        raise
    finally:
        metrics = request.app.get(METRICS)
        if metrics is not None:
            metrics.requests.labels(request.get(MODEL_KEY, ""), _endpoint(request), str(status)).inc()


def _endpoint(request: web.Request) -> str:
    # The pattern, not the path: ids in paths must not explode the label set.
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


class ServerCollector(Collector):
    """Engine and one-shot queue figures, read at each scrape."""

    def __init__(self, models: ModelRegistry, disk: DiskWatch | None = None) -> None:
        self.models = models
        self.disk = disk

    def collect(self) -> Iterator[Metric]:
        yield from self._disk()
        yield from self._generative(self.models.engine.stats())
        yield from self._latencies(self.models.engine.latency_histograms())
        yield from self._load_times()
        yield from self._oneshot(self.models.oneshot_stats())

    def _disk(self) -> Iterator[Metric]:
        if self.disk is None or self.disk.free_bytes < 0:
            return
        for name, text, value in (
            ("free", "Bytes free on the data directory's disk", self.disk.free_bytes),
            ("total", "Size of the data directory's disk in bytes", self.disk.total_bytes),
        ):
            family = GaugeMetricFamily(f"localserve_disk_{name}_bytes", text, labels=["model", "path"])
            family.add_metric(["", str(self.disk.path)], value)
            yield family

    def _generative(self, stats: Mapping[str, ModelSnapshot]) -> Iterator[Metric]:
        m = ["model"]
        prompt = CounterMetricFamily("localserve_prompt_tokens", "Prompt tokens of finished requests", labels=m)
        generated = CounterMetricFamily(
            "localserve_generation_tokens", "Generated tokens of finished requests", labels=m
        )
        cached = CounterMetricFamily(
            "localserve_prefix_cache_hit_tokens", "Prompt tokens reused from the prefix cache", labels=m
        )
        preempted = CounterMetricFamily("localserve_preemptions", "Sequences preempted to make room", labels=m)
        # The names llama-server uses for the same counts.
        drafted = CounterMetricFamily(
            "localserve_spec_decode_num_draft_tokens", "Drafted tokens verified (speculative decoding)", labels=m
        )
        accepted = CounterMetricFamily(
            "localserve_spec_decode_num_accepted_tokens", "Drafted tokens accepted (speculative decoding)", labels=m
        )
        disk = {
            name: CounterMetricFamily(f"localserve_prefix_disk_{name}", text, labels=m)
            for name, text in (
                ("hits", "Prompt prefixes restored from the prefix cache's disk tier"),
                ("misses", "Prompts of a block or more that found no longer prefix on disk"),
                ("bytes_written", "Bytes of KV state written to the disk tier"),
                ("bytes_read", "Bytes of KV state read from the disk tier"),
                ("restore_seconds", "Seconds spent restoring KV state from the disk tier"),
            )
        }
        queue = GaugeMetricFamily(
            "localserve_queue_depth", "Requests waiting, by priority class", labels=[*m, "priority"]
        )
        running = GaugeMetricFamily("localserve_running_sequences", "Sequences holding a KV slot", labels=m)
        in_flight = GaugeMetricFamily("localserve_requests_in_flight", "Requests submitted and not finished", labels=m)
        kv_used = GaugeMetricFamily("localserve_kv_cache_used_tokens", "KV cache cells in use", labels=m)
        kv_size = GaugeMetricFamily("localserve_kv_cache_capacity_tokens", "KV cache cells in all", labels=m)
        batch = GaugeMetricFamily("localserve_last_batch_size", "Sequences in the last engine step", labels=m)
        threads = GaugeMetricFamily("localserve_threads", "CPU threads the model's steps compute on", labels=m)
        busy_elsewhere = GaugeMetricFamily(
            "localserve_cpu_busy_elsewhere_cores",
            "Cores other programs kept busy, as the model's thread choice last measured (0 with --threads N)",
            labels=m,
        )
        for model_id, s in stats.items():
            sched = s.scheduler
            # The step thread publishes its snapshot at most every 100 ms; with
            # nothing in flight, nothing runs or waits (see api.stats).
            idle = not s.in_flight
            prompt.add_metric([model_id], s.total_prompt_tokens)
            generated.add_metric([model_id], s.total_output_tokens)
            cached.add_metric([model_id], sched.num_cached_tokens)
            preempted.add_metric([model_id], sched.num_preemptions)
            drafted.add_metric([model_id], sched.num_draft_tokens)
            accepted.add_metric([model_id], sched.num_accepted_tokens)
            if sched.disk is not None:
                for name, value in _disk_counts(sched.disk).items():
                    disk[name].add_metric([model_id], value)
            for name in PRIORITY_ALIASES:
                queue.add_metric([model_id, name], 0 if idle else sched.waiting_by_class.get(name, 0))
            running.add_metric([model_id], 0 if idle else sum(sched.running_by_class.values()))
            in_flight.add_metric([model_id], s.in_flight)
            kv_used.add_metric([model_id], sched.kv_used)
            kv_size.add_metric([model_id], s.kv_size)
            batch.add_metric([model_id], (s.recent_batch_sizes or (0,))[-1])
            threads.add_metric([model_id], s.threads.threads)
            busy_elsewhere.add_metric([model_id], s.threads.busy_elsewhere)
        yield from (prompt, generated, cached, preempted, drafted, accepted, queue, running, in_flight, kv_used)
        yield from (kv_size, batch, threads, busy_elsewhere, *disk.values())

    def _latencies(self, histograms: Mapping[str, Mapping[str, Mapping[str, Histogram]]]) -> Iterator[Metric]:
        families = {
            kind: HistogramMetricFamily(name, help_text, labels=["model", "priority"])
            for kind, (name, help_text) in LATENCY_METRICS.items()
        }
        for model_id, by_class in histograms.items():
            for priority, by_kind in by_class.items():
                for kind, family in families.items():
                    h = by_kind[kind]
                    buckets = [(floatToGoString(bound), n) for bound, n in zip(h.bounds, h.counts, strict=True)]
                    family.add_metric([model_id, priority], [*buckets, ("+Inf", h.count)], h.sum)
        yield from families.values()

    def _load_times(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "localserve_model_load_seconds", "How long loading the model took", labels=["model", "kind"]
        )
        for model_id, loaded in list(self.models.loaded.items()):
            family.add_metric([model_id, "generative"], loaded.load_seconds)
        for model_id, oneshot in list(self.models.oneshot.items()):
            family.add_metric([model_id, oneshot.kind], oneshot.load_seconds)
        yield family

    def _oneshot(self, stats: Mapping[str, OneShotStats]) -> Iterator[Metric]:
        labels = ["model", "kind"]
        padding = GaugeMetricFamily(
            "localserve_oneshot_padding_ratio", "Padding computed per real item size, since start", labels=labels
        )
        size = GaugeMetricFamily(
            "localserve_oneshot_mean_batch_size", "Items per backend run, since start", labels=labels
        )
        queued = GaugeMetricFamily("localserve_oneshot_queue_items", "Items waiting for a batch", labels=labels)
        items = CounterMetricFamily("localserve_oneshot_items", "Items processed", labels=labels)
        batches = CounterMetricFamily("localserve_oneshot_batches", "Backend runs", labels=labels)
        for model_id, s in stats.items():
            key, b = [model_id, str(s.kind)], s.queue
            padding.add_metric(key, b.padding_ratio)
            size.add_metric(key, b.mean_batch_size)
            queued.add_metric(key, b.queue_items)
            items.add_metric(key, b.items)
            batches.add_metric(key, b.batches)
        yield from (padding, size, queued, items, batches)


def _disk_counts(disk: DiskTierStats) -> dict[str, float]:
    """The disk tier's counters by metric name (restore seconds as `/api/v1/stats` rounds them)."""
    return {
        "hits": disk.num_hits,
        "misses": disk.num_misses,
        "bytes_written": disk.bytes_written,
        "bytes_read": disk.bytes_read,
        "restore_seconds": round(disk.restore_s, 4),
    }
