"""The shape of what `/api/v1/stats` and `/metrics` serve, pinned: the key
sets of a generative model (the fake backend of tests/engine, through the
real step thread), of its requests and batch policy, of a one-shot model's
queue, and the metric families. The engine keeps its stats as typed
snapshots and the API writes them out; this test fails if that changes a key.
No model is loaded."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Hashable, Sequence
from pathlib import Path

from localserve.api.state import REGISTRY
from localserve.engine.backend import BackendInfo, OneShotBackend
from localserve.engine.oneshot.queue import OneShotQueue
from localserve.engine.types import GenerateRequest, SamplingParams
from localserve.models.kinds import ModelKind
from localserve.models.policy import FOREVER
from localserve.models.registry import LoadedOneShot, ModelRecord, ModelSpec
from localserve.models.registry.records import RecordState
from localserve.tui.snapshot import Snapshot
from tests.engine.fake_backend import FakeBackend
from tests.engine.scripted import prompt
from tests.tui.live import empty_app, serve

CLASSES = {"interactive", "default", "batch"}
PERCENTILES = {f"{kind}_p{q}_s" for kind in ("ttft", "queue_wait", "itl") for q in (50, 95, 99)}
CLASS_KEYS = {"num_requests"} | {f"{kind}_p{q}_s" for kind in ("ttft", "queue_wait", "itl") for q in (50, 95)}
MODEL_KEYS = {
    "id",
    "backend",
    "device",
    "in_flight",
    "kv_total",
    "max_num_seqs",
    "n_ctx",
    "running",
    "waiting",
    "kv_used",
    "prefix_cache_hit_tokens",
    "prefix_cache_hit_rate",
    "preemptions",
    "spec_draft_tokens",
    "spec_accepted_tokens",
    "spec_acceptance_rate",
    "prefix_disk",
    "recent_batch_sizes",
    "total_prompt_tokens",
    "total_output_tokens",
    "batch_policy",
    "threads",
    "prefill_tokens_per_s",
    "decode_tokens_per_s",
    "steps_per_s",
    "mean_batch_size",
    "busy_fraction",
    "classes",
    "keep_alive",
    "expires_in_s",
    "in_use",
    "options",
    *PERCENTILES,
}
REQUEST_KEYS = {
    "id",
    "model",
    "priority",
    "priority_class",
    "state",
    "prompt_tokens",
    "generated_tokens",
    "max_tokens",
    "age_s",
    "queue_wait_s",
    "ttft_s",
    "tokens_per_s",
}
POLICY_KEYS = {
    "mode",
    "step_limit_s",
    "quiet_after_s",
    "batch_in_step",
    "batch_held_back",
    "lent_slots",
    "num_slots_returned",
    "predicted_step_s",
    "measured_step_s",
    "mean_abs_error_s",
    "step_fixed_s",
    "step_per_token_s",
    "step_per_seq_s",
    "num_steps_observed",
}
ONE_SHOT_KEYS = {
    "kind",
    "backend",
    "device",
    "queue_items",
    "queue_requests",
    "in_flight",
    "dispatching",
    "requests",
    "items",
    "dispatches",
    "batches",
    "errors",
    "rejected",
    "real_size",
    "padded_size",
    "busy_s",
    "padding_ratio",
    "recent_padding_ratio",
    "mean_batch_size",
    "max_batch_size_seen",
    "recent_batch_sizes",
    "items_per_s",
    "busy_fraction",
    "padding_free",
    "max_batch_size",
    "max_batch_tokens",
    "max_wait_ms",
    "max_queue",
    "group_by_length",
    "keep_alive",
    "expires_in_s",
    "in_use",
}
#: `# TYPE` names of /metrics (prometheus-client writes a counter's `_total` there).
METRIC_FAMILIES = {
    "localserve_disk_free_bytes",
    "localserve_disk_total_bytes",
    "localserve_generation_tokens_total",
    "localserve_inter_token_latency_seconds",
    "localserve_kv_cache_capacity_tokens",
    "localserve_kv_cache_used_tokens",
    "localserve_last_batch_size",
    "localserve_threads",
    "localserve_cpu_busy_elsewhere_cores",
    "localserve_model_load_seconds",
    "localserve_oneshot_batches_total",
    "localserve_oneshot_items_total",
    "localserve_oneshot_mean_batch_size",
    "localserve_oneshot_padding_ratio",
    "localserve_oneshot_queue_items",
    "localserve_preemptions_total",
    "localserve_prefix_cache_hit_tokens_total",
    "localserve_prefix_disk_bytes_read_total",
    "localserve_prefix_disk_bytes_written_total",
    "localserve_prefix_disk_hits_total",
    "localserve_prefix_disk_misses_total",
    "localserve_prefix_disk_restore_seconds_total",
    "localserve_prompt_tokens_total",
    "localserve_queue_depth",
    "localserve_queue_wait_seconds",
    "localserve_requests_created",
    "localserve_requests_in_flight",
    "localserve_requests_total",
    "localserve_running_sequences",
    "localserve_spec_decode_num_accepted_tokens_total",
    "localserve_spec_decode_num_draft_tokens_total",
    "localserve_time_to_first_token_seconds",
}


class Lengths(OneShotBackend[str, int]):
    """A one-shot model that answers each text's length."""

    padding_free = False

    def run(self, items: Sequence[str]) -> list[int]:
        return [len(item) for item in items]

    def item_size(self, item: str) -> int:
        return len(item)

    def group_key(self, item: str) -> Hashable:
        return None

    def info(self) -> BackendInfo:
        return BackendInfo(backend="fake-oneshot", device="CPU", model_path="")


async def test_stats_and_metrics_keep_their_keys() -> None:
    app = empty_app()
    registry = app[REGISTRY]
    backend = FakeBackend()
    queue: OneShotQueue[str, int] = OneShotQueue("lengths", Lengths())
    spec = ModelSpec("lengths", Path("/models/lengths"), ("embeddings",))
    model = LoadedOneShot(spec, ModelKind.EMBEDDINGS, queue.backend, queue)
    registry.records["lengths"] = ModelRecord(spec, ModelKind.EMBEDDINGS, FOREVER, RecordState.LOADED, model=model)
    async with serve(app) as client:
        registry.engine.add_model("fake", backend)
        assert await queue.submit(["ab", "abc"]) == [2, 3]
        done = [
            e
            async for e in registry.engine.submit(
                "fake", GenerateRequest("done", prompt(0, 5), SamplingParams(max_tokens=4))
            )
        ]
        assert done[-1].num_output_tokens == 4
        backend.pause()
        stream = registry.engine.submit("fake", GenerateRequest("live", prompt(0, 5), SamplingParams(max_tokens=50)))
        first = len(backend.batches) + 1
        await asyncio.to_thread(backend.wait_for_steps, first)
        await asyncio.sleep(0.15)  # the step thread publishes its snapshot at most every 100 ms ...
        backend.resume(pause_at=first + 1)  # ... which it does after this step
        await asyncio.to_thread(backend.wait_for_steps, first + 1)
        body = await (await client.get("/api/v1/stats")).json()
        metrics = await (await client.get("/metrics")).text()
        stream.abort()
        backend.resume()
        await registry.engine.unload_model("fake")
        queue.close()
    (entry,) = body["models"]
    assert set(entry) == MODEL_KEYS, set(entry) ^ MODEL_KEYS
    assert entry["id"] == "fake" and entry["backend"] == "fake" and entry["prefix_disk"] is False
    assert entry["total_output_tokens"] == 4 and entry["total_prompt_tokens"] == 5 and entry["in_flight"] == 1
    assert set(entry["running"]) == set(entry["waiting"]) == set(entry["classes"]) == CLASSES
    assert all(set(figures) == CLASS_KEYS for figures in entry["classes"].values())
    assert set(entry["batch_policy"]) == POLICY_KEYS
    assert set(entry["threads"]) == {"in_use", "max", "mode", "cpu_busy_elsewhere", "switches"}
    (live,) = body["requests"]
    assert set(live) == REQUEST_KEYS and live["id"] == "live" and live["model"] == "fake"
    assert live["priority_class"] == "default" and live["max_tokens"] == 50
    one_shot = body["one_shot"]["lengths"]
    assert set(one_shot) == ONE_SHOT_KEYS, set(one_shot) ^ ONE_SHOT_KEYS
    assert one_shot["kind"] == "embeddings" and one_shot["items"] == 2 and one_shot["backend"] == "fake-oneshot"
    # The dashboard's one parser of this JSON reads the same figures.
    view = Snapshot.from_json(body)
    (model_view,) = view.models
    assert model_view.model_id == "fake" and model_view.kv_size == entry["kv_total"] > 0
    assert model_view.num_running == 1 and model_view.batch_policy.mode == entry["batch_policy"]["mode"] != ""
    assert view.requests[0].max_tokens == 50 and view.one_shot[0].kind == "embeddings"
    families = set(re.findall(r"^# TYPE (\w+) ", metrics, flags=re.MULTILINE))
    assert families == METRIC_FAMILIES, families ^ METRIC_FAMILIES
    assert 'localserve_generation_tokens_total{model="fake"} 4.0' in metrics
    assert 'localserve_oneshot_items_total{kind="embeddings",model="lengths"} 2.0' in metrics
    assert 'localserve_queue_depth{model="fake",priority="default"} 0.0' in metrics
    assert 'localserve_running_sequences{model="fake"} 1.0' in metrics
    assert 'localserve_requests_in_flight{model="fake"} 1.0' in metrics
    assert 'localserve_time_to_first_token_seconds_count{model="fake",priority="default"} 2.0' in metrics
