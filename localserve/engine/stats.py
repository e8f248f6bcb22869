"""Sliding-window throughput and latency figures for one model."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

WINDOW_S = 60.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100.0 * (len(ordered) - 1))))
    return ordered[index]


@dataclass(frozen=True, slots=True)
class SeqSnapshot:
    request_id: str
    priority: float
    state: str  # "running" | "waiting"
    num_prompt_tokens: int
    num_output_tokens: int
    age_s: float
    tokens_per_s: float


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


class ModelStats:
    """Step and request timings over the last `WINDOW_S` seconds. Written by
    the step thread and the event loop, read by the stats endpoints."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: deque[tuple[float, int, int, int, float]] = deque()  # t, prefill, decode, seqs, dur
        self._ttft: deque[tuple[float, float]] = deque()
        self._itl: deque[tuple[float, float]] = deque()
        self.num_requests = 0
        self.num_errors = 0
        self.total_prompt_tokens = 0
        self.total_output_tokens = 0

    def record_step(self, num_prefill: int, num_decode: int, num_seqs: int, duration_s: float) -> None:
        now = time.monotonic()
        with self._lock:
            self._steps.append((now, num_prefill, num_decode, num_seqs, duration_s))
            _trim(self._steps, now)

    def record_ttft(self, seconds: float) -> None:
        self._record(self._ttft, seconds)

    def record_itl(self, seconds: float) -> None:
        self._record(self._itl, seconds)

    def _record(self, window: deque[tuple[float, float]], value: float) -> None:
        now = time.monotonic()
        with self._lock:
            window.append((now, value))
            _trim(window, now)

    def snapshot(self, recent_s: float = 10.0) -> dict[str, float]:
        """Rates over the last `recent_s` seconds, latency percentiles over the window."""
        now = time.monotonic()
        with self._lock:
            steps = [s for s in self._steps if s[0] >= now - recent_s]
            ttft = [v for t, v in self._ttft if t >= now - WINDOW_S]
            itl = [v for t, v in self._itl if t >= now - WINDOW_S]
        span = max(1e-3, min(recent_s, now - steps[0][0] + steps[0][4])) if steps else recent_s
        return {
            "prefill_tokens_per_s": sum(s[1] for s in steps) / span,
            "decode_tokens_per_s": sum(s[2] for s in steps) / span,
            "steps_per_s": len(steps) / span,
            "mean_batch_size": (sum(s[3] for s in steps) / len(steps)) if steps else 0.0,
            "busy_fraction": min(1.0, sum(s[4] for s in steps) / span),
            "ttft_p50_s": percentile(ttft, 50),
            "ttft_p95_s": percentile(ttft, 95),
            "ttft_p99_s": percentile(ttft, 99),
            "itl_p50_s": percentile(itl, 50),
            "itl_p95_s": percentile(itl, 95),
            "itl_p99_s": percentile(itl, 99),
        }

    def recent_batch_sizes(self, limit: int = 60) -> list[int]:
        with self._lock:
            return [s[3] for s in list(self._steps)[-limit:]]


def _trim(window: deque, now: float) -> None:  # type: ignore[type-arg]
    while window and window[0][0] < now - WINDOW_S:
        window.popleft()
