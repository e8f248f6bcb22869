"""The queue limit (`--max-queue`) counts the requests that wait, as the
scheduler counts them, and never a request that is gone: a request that
waits for KV room beside a free slot is waiting (in-flight requests counted
against the slots said 0), and a request that left, before or after the
scheduler saw it, frees its place at once, on a busy model or an idle one.

Each test holds the model's steps (`HeldBackend`) so that what the step
thread has or has not yet seen is decided by the test, not by timing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
from localserve.engine.engine import Engine, EngineConfig, RequestStream
from localserve.engine.step.faults import WrappedBackend
from localserve.engine.types import FinishReason, GenerateRequest, SamplingParams, StepPlan, StepResult
from localserve.errors import QueueFullError

pytestmark = pytest.mark.slow

PROMPT = list(range(10, 160))  # 150 tokens


class HeldBackend(WrappedBackend):
    """`inner`, whose steps each wait for the test to let them run."""

    def __init__(self, inner: LlamaCppBackend) -> None:
        super().__init__(inner)
        self.entered = threading.Event()  # a step is waiting to run
        self._allowed = threading.Semaphore(0)
        self._open = False

    def execute(self, batch: StepPlan) -> StepResult:
        self.entered.set()
        if not self._open and not self._allowed.acquire(timeout=60):
            raise TimeoutError("the test never let this step run")
        return super().execute(batch)

    def let_one_step_run(self) -> None:
        """Let the waiting step run; `entered` is set again by the next one."""
        self.entered.clear()
        self._allowed.release()

    def let_every_step_run(self) -> None:
        self._open = True
        self._allowed.release()


@pytest.fixture
def one_context_for_two_slots(tiny_gguf_path: Path) -> Iterator[LlamaCppBackend]:
    """Two slots sharing 256 KV cells: two 150-token prompts never fit at once."""
    backend = LlamaCppBackend(LlamaCppConfig(str(tiny_gguf_path), n_ctx=256, num_slots=2, kv_size=256))
    yield backend
    backend.close()


@pytest.fixture
def one_slot(tiny_gguf_path: Path) -> Iterator[LlamaCppBackend]:
    backend = LlamaCppBackend(LlamaCppConfig(str(tiny_gguf_path), n_ctx=256, num_slots=1))
    yield backend
    backend.close()


def request(request_id: str, max_tokens: int = 50) -> GenerateRequest:
    return GenerateRequest(request_id, PROMPT, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))


async def finish(stream: RequestStream) -> FinishReason | None:
    return [event async for event in stream][-1].finish_reason


async def test_a_request_waiting_for_kv_room_counts_against_the_queue(
    one_context_for_two_slots: LlamaCppBackend,
) -> None:
    held = HeldBackend(one_context_for_two_slots)
    capacity = held.capacity()
    assert capacity.num_slots == 2 and capacity.kv_size < 2 * len(PROMPT)
    engine = Engine(EngineConfig(max_queue=1))
    engine.add_model("tiny", held)
    streams = []
    try:
        streams.append(engine.submit("tiny", request("a")))
        assert held.entered.wait(30)  # a's first step waits to run
        streams.append(engine.submit("tiny", request("b")))
        held.let_one_step_run()
        assert held.entered.wait(30)  # the next step: b was scheduled and found no KV room
        worker = engine._model("tiny").worker
        assert worker.scheduler.num_running == 1 and worker.num_waiting == 1
        with pytest.raises(QueueFullError, match="1 requests waiting"):
            engine.submit("tiny", request("c"))
    finally:
        for stream in streams:
            stream.abort()
        held.let_every_step_run()
        await engine.unload_model("tiny", close_backend=False)


async def test_requests_that_left_before_the_scheduler_saw_them_never_count(one_slot: LlamaCppBackend) -> None:
    """Requests sent and aborted while a step runs reach the step thread
    together, after it, and end before any schedule() sees them. They count
    neither meanwhile nor once the model is idle. (bbdd87d counted such a
    request as new until the next schedule(), which on an idle model never
    came: every later request was refused, for good.)"""
    held = HeldBackend(one_slot)
    engine = Engine(EngineConfig(max_queue=1))
    engine.add_model("tiny", held)
    worker = engine._model("tiny").worker
    try:
        last = engine.submit("tiny", request("last", max_tokens=1))  # its one step ends all the work
        assert held.entered.wait(30)
        for i in range(4):
            engine.submit("tiny", request(f"gone{i}")).abort()  # a client that leaves at once
            assert worker.num_waiting == 0
        held.let_every_step_run()
        assert await finish(last) is FinishReason.LENGTH
        for i in range(3):  # idle, and stays so: each of these is taken at once
            assert worker.num_waiting == 0
            assert await finish(engine.submit("tiny", request(f"next{i}", max_tokens=1))) is FinishReason.LENGTH
    finally:
        held.let_every_step_run()
        await engine.unload_model("tiny", close_backend=False)


async def test_a_waiting_request_that_leaves_frees_its_place_at_once(one_slot: LlamaCppBackend) -> None:
    """One slot, a queue of one: b waits (a schedule() left it waiting), c is
    refused; b leaves, and c is taken while the step thread is still inside
    a step (it applies the abort only after it). When the model is idle
    again, the queue is empty."""
    held = HeldBackend(one_slot)
    engine = Engine(EngineConfig(max_queue=1))
    engine.add_model("tiny", held)
    worker = engine._model("tiny").worker
    try:
        a = engine.submit("tiny", request("a", max_tokens=3))
        assert held.entered.wait(30)
        b = engine.submit("tiny", request("b", max_tokens=2))
        held.let_one_step_run()
        assert held.entered.wait(30)  # the step after b was taken in: a runs, b was left waiting
        assert worker.scheduler.num_running == 1 and worker.scheduler.num_waiting == 1
        with pytest.raises(QueueFullError):
            engine.submit("tiny", request("c", max_tokens=2))
        b.abort()
        c = engine.submit("tiny", request("c", max_tokens=2))
        with pytest.raises(QueueFullError):  # c waits now
            engine.submit("tiny", request("d", max_tokens=2))
        held.let_every_step_run()
        assert await finish(a) is FinishReason.LENGTH and await finish(c) is FinishReason.LENGTH
        assert worker.num_waiting == 0
        assert await finish(engine.submit("tiny", request("d", max_tokens=2))) is FinishReason.LENGTH
    finally:
        held.let_every_step_run()
        await engine.unload_model("tiny", close_backend=False)


async def test_clients_that_leave_at_once_never_fill_an_idle_models_queue(one_slot: LlamaCppBackend) -> None:
    """The symptom of bbdd87d, as a server met it: on an idle model, requests
    whose clients left at once (request and abort reach the step thread in
    one drain) made every later request a 503, for good."""
    engine = Engine(EngineConfig(max_queue=1))
    engine.add_model("tiny", one_slot)
    try:
        for i in range(4):
            engine.submit("tiny", request(f"gone{i}")).abort()
            await asyncio.sleep(0.05)  # the step thread takes both in, and waits again
        for i in range(2):
            await asyncio.sleep(0.2)
            assert await finish(engine.submit("tiny", request(f"next{i}", max_tokens=1))) is FinishReason.LENGTH
    finally:
        await engine.unload_model("tiny", close_backend=False)
