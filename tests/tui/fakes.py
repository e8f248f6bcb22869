"""A scripted `SnapshotSource` and a fixed, deterministic server snapshot."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

from localserve.tui.snapshot import Snapshot
from localserve.tui.source import SourceError

LABEL = "http://127.0.0.1:8400"


def class_figures(ttft_p95_s: float = 0.42) -> dict[str, dict[str, Any]]:
    """Per-class latencies of a model whose batch work waits by design."""
    return {
        "interactive": {
            "num_requests": 41,
            "ttft_p50_s": 0.118,
            "ttft_p95_s": ttft_p95_s,
            "queue_wait_p50_s": 0.004,
            "queue_wait_p95_s": 0.021,
            "itl_p50_s": 0.031,
            "itl_p95_s": 0.058,
        },
        "default": {
            "num_requests": 12,
            "ttft_p50_s": 0.35,
            "ttft_p95_s": 1.84,
            "queue_wait_p50_s": 0.12,
            "queue_wait_p95_s": 1.2,
            "itl_p50_s": 0.033,
            "itl_p95_s": 0.071,
        },
        "batch": {
            "num_requests": 3,
            "ttft_p50_s": 6.2,
            "ttft_p95_s": 10.5,
            "queue_wait_p50_s": 5.9,
            "queue_wait_p95_s": 10.1,
            "itl_p50_s": 0.045,
            "itl_p95_s": 0.12,
        },
    }


def fixed_snapshot(decode_tokens_per_s: float = 182.4, ttft_p95_s: float = 0.42) -> dict[str, Any]:
    """A busy server: two generative models and an embeddings model, requests
    of every class (some too new for a rate), two batch jobs."""
    smol = {
        "id": "smollm2-135m-instruct",
        "backend": "llamacpp",
        "device": "cpu",
        "running": {"interactive": 2, "default": 3, "batch": 1},
        "waiting": {"interactive": 0, "default": 1, "batch": 3},
        "in_flight": 10,
        "kv_used": 2730,
        "kv_total": 4096,
        "max_num_seqs": 8,
        "n_ctx": 1024,
        "prefix_cache_hit_rate": 0.37,
        "spec_draft_tokens": 400,
        "spec_accepted_tokens": 312,
        "prefix_disk": True,
        "prefix_disk_hits": 7,
        "mean_batch_size": 5.6,
        "prefill_tokens_per_s": 910.0,
        "decode_tokens_per_s": decode_tokens_per_s - 40.0,
        "ttft_p50_s": 0.12,
        "ttft_p95_s": ttft_p95_s,
        "itl_p50_s": 0.031,
        "itl_p95_s": 0.058,
        "busy_fraction": 0.93,
        "classes": class_figures(ttft_p95_s),
        "keep_alive": "forever",
        "expires_in_s": None,
        "in_use": True,
        "options": {"weights_mib": 98.2, "kv_mib": 45.0, "n_gpu_layers": 0, "n_layers": 30, "device": "CPU"},
        "batch_policy": {
            "mode": "shared",
            "step_limit_s": 0.045,
            "batch_in_step": 1,
            "batch_held_back": 3,
            "lent_slots": 0,
            "predicted_step_s": 0.031,
            "measured_step_s": 0.029,
        },
        "threads": {"in_use": 1, "max": 2, "mode": "auto", "cpu_busy_elsewhere": 1.04, "switches": 3},
    }
    coder = {
        **smol,
        "id": "qwen2.5-coder-0.5b",
        "backend": "openvino",
        "device": "npu",
        "running": {"interactive": 1, "default": 0, "batch": 0},
        "waiting": {"interactive": 0, "default": 0, "batch": 0},
        "in_flight": 1,
        "kv_used": 300,
        "kv_total": 2048,
        "max_num_seqs": 4,
        "n_ctx": 2048,
        "prefix_cache_hit_rate": 0.82,
        "mean_batch_size": 1.0,
        "decode_tokens_per_s": 40.0,
        "ttft_p95_s": 0.09,
        "classes": {"interactive": {"num_requests": 1, "ttft_p50_s": 0.09, "ttft_p95_s": 0.09}},
        "keep_alive": "5m",
        "expires_in_s": 245.0,
        "in_use": False,
        "options": {"weights_mib": 1450.0, "kv_mib": 0.0, "n_gpu_layers": 0, "n_layers": 0, "device": "NPU"},
        "batch_policy": {"mode": "alone"},
        "threads": {"in_use": 0, "max": 0, "mode": "fixed", "cpu_busy_elsewhere": 0.0, "switches": 0},
    }
    states = ["running"] * 6 + ["waiting"] * 4
    classes = [
        "interactive",
        "interactive",
        "default",
        "default",
        "default",
        "batch",
        "default",
        "batch",
        "batch",
        "batch",
    ]
    requests = [
        {
            "id": f"chatcmpl-{i:02d}{'ab12cd34ef' * 3}",
            "model": smol["id"],
            "priority": {"interactive": 0.0, "default": 1.0, "batch": 2.0}[cls],
            "priority_class": cls,
            "state": state,
            "prompt_tokens": 40 + 37 * i,
            "generated_tokens": max(1, 120 - 24 * i) if state == "running" else 0,
            "max_tokens": 256,
            "age_s": 95.0 - 7 * i,
            "queue_wait_s": 0.004 + 0.9 * i if state == "running" else None,
            "ttft_s": 0.1 + 0.9 * i if state == "running" else None,
            # The newest running one has one token: too few for a rate.
            "tokens_per_s": (26.5 - i) if state == "running" and i < 5 else None,
        }
        for i, (cls, state) in enumerate(zip(classes, states, strict=True))
    ]
    requests.append({**requests[0], "id": "cmpl-fim-7f3e", "model": coder["id"], "age_s": 0.8, "tokens_per_s": 140.0})
    return {
        "object": "localserve.stats",
        "version": "0.1.0",
        "time": 1_750_000_000.0,
        "uptime_s": 3725.0,
        "process": {"pid": 4242, "cpu_percent": 187.0, "rss_bytes": 612_000_000, "num_threads": 14, "num_cpus": 8},
        "models": [smol, coder],
        "loading": [],
        "load_errors": {},
        "requests": requests,
        "one_shot": {
            "all-minilm-l6-v2": {
                "kind": "embeddings",
                "queue_items": 12,
                "in_flight": 32,
                "items_per_s": 410.5,
                "mean_batch_size": 28.4,
                "recent_padding_ratio": 0.08,
                "busy_fraction": 0.61,
                "keep_alive": "5m",
                "expires_in_s": None,
                "in_use": True,
            }
        },
        "batches": [
            {
                "id": "batch_5e1f9a",
                "status": "in_progress",
                "model": smol["id"],
                "request_counts": {"total": 500, "completed": 212, "failed": 3},
            },
            {
                "id": "batch_77c0d2",
                "status": "validating",
                "request_counts": {"total": 120, "completed": 0, "failed": 0},
            },
        ],
    }


def history(num: int = 120) -> list[dict[str, Any]]:
    """`num` snapshots with a wave of load, ending with `fixed_snapshot()`."""
    out = []
    for i in range(num - 1):
        wave = 0.5 + 0.5 * math.sin(i / 9)
        out.append(fixed_snapshot(decode_tokens_per_s=60 + 140 * wave, ttft_p95_s=0.1 + 0.5 * (1 - wave)))
    return [*out, fixed_snapshot()]


class ScriptedSource:
    """Replays snapshots, then holds the connection open (or fails it, when
    `then_fail` is set). Records the actions it is asked for."""

    label = LABEL

    def __init__(self, snapshots: Sequence[dict[str, Any]], *, then_fail: str | None = None) -> None:
        self.payloads = list(snapshots)
        self.then_fail = then_fail
        self.cancelled: list[str] = []
        self.unloaded: list[str] = []
        self.num_connects = 0

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        self.num_connects += 1
        if self.then_fail and self.num_connects > 1:
            raise SourceError(self.then_fail)
        for payload in self.payloads:
            yield Snapshot.from_json(payload)
        if self.then_fail:
            raise SourceError(self.then_fail)
        await asyncio.Event().wait()  # an open, quiet connection

    async def cancel(self, request_id: str) -> str:
        self.cancelled.append(request_id)
        return f"cancelled {request_id}"

    async def unload(self, model_id: str) -> str:
        self.unloaded.append(model_id)
        return f"unloaded {model_id}"

    async def aclose(self) -> None:
        pass


class DownSource(ScriptedSource):
    """A server that is not there."""

    def __init__(self) -> None:
        super().__init__([], then_fail=f"cannot connect to {LABEL}")


class QueueSource(ScriptedSource):
    """Sends what the test puts in `queue`: a snapshot dict, or a `SourceError`
    that drops the connection (the app then reconnects and reads on)."""

    def __init__(self) -> None:
        super().__init__([])
        self.queue: asyncio.Queue[dict[str, Any] | SourceError] = asyncio.Queue()

    async def snapshots(self) -> AsyncIterator[Snapshot]:
        self.num_connects += 1
        while True:
            item = await self.queue.get()
            if isinstance(item, SourceError):
                raise item
            yield Snapshot.from_json(item)
