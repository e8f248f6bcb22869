"""`GET /metrics`: Prometheus text, parsed with prometheus-client's own parser."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.api.harness import MODEL_ID, ServerThread


def scrape(http: httpx.Client) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted labels: value}."""
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def test_metrics_need_the_key(server: ServerThread) -> None:
    response = httpx.get(f"{server.base_url}/metrics")
    assert response.status_code == 401
    assert response.json()["error"]["type"] == "authentication_error"


def test_gauges_present_per_model(http: httpx.Client) -> None:
    samples = scrape(http)
    for priority in ("interactive", "default", "batch"):
        assert (("model", MODEL_ID), ("priority", priority)) in samples["localserve_queue_depth"]
    assert value(samples, "localserve_kv_cache_capacity_tokens", model=MODEL_ID) > 0
    assert value(samples, "localserve_model_load_seconds", model=MODEL_ID, kind="generative") > 0
    for name in ("localserve_running_sequences", "localserve_last_batch_size", "localserve_kv_cache_used_tokens"):
        assert (("model", MODEL_ID),) in samples[name], name
    assert "localserve_prefix_cache_hit_tokens_total" in samples


@pytest.mark.slow
def test_counters_move_after_requests(http: httpx.Client, client: openai.OpenAI) -> None:
    before = scrape(http)
    reply = client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert http.get("/v1/no-such-route").status_code == 404
    after = scrape(http)

    chat = {"model": MODEL_ID, "endpoint": "/v1/chat/completions", "status": "200"}
    assert value(after, "localserve_requests_total", **chat) == value(before, "localserve_requests_total", **chat) + 1
    missing = {"model": "", "endpoint": "unmatched", "status": "404"}
    assert (
        value(after, "localserve_requests_total", **missing)
        == value(before, "localserve_requests_total", **missing) + 1
    )

    def grew(name: str, by: float) -> None:
        assert value(after, name, model=MODEL_ID) >= value(before, name, model=MODEL_ID) + by, name

    grew("localserve_generation_tokens_total", reply.usage.completion_tokens)
    grew("localserve_prompt_tokens_total", reply.usage.prompt_tokens)


@pytest.mark.slow
def test_latency_histograms_by_priority_class(http: httpx.Client, client: openai.OpenAI) -> None:
    before = scrape(http)
    for priority in ("interactive", "batch"):
        client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=4,
            temperature=0,
            extra_body={"ignore_eos": True, "priority": priority},
        )
    after = scrape(http)

    def grew(name: str, priority: str) -> float:
        labels = {"model": MODEL_ID, "priority": priority}
        return value(after, name, **labels) - value(before, name, **labels)

    for priority in ("interactive", "batch"):
        assert grew("localserve_time_to_first_token_seconds_count", priority) == 1
        assert grew("localserve_queue_wait_seconds_count", priority) == 1
        assert grew("localserve_inter_token_latency_seconds_count", priority) == 3  # 4 tokens, 3 gaps
        assert grew("localserve_time_to_first_token_seconds_sum", priority) > 0
    assert grew("localserve_time_to_first_token_seconds_count", "default") == 0
    buckets = after["localserve_time_to_first_token_seconds_bucket"]
    for priority in ("interactive", "default", "batch"):
        labels = (("model", MODEL_ID), ("priority", priority))
        counts = [buckets[(("le", le), *labels)] for le in ("0.01", "0.1", "1.0", "10.0", "+Inf")]
        assert counts == sorted(counts), counts  # cumulative
        assert counts[-1] == value(
            after, "localserve_time_to_first_token_seconds_count", model=MODEL_ID, priority=priority
        )
