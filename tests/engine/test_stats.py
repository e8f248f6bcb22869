"""The engine's one statistics path: `ModelStats` arithmetic on given times,
then the step thread feeding it through a real llama.cpp engine (the tiny
generated GGUF: the timings' plumbing, not the model's quality)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.step.stats import MIN_RATE_SPAN_S, MIN_RATE_TOKENS, TTFT_BUCKETS, ClassFigures, ModelStats
from localserve.engine.types import FinishReason, GenerateRequest, SamplingParams, TokenEvent


def event(request_id: str, num_output: int, finish: FinishReason | None = None) -> TokenEvent:
    return TokenEvent(request_id, (7,), "x", finish_reason=finish, num_prompt_tokens=5, num_output_tokens=num_output)


def test_no_measurement_is_none_not_zero() -> None:
    snap = ModelStats().snapshot()
    assert snap.ttft_p95_s is None and snap.itl_p50_s is None and snap.queue_wait_p95_s is None
    assert set(snap.classes) == {"interactive", "default", "batch"}
    assert snap.classes["batch"] == ClassFigures(num_requests=0)  # every percentile None
    assert snap.decode_tokens_per_s == 0.0  # nothing ran: a measured zero


def test_one_request_is_timed_once_under_its_class() -> None:
    stats = ModelStats()
    t0 = time.monotonic()
    stats.request_arrived("a", 0.0, t0)
    stats.requests_started(["a"], t0 + 0.25)
    stats.requests_started(["a"], t0 + 0.5)  # still running: not a second queue wait
    stats.record_events([event("a", 1)], t0 + 0.75)
    stats.record_events([event("a", 1)], t0 + 0.8)  # no new token (an abort's echo, say): nothing
    stats.record_events([event("a", 2), event("unknown", 3)], t0 + 0.85)
    stats.record_events([event("a", 3, FinishReason.STOP)], t0 + 0.95)
    snap = stats.snapshot()
    interactive = snap.classes["interactive"]
    assert interactive.num_requests == 1
    assert interactive.queue_wait_p50_s == pytest.approx(0.25)
    assert interactive.ttft_p95_s == pytest.approx(0.75)
    assert interactive.itl_p50_s == pytest.approx(0.1)
    assert snap.classes["batch"].num_requests == 0
    assert snap.ttft_p50_s == pytest.approx(0.75)  # all classes together
    assert stats.total_output_tokens == 3 and stats.total_prompt_tokens == 5
    assert stats.request_times(["a"]) == {}  # ended: forgotten
    histogram = stats.histograms()["interactive"]["ttft"]
    assert histogram.count == 1 and histogram.sum == pytest.approx(0.75)
    assert histogram.counts == tuple(0 if bound < 0.75 else 1 for bound in TTFT_BUCKETS)


def test_classes_keep_their_own_percentiles() -> None:
    stats = ModelStats()
    t0 = time.monotonic() - 30
    for i in range(20):  # interactive: TTFT 0.1 s; batch: 5 s, as a batch that waits by design
        for request_id, priority, ttft in ((f"i{i}", 0.0, 0.1), (f"b{i}", 2.0, 5.0)):
            stats.request_arrived(request_id, priority, t0 + i)
            stats.record_events([event(request_id, 1, FinishReason.LENGTH)], t0 + i + ttft)
    classes = stats.snapshot().classes
    assert classes["interactive"].ttft_p95_s == pytest.approx(0.1)
    assert classes["batch"].ttft_p50_s == pytest.approx(5.0)
    assert classes["default"].ttft_p95_s is None


def test_a_request_rate_needs_a_few_tokens() -> None:
    stats = ModelStats()
    t0 = time.monotonic()
    stats.request_arrived("r", 1.0, t0)
    stats.record_events([event("r", 1)], t0 + 0.1)
    assert stats.request_times(["r"])["r"].tokens_per_s is None  # one token: no span at all
    for n in range(2, MIN_RATE_TOKENS + 1):
        stats.record_events([event("r", n)], t0 + 0.1 + 0.0001 * n)
    assert stats.request_times(["r"])["r"].tokens_per_s is None  # still too few
    stats.record_events([event("r", MIN_RATE_TOKENS + 1)], t0 + 0.2)
    times = stats.request_times(["r"])["r"]
    assert times.tokens_per_s == pytest.approx(MIN_RATE_TOKENS / 0.1)
    assert times.ttft_s == pytest.approx(0.1) and times.queue_wait_s is None


def test_a_burst_is_not_a_rate_over_a_few_milliseconds() -> None:
    stats = ModelStats()
    stats.record_step(num_prefill=10, num_decode=1, num_seqs=1, duration_s=0.002)
    snap = stats.snapshot()
    # One token in a 2 ms step is not 500 tok/s: the span is at least MIN_RATE_SPAN_S.
    assert snap.decode_tokens_per_s == pytest.approx(1 / MIN_RATE_SPAN_S, rel=0.05)
    assert snap.prefill_tokens_per_s == pytest.approx(10 / MIN_RATE_SPAN_S, rel=0.05)


# ---- through the step thread --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_backend(tiny_gguf_path: Path):
    backend = LlamaCppBackend(LlamaCppConfig(str(tiny_gguf_path), n_ctx=256, num_slots=1, step_tokens=64))
    yield backend
    backend.close()


async def collect(engine: Engine, request: GenerateRequest) -> TokenEvent:
    events = [event async for event in engine.submit("tiny", request)]
    assert events[-1].finished
    return events[-1]


@pytest.mark.slow
async def test_the_step_thread_times_each_class(tiny_backend: LlamaCppBackend) -> None:
    engine = Engine(EngineConfig())
    engine.add_model("tiny", tiny_backend)
    try:
        prompt = tiny_backend.tokenizer().encode("Hello world", add_special=False)
        params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        # One slot: the batch request waits for the interactive one to finish.
        first = asyncio.ensure_future(collect(engine, GenerateRequest("fast", prompt, params, 0.0)))
        second = asyncio.ensure_future(collect(engine, GenerateRequest("slow", prompt, params, 2.0)))
        ends = await asyncio.gather(first, second)
        stats = engine.stats()["tiny"]
    finally:
        await engine.unload_model("tiny", close_backend=False)
    assert [e.num_output_tokens for e in ends] == [12, 12]
    interactive, batch = stats.rates.classes["interactive"], stats.rates.classes["batch"]
    assert interactive.num_requests == batch.num_requests == 1
    assert stats.rates.classes["default"].num_requests == 0
    assert interactive.queue_wait_p50_s <= interactive.ttft_p50_s < batch.ttft_p50_s
    # The batch request's queue wait is the interactive one's whole run.
    assert batch.queue_wait_p50_s >= interactive.ttft_p50_s + 10 * interactive.itl_p50_s * 0.5
    assert interactive.itl_p95_s is not None and stats.rates.decode_tokens_per_s > 0
    assert stats.total_output_tokens == 24 and stats.scheduler.sequences == ()
