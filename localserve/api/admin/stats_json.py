"""The engine's and the queues' stats snapshots as JSON: the one place
where the typed snapshots (`engine/step/stats.py`, `engine/oneshot/stats.py`,
`engine/step/batch_policy.py`) become the dicts `/api/v1/stats` serves (its
shape is in `api/admin/stats.py`; tests/api/test_stats_shape.py pins the keys).
`/metrics` reads the snapshots' fields directly."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from localserve.engine.oneshot.stats import OneShotQueueSnapshot
from localserve.engine.step.batch_policy import BatchPolicySnapshot
from localserve.engine.step.prefix_disk import DiskTierStats
from localserve.engine.step.stats import ModelRates, ModelSnapshot, SchedulerSnapshot, SeqSnapshot
from localserve.engine.threads import ThreadState


def model_json(model_id: str, stats: ModelSnapshot) -> dict[str, Any]:
    """A generative model's figures (its requests apart: `request_json`)."""
    return {
        "id": model_id,
        "backend": stats.backend,
        "device": stats.device,
        "in_flight": stats.in_flight,
        "kv_total": stats.kv_size,
        "max_num_seqs": stats.num_slots,
        "n_ctx": stats.n_ctx,
        **scheduler_json(stats.scheduler),
        "recent_batch_sizes": list(stats.recent_batch_sizes),
        "total_prompt_tokens": stats.total_prompt_tokens,
        "total_output_tokens": stats.total_output_tokens,
        "batch_policy": policy_json(stats.batch_policy),
        "threads": threads_json(stats.threads),
        **rates_json(stats.rates),
    }


def threads_json(state: ThreadState) -> dict[str, Any]:
    """The CPU threads steps compute on (engine/threads.py)."""
    return {
        "in_use": state.threads,
        "max": state.max_threads,
        "mode": "auto" if state.adaptive else "fixed",
        "cpu_busy_elsewhere": round(state.busy_elsewhere, 2),  # cores other programs kept busy
        "switches": state.switches,
    }


def scheduler_json(snap: SchedulerSnapshot) -> dict[str, Any]:
    """The scheduler's part of a model's figures."""
    return {
        "running": dict(snap.running_by_class),
        "waiting": dict(snap.waiting_by_class),
        "kv_used": snap.kv_used,
        "prefix_cache_hit_tokens": snap.num_cached_tokens,
        "prefix_cache_hit_rate": snap.prefix_cache_hit_rate,
        "preemptions": snap.num_preemptions,
        "spec_draft_tokens": snap.num_draft_tokens,
        "spec_accepted_tokens": snap.num_accepted_tokens,
        "spec_acceptance_rate": snap.spec_acceptance_rate,
        **disk_json(snap.disk),
    }


def disk_json(disk: DiskTierStats | None) -> dict[str, Any]:
    if disk is None:
        return {"prefix_disk": False}
    return {
        "prefix_disk": True,
        "prefix_disk_hits": disk.num_hits,
        "prefix_disk_misses": disk.num_misses,
        "prefix_disk_saves": disk.num_saves,
        "prefix_disk_bytes_written": disk.bytes_written,
        "prefix_disk_bytes_read": disk.bytes_read,
        "prefix_disk_restored_tokens": disk.num_restored_tokens,
        "prefix_disk_restore_s": round(disk.restore_s, 4),
        "prefix_disk_dropped": disk.num_dropped,
    }


def rates_json(rates: ModelRates) -> dict[str, Any]:
    """Rates and percentiles, then `classes` (class -> figures): the field names are the keys."""
    return asdict(rates)


def policy_json(policy: BatchPolicySnapshot) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(policy).items()}


def request_json(model_id: str, seq: SeqSnapshot) -> dict[str, Any]:
    """One request in flight (the API adds its `priority_class`)."""
    return {
        "id": seq.request_id,
        "model": model_id,
        "priority": seq.priority,
        "state": seq.state,
        "prompt_tokens": seq.num_prompt_tokens,
        "generated_tokens": seq.num_output_tokens,
        "max_tokens": seq.max_tokens,
        "age_s": round(seq.age_s, 3),
        "queue_wait_s": _round(seq.queue_wait_s, 4),
        "ttft_s": _round(seq.ttft_s, 4),
        "tokens_per_s": _round(seq.tokens_per_s, 2),
    }


def oneshot_queue_json(stats: OneShotQueueSnapshot) -> dict[str, Any]:
    """A one-shot queue's figures (`recent_batch_sizes` a list, as JSON has it)."""
    out = asdict(stats)
    out["recent_batch_sizes"] = list(stats.recent_batch_sizes)
    return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
