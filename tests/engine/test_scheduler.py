"""The scheduler, stepped synchronously against a scripted backend.

Every step also checks (in `Driver`/`ScriptedBackend`) the token budget, the
slot count, contiguous positions and that the scheduler's KV instructions
leave each slot holding exactly the sequence's computed tokens.
"""

from __future__ import annotations

import math

import pytest

from localserve.engine.step.batch_policy import BatchPolicy
from localserve.engine.step.scheduler import SchedulerConfig
from localserve.engine.step.sequence import SeqStatus
from localserve.engine.types import FinishReason, KvOp, KvOpKind, StepPlan

from .scripted import (
    EOS,
    Driver,
    StepCost,
    hashed_next_token,
    linear_cost,
    make_capacity,
    prompt,
    run_alone,
    scripted_outputs,
)

# ---- budget, decode first, chunked prefill, slots ----------------------------


def test_token_budget_is_respected_and_filled():
    driver = Driver(make_capacity(num_slots=4, step_tokens=8))
    for i, length in enumerate([5, 12, 20, 7, 30, 3]):
        driver.add(f"r{i}", prompt(100 * i, length), max_tokens=6)
    driver.run()
    sizes = [batch.num_tokens for batch in driver.batches]
    assert max(sizes) == 8  # full steps happen ...
    assert all(size <= 8 for size in sizes)  # ... and none goes over
    assert all(driver.records[f"r{i}"].last.num_output_tokens == 6 for i in range(6))


def test_running_decodes_come_first_and_prefill_fills_the_rest():
    driver = Driver(make_capacity(num_slots=4, step_tokens=5))
    driver.add("a", prompt(0, 4), max_tokens=40)
    driver.add("b", prompt(50, 1), max_tokens=40)
    driver.step()
    driver.add("long", prompt(100, 20), max_tokens=2)
    batch = driver.step()
    decodes = [c for c in batch.chunks if driver.is_decode(c)]
    assert len(decodes) == 2  # both running sequences decode ...
    assert batch.chunks[:2] == tuple(decodes)  # ... before the new prompt ...
    assert driver.chunk(batch, "long").token_ids == tuple(prompt(100, 3))  # ... which gets the rest


def test_a_prompt_being_chunked_never_stalls_running_decodes():
    # "urgent" outranks "a" and "b", yet its later prompt chunks must not take
    # the whole budget: no prefill-only steps while others are decoding.
    driver = Driver(make_capacity(num_slots=4, step_tokens=4))
    driver.add("a", prompt(0, 3), max_tokens=30)
    driver.add("b", prompt(50, 1), max_tokens=30)
    driver.step()
    driver.add("urgent", prompt(100, 24), priority=0.0, max_tokens=2)
    for _ in range(12):  # 24 prompt tokens, 2 per step next to the two decodes
        batch = driver.step()
        assert driver.chunk(batch, "a") is not None and driver.chunk(batch, "b") is not None
        assert len(driver.chunk(batch, "urgent").token_ids) == 2
    assert driver.records["urgent"].token_ids == run_alone(prompt(100, 24), max_tokens=2)[:1]


def test_long_prompt_is_prefilled_in_contiguous_chunks_and_sampled_once():
    driver = Driver(make_capacity(step_tokens=8))
    driver.add("long", prompt(0, 30), max_tokens=3)
    chunks = [driver.chunk(driver.step(), "long") for _ in range(4)]
    assert [c.start_pos for c in chunks] == [0, 8, 16, 24]
    assert [len(c.token_ids) for c in chunks] == [8, 8, 8, 6]
    assert [c.sample for c in chunks] == [False, False, False, True]
    assert len(driver.records["long"].events) == 1  # the first token came after the last chunk
    driver.run()
    assert driver.records["long"].token_ids == run_alone(prompt(0, 30), max_tokens=3)


def test_max_num_seqs_caps_running_sequences():
    driver = Driver(make_capacity(num_slots=2, step_tokens=64))
    for i in range(5):
        driver.add(f"r{i}", prompt(10 * i, 4), max_tokens=3)
    num_running = []
    for batch in driver.steps():
        num_running.append(len(batch.chunks))
        assert driver.scheduler.num_running <= 2
    assert max(num_running) == 2
    assert all(driver.records[f"r{i}"].finished for i in range(5))


def first_step(driver: Driver, request_id: str) -> int:
    return next(i for i, b in enumerate(driver.batches) if driver.chunk(b, request_id) is not None)


def test_lower_priority_number_is_admitted_first():
    driver = Driver(make_capacity(num_slots=1))
    for request_id, priority in [("batch", 2.0), ("default", 1.0), ("interactive", 0.0)]:
        driver.add(request_id, prompt(0, 4), priority=priority, max_tokens=3)
    driver.run()
    order = sorted(["batch", "default", "interactive"], key=lambda r: first_step(driver, r))
    assert order == ["interactive", "default", "batch"]
    assert driver.scheduler.counters.num_preemptions == 0


# ---- batch work: alone, shared, admitted by predicted step time ---------------

# A CPU-like step: 20 ms fixed, 0.5 ms a token, 1.5 ms a sequence (a decode adds 2 ms).
CPU = linear_cost(0.020, 0.0005, 0.0015)
# A GPU-like step: the same fixed cost; tokens and sequences almost free.
GPU = linear_cost(0.020, 0.00001, 0.00001)


def batch_driver(cost: StepCost, num_batch: int, max_tokens: int = 100, **config: float) -> Driver:
    """8 slots (one reserved), `num_batch` batch requests of 4-token prompts, running alone."""
    capacity = make_capacity(num_slots=8, step_tokens=64, kv_size=8 * 512, n_ctx=512)
    driver = Driver(capacity, config=SchedulerConfig(reserved_slots=1, **config), step_cost=cost)  # type: ignore[arg-type]
    for i in range(num_batch):
        driver.add(f"b{i}", prompt(100 * i, 4), priority=2.0, max_tokens=max_tokens)
    return driver


def batch_in(driver: Driver, batch: StepPlan) -> set[str]:
    """Request ids of the batch sequences (b*) a step computes."""
    in_step = {c.seq_id for c in batch.chunks}
    return {r for r, seq_id in driver.seq_ids.items() if r.startswith("b") and seq_id in in_step}


def test_batch_work_alone_takes_the_reserved_slot_and_gives_it_back_at_once():
    driver = batch_driver(CPU, num_batch=9)
    for _ in range(5):
        assert len(driver.step().chunks) == 8  # every slot, the reserved one too
    assert driver.scheduler.policy.snapshot().lent_slots == 1
    driver.add("chat", prompt(5000, 10), priority=0.0, max_tokens=3)
    batch = driver.step()
    assert [c.seq_id for c in batch.chunks] == [driver.seq_ids["chat"]]  # at once, and its prompt's step alone
    assert "b7" not in driver.running_request_ids()  # the youngest batch sequence gave the slot back
    assert driver.scheduler.counters.num_preemptions == driver.scheduler.policy.num_slots_returned == 1
    assert driver.scheduler.policy.snapshot().lent_slots == 0
    driver.run()
    assert driver.records["chat"].token_ids == run_alone(prompt(5000, 10), max_tokens=3)
    # b7 resumed from its tokens, unchanged
    assert all(driver.records[f"b{i}"].token_ids == run_alone(prompt(100 * i, 4), max_tokens=100) for i in range(9))


def test_beside_interactive_decodes_batch_decodes_fill_the_inter_token_target():
    driver = batch_driver(CPU, num_batch=8)
    for _ in range(5):
        driver.step()
    driver.add("late", prompt(900, 20), priority=2.0, max_tokens=3)  # a batch prompt that also waits
    driver.add("chat", prompt(5000, 10), priority=0.0, max_tokens=12)
    assert [c.seq_id for c in driver.step().chunks] == [driver.seq_ids["chat"]]
    for _ in range(10):
        batch = driver.step()
        # The chat decode alone: 22 ms; within 1.2x that, 26.4 ms, two batch decodes of 2 ms fit.
        assert driver.chunk(batch, "chat") is not None and batch_in(driver, batch) == {"b0", "b1"}
        assert CPU(batch.num_tokens, len(batch.chunks)) <= 1.2 * CPU(1, 1)
    assert driver.scheduler.policy.snapshot().batch_held_back == 7  # b2..b6 running, b7 and "late" waiting
    driver.run()
    assert driver.records["chat"].token_ids == run_alone(prompt(5000, 10), max_tokens=12)
    assert driver.records["late"].token_ids == run_alone(prompt(900, 20), max_tokens=3)


def test_where_a_sequence_costs_almost_nothing_batch_work_stays_wide():
    driver = batch_driver(GPU, num_batch=7)
    for _ in range(5):
        driver.step()
    driver.add("chat", prompt(5000, 10), priority=0.0, max_tokens=12)
    driver.step()  # the chat prompt's step, alone
    for _ in range(10):
        batch = driver.step()
        assert driver.chunk(batch, "chat") is not None and len(batch_in(driver, batch)) == 7
        assert GPU(batch.num_tokens, len(batch.chunks)) <= 1.2 * GPU(1, 1)


def test_batch_prompt_chunks_share_a_step_only_up_to_the_target():
    driver = batch_driver(CPU, num_batch=2)
    driver.run()  # the step-time model has seen steps of one and two sequences
    driver.add("chat", prompt(5000, 10), priority=0.0, max_tokens=30)
    driver.step()
    driver.add("b-long", prompt(1000, 40), priority=2.0, max_tokens=2)
    sizes = []
    while not driver.records["b-long"].events:  # its prompt, chunk by chunk
        batch = driver.step()
        assert driver.chunk(batch, "chat") is not None
        assert CPU(batch.num_tokens, len(batch.chunks)) <= 1.2 * CPU(1, 1) + 1e-9
        sizes.append(len(driver.chunk(batch, "b-long").token_ids))
    # Beside the chat decode (22 ms), a chunk of n tokens adds 1.5 + 0.5 n ms: n = 5 keeps 26.4 ms.
    assert sizes == [5] * 8
    driver.run()
    assert driver.records["b-long"].token_ids == run_alone(prompt(1000, 40), max_tokens=2)


def test_batch_work_alone_takes_the_whole_budget_for_its_prompts():
    driver = batch_driver(CPU, num_batch=0)
    driver.add("b-long", prompt(0, 100), priority=2.0, max_tokens=2)
    driver.add("b-other", prompt(500, 30), priority=2.0, max_tokens=2)
    batch = driver.step()
    assert batch.num_tokens == 64 and len(driver.chunk(batch, "b-long").token_ids) == 64
    batch = driver.step()
    assert batch.num_tokens == 64  # the rest of b-long (36), then b-other's first 28


def test_after_other_work_batch_work_stays_shared_for_a_while_then_widens():
    driver = batch_driver(CPU, num_batch=8, max_tokens=300, max_quiet_s=1.0)
    for _ in range(5):
        driver.step()
    driver.add("chat", prompt(5000, 10), priority=0.0, max_tokens=3)
    while not driver.records["chat"].finished:
        driver.step()
    chat_done = driver.clock.now
    widths: list[tuple[float, int]] = []
    while driver.clock.now < chat_done + 2.0:
        scheduled_at = driver.clock.now
        widths.append((scheduled_at - chat_done, len(batch_in(driver, driver.step()))))
    # Shared: an interactive request arriving mid-step waits for it, so a batch step
    # is kept within half its prompt's step alone (10 tokens: 26.5 ms) past the
    # fixed 20 ms: six decodes of 2 ms. One arrival, so quiet after max_quiet_s.
    assert {n for t, n in widths if t < 1.0 - 0.05} == {6}
    assert {n for t, n in widths if t > 1.0 + 0.05} == {8}  # alone: every slot again


def test_a_steady_stream_of_arrivals_keeps_batch_work_shared_for_three_gaps():
    policy = BatchPolicy(SchedulerConfig(quiet_gaps=3.0, max_quiet_s=30.0))
    assert policy.quiet_s() == 30.0  # one request is not a stream yet
    for t in (0.0, 1.0, 2.0, 3.0):
        policy.note_arrival(t)
    assert policy.quiet_s() == pytest.approx(3.0)
    assert not policy.update_mode(others_present=True, now=10.0)
    assert not policy.update_mode(others_present=False, now=12.9)
    assert policy.update_mode(others_present=False, now=13.0)
    policy.note_arrival(3600.0)  # a long pause: the mean gap grows, by at most max_quiet_s a gap
    assert 3.0 < policy.quiet_s() < 30.0


def test_the_policy_snapshot_shows_what_it_did_and_the_model_against_the_measured_step():
    driver = batch_driver(CPU, num_batch=8)
    for _ in range(5):
        driver.step()
    driver.add("chat", prompt(5000, 10), priority=0.0, max_tokens=12)
    for _ in range(4):
        batch = driver.step()
    snap = driver.scheduler.policy.snapshot()
    assert snap.mode == "shared" and snap.lent_slots == 0 and snap.num_slots_returned == 1
    assert (snap.batch_in_step, snap.batch_held_back) == (2, 6)
    assert snap.measured_step_s == pytest.approx(CPU(batch.num_tokens, len(batch.chunks)), abs=1e-6)
    assert snap.predicted_step_s == pytest.approx(snap.measured_step_s, abs=1e-5)  # the cost is linear
    fitted = (snap.step_fixed_s, snap.step_per_token_s, snap.step_per_seq_s)
    assert fitted == pytest.approx((0.020, 0.0005, 0.0015), abs=1e-5)
    assert snap.step_limit_s == pytest.approx(1.2 * CPU(1, 1), abs=1e-5)
    assert snap.num_steps_observed == 9


def test_aged_batch_work_keeps_its_step_beside_an_interactive_prompt():
    config = SchedulerConfig(reserved_slots=1, aging_s=10.0)
    driver = Driver(make_capacity(num_slots=4, step_tokens=64), config=config)
    driver.add("old", prompt(0, 4), priority=2.0, max_tokens=60)
    for _ in range(25):  # 25 s: its deadline (t0 + 20 s) is now earlier than a new interactive one
        driver.step()
    driver.add("chat", prompt(5000, 10), priority=0.0, max_tokens=3)
    batch = driver.step()
    assert driver.chunk(batch, "old") is not None and driver.chunk(batch, "chat") is not None


def test_default_reservation_is_an_eighth_of_the_slots_and_never_all():
    from localserve.engine.step.scheduler import reserved_slots

    assert [reserved_slots(SchedulerConfig(), n) for n in (1, 4, 8, 16, 32)] == [0, 0, 1, 2, 4]
    assert reserved_slots(SchedulerConfig(reserved_slots=5), 4) == 3  # batch work always gets one slot


def test_an_interactive_prompt_is_not_queued_behind_a_batch_prompt_being_chunked():
    driver = Driver(make_capacity(num_slots=4, step_tokens=8), config=SchedulerConfig(reserved_slots=1))
    driver.add("batch", prompt(0, 40), priority=2.0, max_tokens=2)
    driver.step()  # the batch prompt's first chunk
    driver.add("chat", prompt(500, 6), priority=0.0, max_tokens=2)
    batch = driver.step()
    assert len(driver.chunk(batch, "chat").token_ids) == 6  # its whole prompt, first ...
    assert driver.chunk(batch, "batch") is None  # ... and alone: the batch prompt waits a step
    assert driver.chunk(driver.step(), "batch") is not None
    driver.run()
    assert driver.records["chat"].finish_time < driver.records["batch"].finish_time
    assert driver.records["batch"].token_ids == run_alone(prompt(0, 40), max_tokens=2)


# ---- aging ---------------------------------------------------------------------

INTERACTIVE_STEPS = 5  # a 4-token prompt and max_tokens=5 hold a slot for 5 steps
OVERLOAD_SLOTS = 2


def finish_time_under_overload(aging_s: float, duration_s: float) -> float | None:
    """One priority-0 arrival per step (2.5x what two slots serve) and one
    priority-2 request at t=3. When does the priority-2 one finish?"""
    driver = Driver(make_capacity(num_slots=OVERLOAD_SLOTS), config=SchedulerConfig(aging_s=aging_s))
    for i in range(int(duration_s)):
        driver.add(f"i{i}", prompt(1000 + 10 * i, 4), priority=0.0, max_tokens=INTERACTIVE_STEPS)
        if i == 3:
            driver.add("batch", prompt(0, 4), priority=2.0, max_tokens=INTERACTIVE_STEPS)
        driver.step()
    return driver.records["batch"].finish_time


def stated_worst_case_finish(aging_s: float, priority: float = 2.0, arrival: float = 3.0) -> float:
    """The scheduler docstring's bound: (p - p_min) * aging_s, plus the service
    time of the requests that arrived before that moment (spread over the
    slots), plus the request's own service time."""
    num_ahead = math.ceil(arrival + priority * aging_s)  # priority-0 arrivals at t=0,1,2,... before then
    service_ahead = math.ceil(num_ahead / OVERLOAD_SLOTS) * INTERACTIVE_STEPS
    return arrival + priority * aging_s + service_ahead + INTERACTIVE_STEPS


def test_aging_bounds_the_wait_under_a_stream_of_higher_priority():
    bound = stated_worst_case_finish(aging_s=10.0)
    finished_at = finish_time_under_overload(aging_s=10.0, duration_s=bound + 10)
    assert finished_at is not None and finished_at <= bound


def test_without_aging_the_same_stream_starves_it():
    bound = stated_worst_case_finish(aging_s=10.0)
    assert finish_time_under_overload(aging_s=1e6, duration_s=bound + 10) is None


# ---- preemption and abort ----------------------------------------------------


def test_higher_priority_preempts_and_the_preempted_one_resumes_unchanged():
    driver = Driver(make_capacity(num_slots=1))
    driver.add("low", prompt(0, 6), priority=2.0, max_tokens=10)
    for _ in range(3):
        driver.step()
    driver.add("high", prompt(100, 5), priority=0.0, max_tokens=4)
    batch = driver.step()
    assert driver.chunk(batch, "low") is None and driver.chunk(batch, "high") is not None
    assert driver.running_request_ids() == {"high"}
    driver.run()
    assert driver.scheduler.counters.num_preemptions == 1
    assert driver.records["high"].finish_time < driver.records["low"].finish_time
    assert driver.records["low"].token_ids == run_alone(prompt(0, 6), max_tokens=10)
    assert driver.records["high"].token_ids == run_alone(prompt(100, 5), max_tokens=4)


def test_no_ping_pong_when_the_preempted_request_has_waited_long():
    # "low" waits 60 s behind "high"; its age never lets it take the slot back.
    driver = Driver(make_capacity(num_slots=1), config=SchedulerConfig(aging_s=10.0))
    driver.add("low", prompt(0, 4), priority=2.0, max_tokens=5)
    driver.step()
    driver.add("high", prompt(100, 4), priority=1.0, max_tokens=60)
    driver.run()
    high_steps = [i for i, b in enumerate(driver.batches) if driver.chunk(b, "high") is not None]
    assert high_steps == list(range(high_steps[0], high_steps[0] + 60))  # never interrupted
    assert driver.scheduler.counters.num_preemptions == 1
    assert driver.records["low"].token_ids == run_alone(prompt(0, 4), max_tokens=5)


def test_a_small_priority_lead_does_not_preempt():
    driver = Driver(make_capacity(num_slots=1), config=SchedulerConfig(aging_s=10.0, preempt_margin=0.5))
    driver.add("first", prompt(0, 4), priority=1.0, max_tokens=5)
    driver.step()
    driver.add("second", prompt(100, 4), priority=0.7, max_tokens=5)  # deadline 8 s vs 10 s: 0.2 levels
    driver.run()
    assert driver.scheduler.counters.num_preemptions == 0


def test_abort_frees_the_slot_for_the_next_schedule():
    driver = Driver(make_capacity(num_slots=1))
    driver.add("a", prompt(0, 4), max_tokens=50)
    driver.add("b", prompt(100, 4), max_tokens=3)
    driver.step()
    assert driver.abort("a").finish_reason is FinishReason.ABORT
    assert driver.abort("a") is None  # already gone
    batch = driver.step()
    assert [c.seq_id for c in batch.chunks] == [driver.seq_ids["b"]]
    assert driver.seq_ids["a"] in batch.released_seq_ids


def test_the_queue_is_what_a_schedule_left_waiting():
    """The queue limit's counts: a new request waits for the next schedule()
    (it may find a free slot); one that a schedule() left waiting (no slot,
    preempted) is held until it runs or leaves."""
    driver = Driver(make_capacity(num_slots=1))
    driver.add("a", prompt(0, 4), max_tokens=50)
    driver.add("b", prompt(100, 4), max_tokens=3)
    queue = driver.scheduler
    assert (queue.num_new, queue.num_held) == (2, 0)
    driver.step()
    assert (queue.num_new, queue.num_held) == (0, 1)  # b: no slot
    driver.add("c", prompt(200, 4), max_tokens=3)
    driver.add("d", prompt(300, 4), max_tokens=3)
    driver.abort("c")
    assert (queue.num_new, queue.num_held) == (1, 1)
    driver.abort("b")
    assert (queue.num_new, queue.num_held) == (1, 0)
    driver.add("urgent", prompt(400, 4), priority=0.0, max_tokens=3)
    driver.step()
    assert driver.running_request_ids() == {"urgent"}  # a was preempted: it waits again, with d
    assert (queue.num_new, queue.num_held) == (0, 2)


# ---- prefix cache --------------------------------------------------------------

SHARED = prompt(0, 40)


def test_prefix_of_a_finished_request_is_reused():
    driver = Driver(make_capacity(num_slots=2))
    driver.add("first", SHARED + [500, 501], max_tokens=3)
    driver.run()
    prefill_before = driver.scheduler.counters.num_prefill_tokens
    driver.add("second", SHARED + [600, 601, 602], max_tokens=3)
    batch = driver.step()
    chunk = driver.chunk(batch, "second")
    assert chunk.start_pos == 40 and len(chunk.token_ids) == 3
    assert KvOp("keep", chunk.slot, 40) in batch.kv_ops
    driver.run()
    assert driver.records["second"].last.num_cached_tokens == 40
    assert driver.scheduler.counters.num_prefill_tokens - prefill_before == 3
    assert driver.records["second"].token_ids == run_alone(SHARED + [600, 601, 602], max_tokens=3)


def test_prefix_of_a_running_request_is_copied():
    driver = Driver(make_capacity(num_slots=2))
    driver.add("running", SHARED + [500], max_tokens=20)
    driver.step()
    driver.add("second", SHARED + [600, 601], max_tokens=3)
    batch = driver.step()
    chunk = driver.chunk(batch, "second")
    source = driver.chunk(batch, "running").slot
    assert KvOp("copy", chunk.slot, 40, src=source) in batch.kv_ops
    assert chunk.start_pos == 40
    driver.run()
    assert driver.records["second"].last.num_cached_tokens == 40
    assert driver.records["second"].token_ids == run_alone(SHARED + [600, 601], max_tokens=3)
    assert driver.records["running"].token_ids == run_alone(SHARED + [500], max_tokens=20)


def busy_slots_after_waves(slot_streams: bool) -> list[list[int]]:
    """Two warm-up requests, then waves of 8 on 16 slots (bench/peers.py's 8 streams): the busy slots of each wave."""
    driver = Driver(make_capacity(num_slots=16, step_tokens=512, kv_size=16 * 128, slot_streams=slot_streams))
    for i in range(2):
        driver.add(f"warm{i}", prompt(1000 + 50 * i, 20), max_tokens=4)
        driver.run()
    waves = []
    for wave in range(3):
        for i in range(8):
            driver.add(f"w{wave}-{i}", prompt(2000 + 100 * (8 * wave + i), 30), max_tokens=6)
        batch = driver.step()
        waves.append(sorted(chunk.slot for chunk in batch.chunks))
        driver.run()
    return waves


def test_with_a_kv_stream_per_slot_busy_slots_stay_in_one_run():
    """llama.cpp computes each run of consecutive busy slots (KV streams) in
    a pass of its own: new sequences take the lowest free slots, so 8 streams
    on 16 slots stay in one run. Taking empty slots first, as a shared pool
    does (nothing to pack there), scatters them."""
    assert busy_slots_after_waves(slot_streams=True) == [list(range(8))] * 3
    scattered = busy_slots_after_waves(slot_streams=False)
    assert any(slots != list(range(slots[0], slots[0] + 8)) for slots in scattered), scattered


def test_with_a_kv_stream_per_slot_a_long_shared_prefix_still_wins_a_slot_out_of_the_run():
    capacity = make_capacity(num_slots=4, step_tokens=256, kv_size=4 * 256, n_ctx=256, slot_streams=True)
    long_prefix, short_prefix = prompt(0, 100), prompt(500, 20)
    driver = Driver(capacity)
    for name, tokens in (("a", prompt(300, 10)), ("b", prompt(400, 10)), ("c", long_prefix), ("d", short_prefix)):
        driver.add(name, tokens, max_tokens=3)
    driver.run()
    slot_of = {name: driver.batches[0].chunks[i].slot for i, name in enumerate("abcd")}
    assert list(slot_of.values()) == [0, 1, 2, 3]
    driver.add("e", long_prefix + [7, 8], max_tokens=3)  # 100 tokens in slot 2: worth a gap
    driver.add("f", short_prefix + [9], max_tokens=3)  # 20 tokens in slot 3: not worth one
    batch = driver.step()
    assert driver.chunk(batch, "e").slot == 2 and driver.chunk(batch, "e").start_pos == 100
    assert driver.chunk(batch, "f").slot == 0
    driver.run()
    assert driver.records["e"].token_ids == run_alone(long_prefix + [7, 8], max_tokens=3)


def test_preempted_request_resumes_from_the_prefix_left_in_its_slot():
    driver = Driver(make_capacity(num_slots=1))
    driver.add("low", SHARED + [500], priority=2.0, max_tokens=6)
    driver.step()
    driver.add("high", SHARED + [600], priority=0.0, max_tokens=3)
    assert driver.chunk(driver.step(), "high").start_pos == 40  # took the slot, kept the prefix
    for _ in range(2):  # the rest of high's three tokens
        driver.step()
    assert driver.records["high"].finished
    resumed = driver.chunk(driver.step(), "low")
    assert resumed.start_pos == 40 and resumed.token_ids[:1] == (500,)
    driver.run()
    assert driver.records["low"].token_ids == run_alone(SHARED + [500], max_tokens=6)


def test_without_prefix_cache_nothing_is_reused():
    driver = Driver(make_capacity(num_slots=2), config=SchedulerConfig(enable_prefix_cache=False))
    driver.add("first", SHARED + [500], max_tokens=3)
    driver.run()
    driver.add("second", SHARED + [600], max_tokens=3)
    driver.run()
    assert driver.records["second"].last.num_cached_tokens == 0


def test_a_request_without_cache_prompt_computes_its_whole_prompt():
    """llama-server's `cache_prompt: false`: no prefix reused, neither a
    finished request's in a free slot nor a running one's; the next request
    that allows it reuses as before."""
    driver = Driver(make_capacity(num_slots=3))
    driver.add("first", SHARED + [500], max_tokens=3)
    driver.run()
    driver.add("running", SHARED + [501], max_tokens=20)
    driver.step()
    driver.add("whole", SHARED + [600], max_tokens=3, cache_prompt=False)
    batch = driver.step()
    chunk = driver.chunk(batch, "whole")
    assert chunk.start_pos == 0 and len(chunk.token_ids) == 41
    assert not [op for op in batch.kv_ops if op.kind == KvOpKind.COPY]
    driver.run()
    assert driver.records["whole"].last.num_cached_tokens == 0
    assert driver.records["whole"].token_ids == run_alone(SHARED + [600], max_tokens=3)
    driver.add("cached", SHARED + [600], max_tokens=3)
    driver.run()
    assert driver.records["cached"].last.num_cached_tokens == 40  # all but the last token, which gives logits


# ---- KV exhaustion -------------------------------------------------------------


def run_counting_preemptions_mid_prompt(driver: Driver) -> int:
    """Runs to the end; counts preemptions of sequences that had not finished
    computing their prompt yet (work thrown away before it paid off)."""
    count = 0
    prefilling = preemptions_of_prefilling(driver)
    for _ in driver.steps():
        now = {s.seq_id: s.num_preemptions for s in driver.scheduler.sequences()}
        count += sum(1 for seq_id, n in prefilling.items() if now.get(seq_id, n) > n)
        prefilling = preemptions_of_prefilling(driver)
    return count


def preemptions_of_prefilling(driver: Driver) -> dict[int, int]:
    """num_preemptions by seq_id of running sequences still computing a prompt."""
    return {
        s.seq_id: s.num_preemptions
        for s in driver.scheduler.sequences()
        if s.status is SeqStatus.RUNNING and s.num_tokens - s.num_computed_tokens > 1
    }


def test_kv_exhaustion_preempts_and_never_truncates():
    # Four requests grow to 27 cells each; the cache holds 40.
    driver = Driver(make_capacity(num_slots=4, step_tokens=16, kv_size=40, n_ctx=40))
    for i in range(4):
        driver.clock.advance(0.1)
        driver.add(f"r{i}", prompt(100 * i, 8), max_tokens=20)
    assert run_counting_preemptions_mid_prompt(driver) == 0  # no thrashing
    assert driver.scheduler.counters.num_preemptions > 0
    for i in range(4):
        record = driver.records[f"r{i}"]
        assert record.last.finish_reason is FinishReason.LENGTH
        assert record.token_ids == run_alone(prompt(100 * i, 8), max_tokens=20)


def test_kv_exhaustion_with_simultaneous_arrivals_evicts_the_latest():
    # Equal deadlines: the tie is broken by arrival order, as everywhere else.
    driver = Driver(make_capacity(num_slots=2, step_tokens=16, kv_size=24, n_ctx=24))
    driver.add("first", prompt(0, 6), max_tokens=14)
    driver.add("second", prompt(100, 6), max_tokens=14)
    driver.run()
    assert driver.records["first"].finish_time < driver.records["second"].finish_time
    assert driver.records["second"].token_ids == run_alone(prompt(100, 6), max_tokens=14)


# ---- stop conditions -----------------------------------------------------------


def run_one(next_token=hashed_next_token, capacity=None, num_prompt_tokens: int = 4, **sampling):  # type: ignore[no-untyped-def]
    driver = Driver(capacity or make_capacity(), next_token=next_token)
    driver.add("r", prompt(0, num_prompt_tokens), **sampling)
    driver.run()
    return driver.records["r"]


def test_eos_stops_without_emitting_it():
    record = run_one(scripted_outputs(4, [5, 6, 7, EOS]), max_tokens=50)
    assert record.token_ids == [5, 6, 7]
    assert record.text == "t5 t6 t7 "
    assert record.last.finish_reason is FinishReason.STOP
    assert record.last.num_output_tokens == 4  # EOS counts as generated


def test_ignore_eos_keeps_going():
    record = run_one(scripted_outputs(4, [5, EOS, 7]), max_tokens=3, ignore_eos=True)
    assert record.token_ids == [5, EOS, 7]
    assert record.last.finish_reason is FinishReason.LENGTH


def test_stop_token_id_stops_without_emitting_it():
    record = run_one(scripted_outputs(4, [5, 6, 7, 8]), max_tokens=50, stop_token_ids=(7,))
    assert record.token_ids == [5, 6]
    assert record.last.finish_reason is FinishReason.STOP


def test_max_tokens_ends_with_length():
    record = run_one(max_tokens=4)
    assert len(record.token_ids) == 4
    assert record.last.finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("stop", [{"stop_token_ids": (7,)}, {}])
def test_min_tokens_defers_eos_and_stop_ids(stop):
    always = 7 if stop else EOS
    record = run_one(lambda history: always, max_tokens=50, min_tokens=2, **stop)
    assert record.token_ids == [always, always]
    assert record.last.finish_reason is FinishReason.STOP


def test_stop_string_spanning_tokens_keeps_only_text_before_it():
    record = run_one(scripted_outputs(4, [5, 6, 7, 8, 9]), max_tokens=50, stop=("6 t7",))
    assert record.text == "t5 t"
    assert record.token_ids == [5, 6, 7]
    assert record.last.finish_reason is FinishReason.STOP


def test_partial_stop_string_is_released_when_the_sequence_ends():
    record = run_one(scripted_outputs(4, [5, 6, EOS]), max_tokens=50, stop=("6 t7",))
    assert record.text == "t5 t6 "
    assert [e.text for e in record.events] == ["t5 ", "t", "6 "]


def test_context_limit_ends_with_length():
    capacity = make_capacity(n_ctx=16, kv_size=64)
    record = run_one(capacity=capacity, num_prompt_tokens=10, max_tokens=100)
    assert len(record.token_ids) == 6
    assert record.last.finish_reason is FinishReason.LENGTH


# ---- add() validation ------------------------------------------------------------


def test_add_rejects_empty_prompt_long_prompt_and_duplicate_id():
    driver = Driver(make_capacity(n_ctx=16, kv_size=64))
    with pytest.raises(ValueError, match="empty"):
        driver.add("empty", [])
    with pytest.raises(ValueError, match="context"):
        driver.add("long", prompt(0, 16))
    driver.add("ok", prompt(0, 15), max_tokens=1)
    with pytest.raises(ValueError, match="already in use"):
        driver.add("ok", prompt(0, 3))
    assert driver.scheduler.num_waiting == 1


def test_a_step_of_only_batch_work_is_never_empty():
    """Shared mode after a tiny interactive prompt, on a machine where one batch
    token costs more than the limit that prompt implies (7 ms fixed, 5.8 ms a
    token, 4 ms a sequence: a 15.4 ms limit, a 16.8 ms decode). The step must
    still hold one batch token; an empty step failed every request in flight."""
    driver = batch_driver(linear_cost(0.007, 0.0058, 0.004), num_batch=3, max_tokens=40)
    for _ in range(3):
        driver.step()
    driver.add("chat", prompt(5000, 1), priority=0.0, max_tokens=2)
    while not driver.records["chat"].finished:
        assert driver.step().chunks
    assert not driver.scheduler.policy.alone  # still shared: the limit applies
    for _ in range(10):
        assert driver.step().chunks, "a step with batch work pending came out empty"
