"""The token-level continuous-batching scheduler. Pure and synchronous: it
never touches a model and reads no clock while it plans a step, it only
decides what the next step computes and applies what the step did to the
sequences and slots. Its rules (one token budget, decode first, deadlines
and aging, preemption, batch work beside other work, reserved slots, the
prefix cache and KV room) are in docs/architecture.md, "Scheduler rules".
Beside it: `kv_slots` (slots, the prefix cache and its disk tier's
restores), `speculation.DraftPlanner` (drafts) and `output_processor` (text
and stops, which `update` applies).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable

from localserve.engine.step.batch_policy import BatchPolicy, StepGate, reserved_slots
from localserve.engine.step.counters import SchedulerCounters
from localserve.engine.step.kv_slots import DiskRestores, SlotTable, StepDraft
from localserve.engine.step.output_processor import OutputProcessor, ProcessedOutput, SeqOutput, token_event
from localserve.engine.step.prefix_disk import DiskPrefixStore
from localserve.engine.step.sequence import SeqStatus, Sequence, SequenceTable, Slot
from localserve.engine.step.speculation import DraftPlanner, kept_cells
from localserve.engine.types import (
    Capacity,
    FinishReason,
    GenerateRequest,
    SchedulerConfig,
    StepPlan,
    StepResult,
    TokenEvent,
)

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerCounters", "reserved_slots"]


class Scheduler:
    """Decides each step's batch and applies its results. See module docstring."""

    def __init__(
        self,
        capacity: Capacity,
        *,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        disk: DiskPrefixStore | None = None,
        output: OutputProcessor | None = None,
    ) -> None:
        if capacity.kv_size < capacity.n_ctx:
            raise ValueError("kv_size must hold at least one full context (n_ctx)")
        self.capacity = capacity
        self.config = config or SchedulerConfig()
        self.counters = SchedulerCounters()
        # Text and stops of what each step sampled (`update`); a model without
        # end-of-generation tokens or byte pieces by default (tests)
        self.output = output or OutputProcessor(eog_token_ids=(), token_bytes=_no_bytes, n_ctx=capacity.n_ctx)
        self._clock = clock
        self._slots = SlotTable(
            capacity.num_slots,
            enable_prefix_cache=self.config.enable_prefix_cache,
            disk=disk,
            packed=capacity.slot_streams,
        )
        self.disk = self._slots.disk
        self._restores = DiskRestores(self._slots)
        self._seqs = SequenceTable()
        self._step_ids = itertools.count()
        self._max_batch_seqs = capacity.num_slots - reserved_slots(self.config, capacity.num_slots)
        self.policy = BatchPolicy(self.config)
        self._now = clock()  # the time of the last add() or update(): schedule() reads no clock
        self._limit_after = math.inf  # batch work with a later deadline is limited in this step
        self._drafts = DraftPlanner(self.config, capacity)

    # ---- requests in and out -------------------------------------------------

    def add(self, request: GenerateRequest) -> None:
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise ValueError("the prompt is empty")
        if num_prompt >= self.capacity.n_ctx:
            raise ValueError(f"the prompt has {num_prompt} tokens; the context holds {self.capacity.n_ctx}")
        if request.request_id in self._seqs.by_request:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        now = self._now = self._clock()
        if request.priority < self.config.batch_priority:
            self.policy.note_arrival(now)
        seq = self._seqs.add(request, now, self.config.aging_s)
        # Its saved prefix, if the disk tier has a longer one than the slots,
        # is read ahead from now: schedule() takes it once it is in memory.
        self._restores.prefetch(seq, lambda: self.policy.model.coefficients[1])

    def abort(self, request_id: str) -> TokenEvent | None:
        """End a request now (between steps). Returns its final event, or None
        if it is unknown or already finished."""
        seq = self._seqs.by_request.get(request_id)
        if seq is None:
            return None
        self._now = self._clock()
        self._finish(seq, FinishReason.ABORT)
        return token_event(seq, seq.finish_reason)

    def has_work(self) -> bool:
        return bool(self._seqs.waiting or self._seqs.running)

    def has_ready_work(self) -> bool:
        """Work a step can do now: not only sequences that wait for their
        prefix to be read from disk (the reader wakes the step loop)."""
        return bool(self._seqs.running) or any(not s.reading for s in self._seqs.waiting)

    @property
    def num_waiting(self) -> int:
        return len(self._seqs.waiting)

    @property
    def num_new(self) -> int:
        """Waiting sequences added since the last schedule(), which may yet
        give them free slots."""
        return self._seqs.num_new

    @property
    def num_held(self) -> int:
        """Waiting sequences that a schedule() left waiting: for a slot, for
        KV room, by the batch rules or the token budget, or preempted. The
        queue, as the queue limit counts it."""
        return len(self._seqs.waiting) - self._seqs.num_new

    @property
    def num_running(self) -> int:
        return len(self._seqs.running)

    def sequences(self) -> list[Sequence]:
        """Unfinished sequences, running first (for stats; do not mutate)."""
        return self._seqs.running + self._seqs.waiting

    def kv_used(self) -> int:
        return self._slots.kv_used()

    # ---- one step ------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Choose the next step's KV edits and token chunks."""
        plan = StepDraft(self.capacity.step_tokens, self.kv_used())
        others = [s for s in itertools.chain(self._seqs.running, self._seqs.waiting) if not self._is_batch(s)]
        alone = self.policy.update_mode(bool(others), self._now)
        # Batch work that aging has put ahead of every other request is not limited.
        self._limit_after = math.inf if alone else min((s.deadline for s in others), default=self._now)
        prompt_work: list[Sequence] = []
        batch_decodes: list[Sequence] = []
        for seq in sorted(self._seqs.running, key=_decode_first):
            if seq.num_tokens - seq.num_computed_tokens > 1:
                prompt_work.append(seq)
            elif self._limited(seq):
                batch_decodes.append(seq)
            elif seq.status is SeqStatus.RUNNING:  # may have been preempted meanwhile
                self._schedule_running(seq, plan)
        others_decoding = any(not self._is_batch(s) for s in plan.scheduled)
        gate = self.policy.gate(plan.num_tokens, plan.num_seqs, others_decoding=others_decoding)
        # Running batch decodes go before new batch prompt work, so room is kept
        # for them; not when another request's prompt is due (they would sit out
        # its step), unless that prompt then finds no slot.
        prompt_due = any(not self._is_batch(s) for s in itertools.chain(prompt_work, self._seqs.waiting))
        num_kept = 0
        if not prompt_due:
            num_kept = min(gate.num_decodes(plan.num_tokens, plan.num_seqs, len(batch_decodes)), plan.budget)
        plan.budget -= num_kept
        others_prompting = self._schedule_prompt_work(prompt_work, plan, gate, num_kept)
        plan.budget += num_kept
        if not others_prompting:
            if prompt_due:
                num_kept = gate.num_decodes(plan.num_tokens, plan.num_seqs, len(batch_decodes))
            self._schedule_batch_decodes(batch_decodes, plan, num_kept)
        self._drafts.add_drafts(plan, lambda: self.policy.model.coefficients, self._limited)
        self._record_policy_step(plan)
        released = self._seqs.all_seen()
        return StepPlan(
            step_id=next(self._step_ids),
            kv_ops=tuple(plan.kv_ops),
            chunks=plan.chunks(),
            released_seq_ids=released,
        )

    def update(self, batch: StepPlan, result: StepResult) -> list[TokenEvent]:
        """Everything a step that ran changes, in order: the KV state
        (computed tokens, accepted drafts, the disk tier's restores), the
        output processor's verdict on what each sequence sampled (text and
        stops, `engine/step/output_processor.py`), the appends and ends it decides,
        and the step-time model (`result.seconds`, the worker's clock). A
        step whose backend raised (`result.error`) ends its sequences with
        that error. Returns the step's events."""
        if result.error is not None:
            return self.fail(batch, result.error)
        outputs = self._apply(batch, result)
        events = self._append_outputs(self.output.process(outputs))
        if result.seconds is not None:
            # what the step-time model, and so batch admission and the thread choice, learn from
            self.policy.observe_step(batch.num_tokens, len(batch.chunks), result.seconds)
            self._drafts.observe(batch, result)
        return events

    def _apply(self, batch: StepPlan, result: StepResult) -> list[SeqOutput]:
        """Apply a step's results to the KV state: advance computed tokens.
        Returns what each sequence sampled, or its error, for the output
        processor."""
        self._now = self._clock()
        outputs: list[SeqOutput] = []
        for chunk in batch.chunks:
            seq = self._seqs.by_seq_id.get(chunk.seq_id)
            self.counters.count_chunk(chunk, seq.num_prompt_tokens if seq is not None else None)
        self._restores.observe(batch, result)
        for chunk in batch.chunks:
            seq = self._seqs.by_seq_id.get(chunk.seq_id)
            if seq is None or seq.status is not SeqStatus.RUNNING:
                continue
            if chunk.slot in result.restore_failed:  # the slot is empty and the chunk was not computed
                seq.num_computed_tokens = 0
                continue
            accepted = result.accepted.get(chunk.seq_id, ())
            num_draft = chunk.num_draft + result.drafted.get(chunk.seq_id, 0)
            kept = kept_cells(chunk, result)
            seq.num_computed_tokens += len(kept)
            self._slots[chunk.slot].token_ids.extend(kept)
            if num_draft and seq.spec is not None:
                seq.spec.observe(num_draft, len(accepted))
                self.counters.num_draft_tokens += num_draft
                self.counters.num_accepted_tokens += len(accepted)
            if chunk.seq_id in result.failed:
                outputs.append(SeqOutput(seq, error=result.failed[chunk.seq_id]))
            elif chunk.sample:
                outputs.append(SeqOutput(seq, (result.sampled[chunk.seq_id], *accepted)))
        return outputs

    def _append_outputs(self, processed: Iterable[ProcessedOutput]) -> list[TokenEvent]:
        """Append the tokens the output processor kept and end the sequences
        a stop or an error ended. Returns the step's events."""
        events = []
        for output in processed:
            output.seq.token_ids.extend(output.token_ids)
            if output.finish_reason is not None:
                self._finish(output.seq, output.finish_reason)
            events.append(output.event)
        return events

    def fail(self, batch: StepPlan, message: str) -> list[TokenEvent]:
        """The step raised: end its sequences with an error, forget the KV of
        every slot it touched. Returns their final events; the engine must
        clear `touched_slots(batch)` in the backend."""
        events = []
        for chunk in batch.chunks:
            seq = self._seqs.by_seq_id.get(chunk.seq_id)
            if seq is not None and seq.status is SeqStatus.RUNNING:
                self._finish(seq, FinishReason.ERROR)
                events.append(token_event(seq, seq.finish_reason, error=message))
        for slot_id in self.touched_slots(batch):
            self._slots[slot_id].token_ids.clear()
        return events

    @staticmethod
    def touched_slots(batch: StepPlan) -> set[int]:
        return {c.slot for c in batch.chunks} | {op.slot for op in batch.kv_ops}

    # ---- internals -----------------------------------------------------------

    def _schedule_running(self, seq: Sequence, plan: StepDraft) -> None:
        num_new = min(seq.num_tokens - seq.num_computed_tokens, plan.budget)
        if num_new <= 0:
            return
        if not self._make_kv_room(num_new, plan, protect=seq):
            self._preempt(seq, plan, keep_cache=False)
            return
        plan.add(seq, num_new)

    def _is_batch(self, seq: Sequence) -> bool:
        return seq.priority >= self.config.batch_priority

    def _limited(self, seq: Sequence) -> bool:
        """Batch work held to the batch policy's limits in this step."""
        return self._is_batch(seq) and seq.deadline > self._limit_after

    def _may_admit(self, seq: Sequence) -> bool:
        """Reserved slots: batch work takes them only while it runs alone."""
        if not self._is_batch(seq) or self.policy.alone:
            return True
        return self._num_batch_running() < self._max_batch_seqs

    def _schedule_prompt_work(
        self, prompt_work: list[Sequence], plan: StepDraft, gate: StepGate, num_kept: int
    ) -> bool:
        """Prompt chunks of running sequences and admissions of waiting ones,
        earliest deadline first. Limited batch work takes what `gate` leaves
        beside the `num_kept` batch decodes still to come, and stays out of a
        step that computes another request's prompt. Returns whether this
        step computes one."""
        waiting = set(self._seqs.waiting)
        admitting, others_prompting = True, False
        for seq in sorted(prompt_work + self._seqs.waiting, key=_order):
            if plan.budget <= 0:
                break
            limited = self._limited(seq)
            if limited and others_prompting:
                continue  # that step is the other prompt's time to first token
            if seq in waiting and (seq.reading or not self._may_admit(seq)):
                continue  # its prefix is still being read from disk, or reserved slots
            room = gate.room(plan.num_tokens + num_kept, plan.num_seqs + num_kept) if limited else plan.budget
            if room <= 0:
                continue
            withheld = max(0, plan.budget - room)
            plan.budget -= withheld
            if seq not in waiting:
                if seq.status is SeqStatus.RUNNING:
                    self._schedule_running(seq, plan)
            elif admitting and seq.status is SeqStatus.WAITING:
                admitting = self._admit(seq, plan)
            plan.budget += withheld
            others_prompting = others_prompting or (not self._is_batch(seq) and seq in plan.scheduled)
        return others_prompting

    def _schedule_batch_decodes(self, batch_decodes: list[Sequence], plan: StepDraft, num_seqs: int) -> None:
        """The first `num_seqs` limited batch decodes, earliest deadline first."""
        for seq in batch_decodes:
            if num_seqs <= 0:
                break
            if seq.status is SeqStatus.RUNNING:
                self._schedule_running(seq, plan)
                num_seqs -= seq in plan.scheduled

    def _record_policy_step(self, plan: StepDraft) -> None:
        num_batch = sum(1 for s in itertools.chain(self._seqs.running, self._seqs.waiting) if self._is_batch(s))
        in_step = sum(1 for s in plan.scheduled if self._is_batch(s))
        lent = max(0, self._num_batch_running() - self._max_batch_seqs)
        self.policy.record_step(in_step, num_batch - in_step, lent)

    def _num_batch_running(self) -> int:
        return sum(1 for s in self._seqs.running if self._is_batch(s))

    def _admit(self, seq: Sequence, plan: StepDraft) -> bool:
        """Give a waiting sequence a slot and its first chunk. False: stop admitting."""
        slot = self._slots.pick(seq)
        if slot is None:
            victim = self._lent_slot_holder(seq) or self._victim(seq)
            if victim is None:
                return False
            self._preempt(victim, plan, keep_cache=True)
            slot = self._slots.pick(seq)
            assert slot is not None
        num_reused = self._slots.reuse_prefix(seq, slot, self._seqs.running, plan)
        num_reused = self._restores.restore(seq, slot, num_reused, plan, lambda: self.policy.model.coefficients[1])
        num_new = min(seq.num_tokens - num_reused, plan.budget)
        if not self._is_batch(seq) and seq.num_preemptions == 0:
            self.policy.note_prompt(min(seq.num_tokens - num_reused, self.capacity.step_tokens))
        # Room for all its tokens, not just this chunk: a sequence admitted
        # without it is preempted again before its prompt is done (thrashing).
        while not self._make_kv_room(seq.num_tokens - num_reused, plan, protect=None, keep=slot):
            victim = self._victim(seq)
            if victim is None:
                return False  # the trimmed slot stays free, its prefix cached
            self._preempt(victim, plan, keep_cache=False)
        self._seqs.start(seq)
        seq.slot = slot.slot_id
        seq.num_computed_tokens = num_reused
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = min(num_reused, seq.num_prompt_tokens)
            self.counters.num_cached_tokens += seq.num_cached_tokens
        slot.owner = seq
        plan.add(seq, num_new)
        return True

    def save_ops(self) -> StepPlan:
        """A step of only `save` edits: every slot's whole blocks the disk tier
        lacks (the worker runs it at unload and shutdown)."""
        plan = StepDraft(0, self.kv_used())
        self._slots.save_all(plan)
        return StepPlan(step_id=next(self._step_ids), kv_ops=tuple(plan.kv_ops), chunks=())

    def _make_kv_room(self, num_new: int, plan: StepDraft, protect: Sequence | None, keep: Slot | None = None) -> bool:
        """Evict cached prefixes of free slots, then preempt running sequences
        with later deadlines than `protect`, until `num_new` tokens fit."""
        while plan.kv_used + num_new > self.capacity.kv_size:
            if self._slots.evict_cached(plan, keep):
                continue
            if protect is None:
                return False
            victims = [s for s in self._seqs.running if s is not protect and _order(s) > _order(protect)]
            if not victims:
                return False
            self._preempt(max(victims, key=_order), plan, keep_cache=False)
        return True

    def _lent_slot_holder(self, waiting: Sequence) -> Sequence | None:
        """The youngest batch sequence, if batch work holds a reserved slot
        that `waiting` (other work) takes back."""
        if self._is_batch(waiting) or self._num_batch_running() <= self._max_batch_seqs:
            return None
        self.policy.num_slots_returned += 1
        return max((s for s in self._seqs.running if self._is_batch(s)), key=_order)

    def _victim(self, waiting: Sequence) -> Sequence | None:
        """The running sequence `waiting` may preempt, if any."""
        if not self._seqs.running:
            return None
        victim = max(self._seqs.running, key=_order)
        margin = self.config.preempt_margin * self.config.aging_s
        return victim if waiting.deadline < victim.deadline - margin else None

    def _preempt(self, seq: Sequence, plan: StepDraft, *, keep_cache: bool) -> None:
        slot = self._slots[seq.slot]
        plan.remove(seq)
        SlotTable.free(slot, self._now)
        if not keep_cache:
            self._slots.clear(slot, plan)
        self._seqs.requeue(seq)
        seq.slot = -1
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.counters.num_preemptions += 1

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SeqStatus.RUNNING:
            SlotTable.free(self._slots[seq.slot], self._now)
        self._seqs.finish(seq, reason)


def _order(seq: Sequence) -> tuple[float, float, int]:
    return (seq.deadline, seq.arrival_time, seq.seq_id)


def _decode_first(seq: Sequence) -> tuple[bool, float, float, int]:
    """Running sequences with one token to feed go before those still
    computing a prompt, so a long prompt never stalls others' decoding."""
    return (seq.num_tokens - seq.num_computed_tokens > 1, *_order(seq))


def _no_bytes(token_id: int) -> bytes:
    return b""
