"""Counters and sliding-window figures of one queue: batch sizes, padding,
throughput. Written by the queue's thread, read by the stats endpoints."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

WINDOW_S = 60.0  # how far back the recent-batch figures look


@dataclass(frozen=True, slots=True)
class OneShotQueueSnapshot:
    """`OneShotQueue.stats`: its queue now, `OneShotQueueStats`' totals and rates, and its
    settings (the names are those of the JSON the API writes of it)."""

    backend: str
    device: str
    queue_items: int
    queue_requests: int
    in_flight: int
    dispatching: bool
    requests: int  # totals since start
    items: int
    dispatches: int
    batches: int  # backend runs
    errors: int  # requests failed by a backend error
    rejected: int  # QueueFullError
    real_size: int  # summed item sizes that went through run()
    padded_size: int  # padding slots a padded backend computed on top
    busy_s: float
    padding_ratio: float
    recent_padding_ratio: float
    mean_batch_size: float
    max_batch_size_seen: int
    recent_batch_sizes: tuple[int, ...]
    items_per_s: float  # over the last `recent_s`
    busy_fraction: float
    padding_free: bool
    max_batch_size: int
    max_batch_tokens: int
    max_wait_ms: float
    max_queue: int
    group_by_length: bool


@dataclass(frozen=True, slots=True)
class BatcherFigures:
    """`OneShotQueueStats.snapshot`: the totals and rates part of a `OneShotQueueSnapshot`."""

    requests: int
    items: int
    dispatches: int
    batches: int
    errors: int
    rejected: int
    real_size: int
    padded_size: int
    busy_s: float
    padding_ratio: float
    recent_padding_ratio: float
    mean_batch_size: float
    max_batch_size_seen: int
    recent_batch_sizes: tuple[int, ...]
    items_per_s: float
    busy_fraction: float


class OneShotQueueStats:
    """Thread-safe totals plus the runs of the last `WINDOW_S` seconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.num_requests = 0
        self.num_dispatches = 0
        self.num_rejected = 0  # QueueFullError
        self._num_items = 0
        self._num_runs = 0
        self._num_errors = 0  # requests failed by a backend error
        self._num_real = 0  # summed item sizes that went through run()
        self._num_padded = 0  # padding slots a padded backend computed on top
        self._busy_s = 0.0
        self._recent: deque[tuple[float, int, int, int, float]] = deque()  # t, items, real, padded, seconds

    def record_run(self, num_items: int, real: int, padded: int, seconds: float, num_failed_requests: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._num_runs += 1
            self._num_items += num_items
            self._num_real += real
            self._num_padded += padded
            self._busy_s += seconds
            self._num_errors += num_failed_requests
            self._recent.append((now, num_items, real, padded, seconds))
            while self._recent and self._recent[0][0] < now - WINDOW_S:
                self._recent.popleft()

    def snapshot(self, recent_s: float = 10.0) -> BatcherFigures:
        """Totals, padding ratios, batch sizes and rates (items/s over `recent_s`)."""
        now = time.monotonic()
        with self._lock:
            window = list(self._recent)
            requests, items, dispatches = self.num_requests, self._num_items, self.num_dispatches
            runs, errors, rejected = self._num_runs, self._num_errors, self.num_rejected
            real, padded, busy_s = self._num_real, self._num_padded, self._busy_s
        recent = [r for r in window if r[0] >= now - recent_s]
        span = max(1e-3, min(recent_s, now - recent[0][0] + recent[0][4])) if recent else max(recent_s, 1e-3)
        sizes = [r[1] for r in window]
        return BatcherFigures(
            requests=requests,
            items=items,
            dispatches=dispatches,
            batches=runs,
            errors=errors,
            rejected=rejected,
            real_size=real,
            padded_size=padded,
            busy_s=round(busy_s, 4),
            padding_ratio=padded / real if real else 0.0,
            recent_padding_ratio=(sum(r[3] for r in window) / sum(r[2] for r in window)) if window else 0.0,
            mean_batch_size=items / runs if runs else 0.0,
            max_batch_size_seen=max(sizes, default=0),
            recent_batch_sizes=tuple(sizes[-60:]),
            items_per_s=sum(r[1] for r in recent) / span,
            busy_fraction=min(1.0, sum(r[4] for r in recent) / span),
        )
