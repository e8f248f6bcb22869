"""The progress bar of `localserve batch run --ray`: the single-machine bar
(done/total, tokens/s, ETA) plus each replica's throughput, so a slow or idle
node shows up while the job runs; and a per-replica summary at the end.

Rates count from when the first replica began its first batch (each
replica's own from its own first batch): starting Ray and loading a model on
every node can take longer than a small job, and would hide the throughput.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from localserve.jobs.progress import Progress


@dataclass(slots=True)
class ReplicaCount:
    name: str  # host:pid of the actor
    working_since: float  # wall clock (time.time()) of its first batch
    num_done: int = 0
    num_tokens: int = 0
    last_at: float = 0.0  # wall clock of its latest answer

    def rate(self) -> float:
        return self.num_tokens / max(1e-9, self.last_at - self.working_since)


class ReplicaProgress(Progress):
    """`Progress` with one counter per replica; labels r1, r2, ... in the
    order replicas first answer."""

    replicas: dict[str, ReplicaCount]

    def start(self, num_total: int, num_done: int = 0) -> None:
        self.replicas = {}
        super().start(num_total, num_done)

    def advance_replica(self, replica: str, working_since: float, *, ok: bool, num_tokens: int) -> None:
        count = self.replicas.get(replica)
        if count is None:
            # The whole job's clock starts with the earliest replica's first batch.
            began = time.monotonic() - (time.time() - working_since)
            self._started = min(self._started, began) if self.replicas else began
            count = self.replicas[replica] = ReplicaCount(replica, working_since)
        count.num_done += 1
        count.num_tokens += num_tokens
        count.last_at = time.time()
        self.advance(ok=ok, num_tokens=num_tokens)

    def line(self) -> str:
        rates = " ".join(f"r{i} {c.rate():.1f}" for i, c in enumerate(self.replicas.values(), start=1))
        return f"{super().line()} | per replica tok/s: {rates or 'starting'}"

    def summary(self) -> list[str]:
        """One line per replica: requests, tokens, and tokens/s since its first batch."""
        return [
            f"r{i} {c.name}: {c.num_done} requests, {c.num_tokens} tokens, {c.rate():.1f} tok/s"
            for i, c in enumerate(self.replicas.values(), start=1)
        ]
