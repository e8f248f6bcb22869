"""The real `Engine` and `StepWorker` (step thread, inbox, event dispatch,
stats) over the deterministic `FakeBackend`: admission, streaming,
cancellation, preemption, priorities and failed steps, without a model.

Tokens are checked against `scripted.run_alone`: the tokens a request gets
with the backend to itself, which sharing steps must never change."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.types import FinishReason, GenerateRequest, SamplingParams, TokenEvent
from localserve.errors import ContextLengthError, EngineStoppedError, QueueFullError
from tests.engine.fake_backend import FakeBackend
from tests.engine.scripted import EOS, make_capacity, prompt, run_alone, scripted_outputs, token_bytes

MODEL = "fake"


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    engine = Engine(EngineConfig(max_queue=4))
    yield engine
    await engine.close()


def add(engine: Engine, backend: FakeBackend | None = None) -> FakeBackend:
    backend = backend or FakeBackend()
    engine.add_model(MODEL, backend)
    return backend


def request(request_id: str, prompt_ids: list[int], max_tokens: int = 8, priority: float = 1.0) -> GenerateRequest:
    return GenerateRequest(request_id, prompt_ids, SamplingParams(max_tokens=max_tokens), priority)


async def collect(engine: Engine, req: GenerateRequest) -> list[TokenEvent]:
    return [event async for event in engine.submit(MODEL, req)]


def token_ids(events: list[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


async def until(predicate, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.005)


# ---- streaming -----------------------------------------------------------------------------


async def test_tokens_stream_in_order_and_end_at_max_tokens(engine: Engine) -> None:
    add(engine)
    events = await collect(engine, request("a", prompt(0, 6), max_tokens=7))
    assert token_ids(events) == run_alone(prompt(0, 6), max_tokens=7)
    assert len(events) > 1 and all(not e.finished for e in events[:-1])  # streamed, not one answer
    last = events[-1]
    assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == 7 and last.num_prompt_tokens == 6
    assert "".join(e.text for e in events) == b"".join(token_bytes(t) for t in token_ids(events)).decode()


async def test_an_end_of_generation_token_stops_the_request(engine: Engine) -> None:
    add(engine, FakeBackend(next_token=scripted_outputs(5, [11, 12, EOS])))
    events = await collect(engine, request("a", prompt(0, 5), max_tokens=20))
    assert events[-1].finish_reason is FinishReason.STOP
    assert token_ids(events)[:2] == [11, 12] and events[-1].num_output_tokens in (2, 3)
    assert "".join(e.text for e in events) == "t11 t12 "


async def test_concurrent_requests_share_steps_and_match_running_alone(engine: Engine) -> None:
    backend = add(engine)
    prompts = {f"r{i}": prompt(50 * i, 3 + i) for i in range(4)}
    results = await asyncio.gather(*(collect(engine, request(rid, p, max_tokens=6)) for rid, p in prompts.items()))
    for (rid, p), events in zip(prompts.items(), results, strict=True):
        assert token_ids(events) == run_alone(p, max_tokens=6), rid
    assert max(len(b.chunks) for b in backend.batches) > 1  # they were batched together
    stats = engine.stats()[MODEL]
    assert stats.total_output_tokens == 24 and stats.total_prompt_tokens == sum(map(len, prompts.values()))
    assert stats.scheduler.sequences == () and stats.in_flight == 0


# ---- admission -----------------------------------------------------------------------------


async def test_admission_refuses_what_can_never_run_and_a_full_queue(engine: Engine) -> None:
    backend = add(engine, FakeBackend(make_capacity(num_slots=1, n_ctx=32)))
    with pytest.raises(ContextLengthError):
        engine.submit(MODEL, request("long", prompt(0, 32)))
    backend.pause()
    running = asyncio.ensure_future(collect(engine, request("run", prompt(0, 4), max_tokens=3)))
    await asyncio.to_thread(backend.wait_for_steps, 1)  # "run" holds the only slot
    waiting = [asyncio.ensure_future(collect(engine, request(f"w{i}", prompt(9, 3), max_tokens=2))) for i in range(4)]
    await asyncio.sleep(0)
    with pytest.raises(QueueFullError):  # max_queue=4 wait already
        engine.submit(MODEL, request("one-too-many", prompt(0, 3)))
    backend.resume()
    for task in (running, *waiting):
        assert (await task)[-1].finish_reason is FinishReason.LENGTH


# ---- cancellation --------------------------------------------------------------------------


async def test_leaving_a_stream_aborts_the_request_and_frees_its_slot(engine: Engine) -> None:
    backend = add(engine, FakeBackend(make_capacity(num_slots=1)))
    backend.pause(from_step=3)  # the client leaves while the third step runs
    stream = engine.submit(MODEL, request("gone", prompt(0, 4), max_tokens=100))
    received = 0
    async for _ in stream:
        received += 1
        if received == 2:
            break
    # The abandoned generator is closed by the loop's finalizer hook, a task away.
    await until(lambda: engine.num_in_flight(MODEL) == 0)
    backend.resume()
    # The only slot is free again: the next request runs, and runs as if alone.
    events = await collect(engine, request("next", prompt(7, 4), max_tokens=5))
    assert token_ids(events) == run_alone(prompt(7, 4), max_tokens=5)
    gone_seq = backend.batches[0].chunks[0].seq_id
    assert gone_seq in backend.script.released_seq_ids  # its sampler state was dropped
    assert sum(1 for b in backend.batches for c in b.chunks if c.seq_id == gone_seq) <= 4  # aborted at a step boundary


async def test_abort_by_id_ends_the_stream_with_abort(engine: Engine) -> None:
    backend = add(engine)
    backend.pause()
    stream = engine.submit(MODEL, request("x", prompt(0, 4), max_tokens=50))
    await asyncio.to_thread(backend.wait_for_steps, 1)
    assert engine.abort("x") and not engine.abort("x")  # once only
    backend.resume()
    events = [e async for e in stream]
    assert events[-1].finish_reason is FinishReason.ABORT and events[-1].num_prompt_tokens == 4
    await until(lambda: engine.stats()[MODEL].scheduler.kv_used == 0 and backend.script.kv_used() == 0)


# ---- priorities and preemption -----------------------------------------------------------------


async def test_an_interactive_request_overtakes_waiting_batch_work(engine: Engine) -> None:
    backend = add(engine, FakeBackend(make_capacity(num_slots=1)))
    backend.pause()
    first = asyncio.ensure_future(collect(engine, request("first", prompt(0, 4), max_tokens=3, priority=1.0)))
    await asyncio.to_thread(backend.wait_for_steps, 1)
    finished: list[str] = []

    async def run(rid: str, priority: float) -> None:
        await collect(engine, request(rid, prompt(30, 4), max_tokens=3, priority=priority))
        finished.append(rid)

    # Submitted in this order while the step thread is held: the scheduler sees both at once.
    tasks = [asyncio.ensure_future(run("batch", 2.0)), asyncio.ensure_future(run("interactive", 0.0))]
    await asyncio.sleep(0.05)
    backend.resume()
    await asyncio.gather(first, *tasks)
    assert finished == ["interactive", "batch"]


async def test_a_higher_priority_request_preempts_and_the_other_resumes_unchanged(engine: Engine) -> None:
    backend = add(engine, FakeBackend(make_capacity(num_slots=1)))
    backend.pause(from_step=3)
    low = asyncio.ensure_future(collect(engine, request("low", prompt(0, 6), max_tokens=30, priority=2.0)))
    await asyncio.to_thread(backend.wait_for_steps, 3)  # "low" is decoding, held in its third step
    high_task = asyncio.ensure_future(collect(engine, request("high", prompt(100, 5), max_tokens=4, priority=0.0)))
    await asyncio.sleep(0.05)
    # "high": its prompt in step 4, three more tokens in steps 5-7; hold step 8.
    backend.resume(pause_at=8)
    high = await high_task
    assert not low.done()  # "high" took the slot "low" held and ran to its end first
    assert [len(b.chunks) for b in backend.batches[3:7]] == [1] * 4
    assert {b.chunks[0].seq_id for b in backend.batches[3:7]} != {backend.batches[0].chunks[0].seq_id}
    backend.resume()
    low_events = await low
    assert token_ids(high) == run_alone(prompt(100, 5), max_tokens=4)
    assert token_ids(low_events) == run_alone(prompt(0, 6), max_tokens=30)  # recomputed, not changed
    assert engine.stats()[MODEL].scheduler.num_preemptions == 1


# ---- failures --------------------------------------------------------------------------------


async def test_a_failed_step_fails_its_requests_and_the_worker_goes_on(engine: Engine) -> None:
    backend = add(engine)
    backend.pause()
    a = asyncio.ensure_future(collect(engine, request("a", prompt(0, 4), max_tokens=10)))
    await asyncio.to_thread(backend.wait_for_steps, 1)
    backend.fail_next_step(RuntimeError("device lost"))
    backend.resume()
    events = await a
    assert events[-1].finish_reason is FinishReason.ERROR
    assert "the backend failed in this step: device lost" in (events[-1].error or "")
    assert backend.cleared_slots  # the failed step's slots were emptied
    after = await collect(engine, request("b", prompt(0, 4), max_tokens=5))
    assert token_ids(after) == run_alone(prompt(0, 4), max_tokens=5)


async def test_a_crashed_step_loop_fails_every_request_and_refuses_new_ones(engine: Engine) -> None:
    backend = add(engine, FakeBackend(make_capacity(num_slots=1)))
    backend.pause()
    running = asyncio.ensure_future(collect(engine, request("run", prompt(0, 4), max_tokens=10)))
    await asyncio.to_thread(backend.wait_for_steps, 1)
    waiting = asyncio.ensure_future(collect(engine, request("wait", prompt(5, 4), max_tokens=10)))
    await asyncio.sleep(0.05)
    backend.fail_next_step(RuntimeError("step failed"))
    backend.fail_clear_slots = True  # the recovery fails too: the loop itself ends
    backend.resume()
    ran, waited = (await running)[-1], (await waiting)[-1]
    assert ran.finish_reason is waited.finish_reason is FinishReason.ERROR
    assert ran.error == "the backend failed in this step: step failed"
    assert waited.error == "the step loop crashed: clear_slots failed"  # still in the inbox when the loop ended
    with pytest.raises(EngineStoppedError):
        engine.submit(MODEL, request("late", prompt(0, 4)))


async def test_removing_a_model_ends_its_requests_and_closes_the_backend(engine: Engine) -> None:
    backend = add(engine)
    backend.pause()
    task = asyncio.ensure_future(collect(engine, request("a", prompt(0, 4), max_tokens=50)))
    await asyncio.to_thread(backend.wait_for_steps, 1)
    removal = asyncio.ensure_future(engine.unload_model(MODEL))
    await asyncio.sleep(0.05)
    backend.resume()
    await removal
    last = (await task)[-1]
    assert last.finish_reason is FinishReason.ERROR and "shutting down" in (last.error or "")
    assert backend.closed and not engine.has_model(MODEL)
