"""The queue limit (`--max-queue`) counts the requests that wait, as the
scheduler counts them: a request that waits for KV room beside a free slot
is waiting too (counting in-flight requests against the slots said 0)."""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest

from localserve.backends.base import BackendInfo, GenerativeBackend, Tokenizer
from localserve.backends.llamacpp import LlamaCppBackend, LlamaCppConfig
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.types import Capacity, GenerateRequest, SamplingParams, StepBatch, StepResult
from localserve.errors import QueueFullError

pytestmark = pytest.mark.slow


class HeldBackend(GenerativeBackend):
    """`inner`, whose steps each wait for the test to let one through."""

    def __init__(self, inner: GenerativeBackend) -> None:
        self.inner = inner
        self.entered = threading.Event()  # a step is waiting to run
        self.allowed = threading.Semaphore(0)

    def execute(self, batch: StepBatch) -> StepResult:
        self.entered.set()
        if not self.allowed.acquire(timeout=60):
            raise TimeoutError("the test never let this step run")
        return self.inner.execute(batch)

    def let_one_step_run(self) -> None:
        self.entered.clear()
        self.allowed.release()

    def capacity(self) -> Capacity:
        return self.inner.capacity()

    def tokenizer(self) -> Tokenizer:
        return self.inner.tokenizer()

    def info(self) -> BackendInfo:
        return self.inner.info()

    def release(self, seq_ids: Collection[int]) -> None:
        self.inner.release(seq_ids)

    def clear_slots(self, slots: Collection[int]) -> None:
        self.inner.clear_slots(slots)

    def metadata(self) -> dict[str, Any]:
        return self.inner.metadata()

    def close(self) -> None:
        self.inner.close()


@pytest.fixture
def one_context_for_two_slots(tiny_gguf_path: Path) -> Iterator[LlamaCppBackend]:
    """Two slots sharing 256 KV cells: two 150-token prompts never fit at once."""
    backend = LlamaCppBackend(LlamaCppConfig(str(tiny_gguf_path), n_ctx=256, parallel=2, kv_tokens=256))
    yield backend
    backend.close()


async def test_a_request_waiting_for_kv_room_counts_against_the_queue(
    one_context_for_two_slots: LlamaCppBackend,
) -> None:
    held = HeldBackend(one_context_for_two_slots)
    capacity = held.capacity()
    assert capacity.max_num_seqs == 2 and capacity.kv_tokens < 300
    engine = Engine(EngineConfig(max_queue=1))
    engine.add_model("tiny", held)
    prompt = list(range(10, 160))  # 150 tokens
    params = SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True)
    streams = []
    try:
        streams.append(engine.submit("tiny", GenerateRequest("a", prompt, params)))
        assert held.entered.wait(30)  # a's first step waits to run
        streams.append(engine.submit("tiny", GenerateRequest("b", prompt, params)))
        held.let_one_step_run()
        assert held.entered.wait(30)  # the next step: b was scheduled and found no KV room
        worker = engine._model("tiny").worker
        assert worker.scheduler.num_running == 1 and worker.num_waiting == 1
        with pytest.raises(QueueFullError, match="1 requests waiting"):
            engine.submit("tiny", GenerateRequest("c", prompt, params))
    finally:
        for stream in streams:
            stream.abort()
        for _ in range(200):  # whatever steps are left run at once
            held.allowed.release()
        await engine.remove_model("tiny", close_backend=False)
