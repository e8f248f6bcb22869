"""What the engine measures for one model: recorded once, on the step thread.

* Steps: tokens computed (prefill and decode, as the scheduler counts them),
  sequences and duration, for the rates over the last `RATE_WINDOW_S`.
* Requests, per priority class: queue wait (submission to the first step
  that computes any of it), time to first token (submission to the first
  sampled token) and inter-token latency, as percentiles over the last
  `WINDOW_S` and as cumulative histograms (Prometheus).
* Each request in flight: its own queue wait, time to first token and
  decode rate, for the request table.

The step thread writes (`request_arrived`, `requests_started`,
`record_step`, `record_events`); the event loop reads (`snapshot`,
`histograms`, `request_times`). One lock guards both.

Everything read out is a frozen snapshot: `ModelRates` (this module's own
figures), `SchedulerSnapshot` (what the step thread publishes of its
scheduler after a step) and `ModelSnapshot`, all of a model's figures that
`Engine.stats` returns. They become JSON once, at the API edge
(`api/admin/stats_json.py`); a new scheduler figure is a field of
`SchedulerSnapshot`, filled in `StepPublisher.publish` and named there.

`StepPublisher` is the step thread's one publisher: after each step it
records the step's figures, republishes the queue limit's count and, at most
every `SNAPSHOT_INTERVAL_S` (or when asked), a fresh `SchedulerSnapshot`.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from localserve.engine.step.batch_policy import BatchPolicySnapshot
from localserve.engine.step.prefix_disk import DiskPrefixStore, DiskTierStats
from localserve.engine.step.queue_count import QueueCount
from localserve.engine.step.scheduler import Scheduler
from localserve.engine.step.sequence import SeqStatus
from localserve.engine.threads import ThreadState
from localserve.engine.types import PRIORITY_ALIASES, TokenEvent, priority_class

PRIORITY_CLASSES: tuple[str, ...] = tuple(PRIORITY_ALIASES)
WINDOW_S = 60.0  # latency percentiles
RATE_WINDOW_S = 10.0  # token and step rates
MIN_RATE_SPAN_S = 1.0  # a burst after an idle spell is averaged over at least this long
MIN_RATE_TOKENS = 4  # a request's decode rate needs this many tokens after its first
MAX_SAMPLES = 4096  # per latency window: bounds the sorting a snapshot does

#: Histogram bounds in seconds; `/metrics` exposes them as `le` buckets.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
QUEUE_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5)
LATENCY_KINDS = {"ttft": TTFT_BUCKETS, "queue_wait": QUEUE_WAIT_BUCKETS, "itl": ITL_BUCKETS}


def percentile(ordered: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted values; None for none (nothing was measured)."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))]


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: `counts[i]` values at most `bounds[i]`, then `count` in all (+Inf)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    count: int
    sum: float


class Latency:
    """One latency series: recent values for percentiles, all values bucketed."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self._recent: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)
        self._buckets = [0] * (len(bounds) + 1)  # the last one: above every bound
        self._count = 0
        self._sum = 0.0

    def observe(self, now: float, seconds: float) -> None:
        self._recent.append((now, seconds))
        self._buckets[bisect_left(self.bounds, seconds)] += 1
        self._count += 1
        self._sum += seconds

    def recent(self, now: float) -> list[float]:
        return [value for t, value in self._recent if t >= now - WINDOW_S]

    def histogram(self) -> Histogram:
        counts, total = [], 0
        for n in self._buckets[:-1]:
            total += n
            counts.append(total)
        return Histogram(self.bounds, tuple(counts), self._count, self._sum)


@dataclass(slots=True)
class RequestTimes:
    """One request's moments (monotonic seconds; 0.0: not yet)."""

    priority_class: str
    arrived_at: float
    started_at: float = 0.0  # the first step that computed any of it
    first_token_at: float = 0.0
    last_token_at: float = 0.0
    num_tokens: int = 0  # sampled so far

    @property
    def queue_wait_s(self) -> float | None:
        return self.started_at - self.arrived_at if self.started_at else None

    @property
    def ttft_s(self) -> float | None:
        return self.first_token_at - self.arrived_at if self.first_token_at else None

    @property
    def tokens_per_s(self) -> float | None:
        """Decode rate since the first token; None until `MIN_RATE_TOKENS` more came."""
        span = self.last_token_at - self.first_token_at
        if self.num_tokens - 1 < MIN_RATE_TOKENS or span <= 0:
            return None
        return (self.num_tokens - 1) / span


class ModelStats:
    """Step, class and request figures of one model (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: deque[tuple[float, int, int, int, float]] = deque()  # t, prefill, decode, seqs, dur
        self._latency = {cls: {kind: Latency(b) for kind, b in LATENCY_KINDS.items()} for cls in PRIORITY_CLASSES}
        self._requests: dict[str, RequestTimes] = {}
        self.total_prompt_tokens = 0  # of finished requests
        self.total_output_tokens = 0

    # ---- the step thread ---------------------------------------------------------

    def request_arrived(self, request_id: str, priority: float, at: float) -> None:
        """A request the scheduler accepted; `at` is when it was submitted."""
        with self._lock:
            self._requests[request_id] = RequestTimes(priority_class(priority), at)

    def requests_started(self, request_ids: Iterable[str], now: float) -> None:
        """Requests in the step about to run; the first time is the end of their queue wait."""
        with self._lock:
            for request_id in request_ids:
                times = self._requests.get(request_id)
                if times is not None and not times.started_at:
                    times.started_at = now
                    self._latency[times.priority_class]["queue_wait"].observe(now, now - times.arrived_at)

    def record_step(self, num_prefill: int, num_decode: int, num_seqs: int, duration_s: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._steps.append((now, num_prefill, num_decode, num_seqs, duration_s))
            while self._steps and self._steps[0][0] < now - WINDOW_S:
                self._steps.popleft()

    def record_events(self, events: Iterable[TokenEvent], now: float) -> None:
        """Sampled tokens (time to first token, inter-token latency) and ended requests."""
        with self._lock:
            for event in events:
                times = self._requests.get(event.request_id)
                if times is not None and event.num_output_tokens > times.num_tokens:
                    self._token(times, event.num_output_tokens, now)
                if event.finished:
                    self._requests.pop(event.request_id, None)
                    self.total_prompt_tokens += event.num_prompt_tokens
                    self.total_output_tokens += event.num_output_tokens

    def _token(self, times: RequestTimes, num_tokens: int, now: float) -> None:
        latency = self._latency[times.priority_class]
        if times.first_token_at:
            latency["itl"].observe(now, now - times.last_token_at)
        else:
            times.first_token_at = now
            latency["ttft"].observe(now, now - times.arrived_at)
        times.last_token_at = now
        times.num_tokens = num_tokens

    # ---- readers -----------------------------------------------------------------

    def request_times(self, request_ids: Iterable[str]) -> dict[str, RequestTimes]:
        """Copies of the times of those requests still tracked."""
        with self._lock:
            return {rid: replace(self._requests[rid]) for rid in request_ids if rid in self._requests}

    def snapshot(self) -> ModelRates:
        """Rates over the last `RATE_WINDOW_S` (at least `MIN_RATE_SPAN_S`), latency
        percentiles over `WINDOW_S`, for all classes together and under `classes`
        per priority class. A percentile with nothing measured is None."""
        now = time.monotonic()
        with self._lock:
            steps = [s for s in self._steps if s[0] >= now - RATE_WINDOW_S]
            recent = {
                cls: {kind: latency.recent(now) for kind, latency in kinds.items()}
                for cls, kinds in self._latency.items()
            }
        first = steps[0] if steps else None
        span = max(MIN_RATE_SPAN_S, min(RATE_WINDOW_S, now - first[0] + first[4])) if first else RATE_WINDOW_S
        everything = {kind: [v for cls in recent.values() for v in cls[kind]] for kind in LATENCY_KINDS}
        return ModelRates(
            prefill_tokens_per_s=sum(s[1] for s in steps) / span,
            decode_tokens_per_s=sum(s[2] for s in steps) / span,
            steps_per_s=len(steps) / span,
            mean_batch_size=(sum(s[3] for s in steps) / len(steps)) if steps else 0.0,
            busy_fraction=min(1.0, sum(s[4] for s in steps) / span),
            **_percentiles(everything, (50, 95, 99)),
            classes={cls: _class_figures(values) for cls, values in recent.items()},
        )

    def histograms(self) -> dict[str, dict[str, Histogram]]:
        """Priority class -> latency kind (`ttft`, `queue_wait`, `itl`) -> cumulative histogram."""
        with self._lock:
            return {cls: {kind: lat.histogram() for kind, lat in kinds.items()} for cls, kinds in self._latency.items()}

    def recent_batch_sizes(self, limit: int = 60) -> list[int]:
        with self._lock:
            return [s[3] for s in list(self._steps)[-limit:]]


def _percentiles(values: dict[str, list[float]], qs: tuple[int, ...]) -> dict[str, float | None]:
    ordered = {kind: sorted(series) for kind, series in values.items()}
    return {f"{kind}_p{q}_s": percentile(series, q) for kind, series in ordered.items() for q in qs}


def _class_figures(values: dict[str, list[float]]) -> ClassFigures:
    """One class's figures: `num_requests` (first tokens in the window) and p50/p95 of each latency."""
    return ClassFigures(num_requests=len(values["ttft"]), **_percentiles(values, (50, 95)))


@dataclass(frozen=True, slots=True)
class ClassFigures:
    """One priority class over the last `WINDOW_S`: first tokens, and p50/p95 of each latency."""

    num_requests: int = 0
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    queue_wait_p50_s: float | None = None
    queue_wait_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None


@dataclass(frozen=True, slots=True)
class ModelRates:
    """`ModelStats.snapshot`: step rates and latency percentiles (all classes, then per class)."""

    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    steps_per_s: float
    mean_batch_size: float
    busy_fraction: float
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    ttft_p99_s: float | None
    queue_wait_p50_s: float | None
    queue_wait_p95_s: float | None
    queue_wait_p99_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    itl_p99_s: float | None
    classes: dict[str, ClassFigures]


@dataclass(frozen=True, slots=True)
class SeqSnapshot:
    request_id: str
    priority: float
    state: str  # "running" | "waiting"
    num_prompt_tokens: int
    num_output_tokens: int
    max_tokens: int
    age_s: float
    queue_wait_s: float | None
    ttft_s: float | None
    tokens_per_s: float | None


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    """What the step thread publishes after a step, for readers on other threads."""

    running_by_class: dict[str, int] = field(default_factory=dict)
    waiting_by_class: dict[str, int] = field(default_factory=dict)
    kv_used: int = 0
    sequences: tuple[SeqSnapshot, ...] = ()
    num_cached_tokens: int = 0
    num_prompt_tokens: int = 0
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # speculative decoding: drafts verified
    num_accepted_tokens: int = 0  # ... and accepted
    disk: DiskTierStats | None = None  # the prefix cache's disk tier (a copy), if the model has one

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_cached_tokens / max(1, self.num_prompt_tokens)

    @property
    def spec_acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None


@dataclass(frozen=True, slots=True)
class ModelSnapshot:
    """All figures of one generative model (`Engine.stats`): what was fixed at
    load, the scheduler's last published state, this module's rates and the
    batch policy's last step."""

    backend: str
    device: str
    in_flight: int  # requests submitted and not finished, as the event loop counts them
    kv_size: int
    num_slots: int
    n_ctx: int
    scheduler: SchedulerSnapshot
    recent_batch_sizes: tuple[int, ...]
    total_prompt_tokens: int  # of finished requests
    total_output_tokens: int
    batch_policy: BatchPolicySnapshot
    rates: ModelRates
    threads: ThreadState  # the CPU threads steps compute on, and the CPU other programs take


SNAPSHOT_INTERVAL_S = 0.1


class StepPublisher:
    """What one step thread publishes for readers on other threads (module
    doc): the scheduler's snapshot and the batch policy's, the queue limit's
    count, and each step's figures in `ModelStats`. Written on the step
    thread only; readers take the immutable objects it replaces whole."""

    def __init__(
        self, scheduler: Scheduler, stats: ModelStats, queue_count: QueueCount, disk: DiskPrefixStore | None
    ) -> None:
        self._scheduler = scheduler
        self._stats = stats
        self._queue_count = queue_count
        self._disk = disk
        self._last = 0.0
        self._counts = (0, 0)  # the scheduler's prefill and decode tokens at the step's start
        self.snapshot = SchedulerSnapshot()
        self.batch_policy = scheduler.policy.snapshot()  # what batch admission did, for stats

    def queue(self) -> None:
        """The queue limit's count (engine/step/queue_count.py), after the inbox or the scheduler moved."""
        self._queue_count.publish(self._scheduler)

    def step_started(self, running_request_ids: list[str], now: float) -> None:
        """A step is about to compute: what it leaves waiting, and the end of its requests' queue wait."""
        self.queue()
        self._stats.requests_started(running_request_ids, now)
        counters = self._scheduler.counters
        self._counts = (counters.num_prefill_tokens, counters.num_decode_tokens)

    def step_ended(self, num_seqs: int, duration_s: float) -> None:
        """The step's figures (the scheduler's counters are the one prefill /
        decode rule; none move in a failed step), and the slots it freed."""
        counters = self._scheduler.counters
        self._stats.record_step(
            num_prefill=counters.num_prefill_tokens - self._counts[0],
            num_decode=counters.num_decode_tokens - self._counts[1],
            num_seqs=num_seqs,
            duration_s=duration_s,
        )
        self.queue()

    def publish(self, *, force: bool = False) -> None:
        """A fresh `SchedulerSnapshot`, at most every SNAPSHOT_INTERVAL_S unless forced."""
        now = time.monotonic()
        if not force and now - self._last < SNAPSHOT_INTERVAL_S:
            return
        self._last = now
        scheduler = self._scheduler
        running: dict[str, int] = {}
        waiting: dict[str, int] = {}
        sequences = []
        seqs = scheduler.sequences()
        times = self._stats.request_times(seq.request_id for seq in seqs)
        for seq in seqs:
            cls = priority_class(seq.priority)
            is_running = seq.status is SeqStatus.RUNNING
            target = running if is_running else waiting
            target[cls] = target.get(cls, 0) + 1
            seq_times = times.get(seq.request_id)
            sequences.append(
                SeqSnapshot(
                    request_id=seq.request_id,
                    priority=seq.priority,
                    state="running" if is_running else "waiting",
                    num_prompt_tokens=seq.num_prompt_tokens,
                    num_output_tokens=seq.num_output_tokens,
                    max_tokens=seq.sampling.max_tokens,
                    age_s=now - (seq_times.arrived_at if seq_times else seq.arrival_time),
                    queue_wait_s=seq_times.queue_wait_s if seq_times else None,
                    ttft_s=seq_times.ttft_s if seq_times else None,
                    tokens_per_s=seq_times.tokens_per_s if seq_times else None,
                )
            )
        counters = scheduler.counters
        self.snapshot = SchedulerSnapshot(
            running_by_class=running,
            waiting_by_class=waiting,
            kv_used=scheduler.kv_used(),
            sequences=tuple(sequences),
            num_cached_tokens=counters.num_cached_tokens,
            num_prompt_tokens=counters.num_prefill_tokens + counters.num_cached_tokens,
            num_preemptions=counters.num_preemptions,
            num_draft_tokens=counters.num_draft_tokens,
            num_accepted_tokens=counters.num_accepted_tokens,
            disk=replace(self._disk.stats) if self._disk is not None else None,
        )
        self.batch_policy = scheduler.policy.snapshot()
