"""The token-level continuous-batching scheduler. Pure and synchronous: it
never touches a model and reads no clock while it plans a step, it only
decides what the next step computes.

Rules (docs/architecture.md, "Scheduler rules", says how they fit together):

* One token budget per step (`Capacity.max_num_batched_tokens`) and at most
  `Capacity.max_num_seqs` running sequences.
* Decode tokens of running sequences go first. The rest of the budget goes
  to prompt work earliest-deadline-first: the next chunk of a running
  sequence's prompt and the first chunk of a waiting one compete on equal
  terms, so an interactive prompt is never queued behind a batch prompt that
  happened to start earlier. A step is never prefill-only by rule.
* `batch` work (priority at or past `batch_priority`) takes what other work
  leaves, decided by measurement (`batch_policy.BatchPolicy`): alone, it
  uses every slot and the whole budget; beside interactive or default work,
  it joins a step only while the step's predicted time keeps their
  inter-token latency within `itl_target` and an arriving prompt's first
  token within `ttft_target` of idle, and it sits out a step that computes
  their prompt. The worker feeds each step's measured time in
  (`observe_step`); the step-time model learns from it.
* Reserved slots are other work's first claim, not an empty hole: batch
  sequences hold at most ``max_num_seqs - reserved_slots`` slots while other
  work runs or waits (or did recently), and all of them while batch work
  runs alone. An interactive or default request that then finds no free
  slot takes a lent one back at once, by preempting the youngest batch
  sequence.
* Priority is a number, lower is sooner. A request's scheduling key is its
  *virtual deadline* ``arrival + priority * aging_s``; waiting requests are
  served earliest-deadline-first. This is aging: a request's effective
  priority improves by one level per `aging_s` seconds of waiting. Batch
  work whose deadline aging has put before every other request's is no
  longer held to the batch limits.

  **Worst-case wait.** A request R of priority p arriving at t0 is ahead of
  every request that arrives after ``t0 + (p - p_min) * aging_s`` (p_min = 0,
  `interactive`), and such a request can never preempt it. So R waits at most
  ``(p - p_min) * aging_s`` plus the service time of the requests that arrived
  before that moment; no stream of higher-priority arrivals starves it.
* Preemption: a waiting request may take the slot (or the KV room) of a
  running one whose deadline is later by more than
  ``preempt_margin * aging_s`` (or that holds a lent reserved slot, above).
  Deadlines are fixed, so preemption can never ping-pong between two
  requests. A preempted sequence keeps its tokens and is recomputed when
  readmitted, helped by the prefix cache.
* Prefix cache (`kv_slots.SlotTable`): a free slot keeps the tokens it last
  held. A new sequence takes the free slot sharing its longest prefix, or
  copies the prefix from a running slot, and only computes the rest.
* KV room is counted in tokens (cells), conservatively (shared cells counted
  once per slot). A sequence that cannot grow first evicts cached prefixes,
  then preempts the running sequence with the latest deadline; nothing is
  ever truncated silently.
* Speculation (`speculation.py`, when the model speculates): once the step
  is planned, decoding sequences may add drafted tokens with what budget and
  KV room are left, never at another request's cost (no eviction, no
  preemption, not for batch work held to its limits), as many as the
  step-time model says pay. A step keeps the accepted drafts' cells only.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from localserve.engine.batch_policy import BatchPolicy, StepGate
from localserve.engine.kv_slots import SlotTable, StepPlan
from localserve.engine.output import OutputText
from localserve.engine.prefix_disk import BLOCK, DiskPrefixStore
from localserve.engine.sequence import SeqStatus, Sequence, Slot
from localserve.engine.speculation import SpecState, draft_lengths
from localserve.engine.types import (
    Capacity,
    FinishReason,
    GenerateRequest,
    SampledToken,
    SchedulerConfig,
    SeqChunk,
    StepBatch,
    StepResult,
    TokenEvent,
    TokenLogprob,
)

__all__ = ["Scheduler", "SchedulerConfig", "SchedulerCounters", "reserved_slots"]


def reserved_slots(config: SchedulerConfig, max_num_seqs: int) -> int:
    if config.reserved_slots is not None:
        return max(0, min(config.reserved_slots, max_num_seqs - 1))
    return max_num_seqs // 8


@dataclass(slots=True)
class SchedulerCounters:
    """Monotonic counters, read by the step worker for the model's stats
    (rates and the prefix-cache hit rate are derived there)."""

    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens reused from the prefix cache
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # drafted tokens verified (speculative decoding)
    num_accepted_tokens: int = 0  # ... of which accepted


class Scheduler:
    """Decides each step's batch and applies its results. See module docstring."""

    def __init__(
        self,
        capacity: Capacity,
        *,
        eog_token_ids: Iterable[int],
        token_bytes: Callable[[int], bytes],
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        disk: DiskPrefixStore | None = None,
    ) -> None:
        if capacity.kv_tokens < capacity.n_ctx:
            raise ValueError("kv_tokens must hold at least one full context (n_ctx)")
        self.capacity = capacity
        self.config = config or SchedulerConfig()
        self.counters = SchedulerCounters()
        self._eog = frozenset(eog_token_ids)
        self._token_bytes = token_bytes
        self._clock = clock
        self._slots = SlotTable(capacity.max_num_seqs, enable_prefix_cache=self.config.enable_prefix_cache, disk=disk)
        self.disk = self._slots.disk
        self._restore_s_per_token: float | None = None  # measured; None: restoring is taken to pay
        self._waiting: list[Sequence] = []
        self._running: list[Sequence] = []
        self._by_request: dict[str, Sequence] = {}
        self._by_seq_id: dict[int, Sequence] = {}
        self._next_seq_id = 0
        # Waiting sequences no schedule() has seen yet (their seq ids are at
        # least `_new_from`): the next one may still give them free slots.
        self._num_new = 0
        self._new_from = 0
        self._step_ids = itertools.count()
        self._released: list[int] = []
        self._max_batch_seqs = capacity.max_num_seqs - reserved_slots(self.config, capacity.max_num_seqs)
        self.policy = BatchPolicy(self.config)
        self._now = clock()  # the time of the last add() or update(): schedule() reads no clock
        self._limit_after = math.inf  # batch work with a later deadline is limited in this step
        self._max_draft = min(self.config.draft_max, capacity.max_draft_tokens)
        self._draft_model = self.config.speculative == "draft"
        if self.config.speculative == "off":
            self._max_draft = 0
        elif self.config.speculative not in ("ngram", "draft"):
            raise ValueError(f"unknown speculative mode {self.config.speculative!r} (off, ngram, draft)")
        elif self._draft_model and not capacity.has_draft_model:
            raise ValueError("speculative mode 'draft' needs a draft model (--draft-model PATH)")

    # ---- requests in and out -------------------------------------------------

    def add(self, request: GenerateRequest) -> None:
        num_prompt = len(request.prompt_token_ids)
        if num_prompt == 0:
            raise ValueError("the prompt is empty")
        if num_prompt >= self.capacity.n_ctx:
            raise ValueError(f"the prompt has {num_prompt} tokens; the context holds {self.capacity.n_ctx}")
        if request.request_id in self._by_request:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        now = self._now = self._clock()
        if request.priority < self.config.batch_priority:
            self.policy.note_arrival(now)
        seq = Sequence(
            seq_id=self._next_seq_id,
            request_id=request.request_id,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=num_prompt,
            sampling=request.sampling,
            priority=request.priority,
            arrival_time=now,
            deadline=now + request.priority * self.config.aging_s,
            output=OutputText(request.sampling.stop),
        )
        self._next_seq_id += 1
        self._by_request[request.request_id] = seq
        self._by_seq_id[seq.seq_id] = seq
        self._waiting.append(seq)
        self._num_new += 1

    def abort(self, request_id: str) -> TokenEvent | None:
        """End a request now (between steps). Returns its final event, or None
        if it is unknown or already finished."""
        seq = self._by_request.get(request_id)
        if seq is None:
            return None
        self._now = self._clock()
        self._finish(seq, FinishReason.ABORT)
        return self._event(seq, (), "")

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_new(self) -> int:
        """Waiting sequences added since the last schedule(), which may yet
        give them free slots."""
        return self._num_new

    @property
    def num_held(self) -> int:
        """Waiting sequences that a schedule() left waiting: for a slot, for
        KV room, by the batch rules or the token budget, or preempted. The
        queue, as the queue limit counts it."""
        return len(self._waiting) - self._num_new

    @property
    def num_running(self) -> int:
        return len(self._running)

    def sequences(self) -> list[Sequence]:
        """Unfinished sequences, running first (for stats; do not mutate)."""
        return self._running + self._waiting

    def kv_used(self) -> int:
        return self._slots.kv_used()

    # ---- one step ------------------------------------------------------------

    def schedule(self) -> StepBatch:
        """Choose the next step's KV edits and token chunks."""
        plan = StepPlan(self.capacity.max_num_batched_tokens, self.kv_used())
        others = [s for s in itertools.chain(self._running, self._waiting) if not self._is_batch(s)]
        alone = self.policy.update_mode(bool(others), self._now)
        # Batch work that aging has put ahead of every other request is not limited.
        self._limit_after = math.inf if alone else min((s.deadline for s in others), default=self._now)
        prompt_work: list[Sequence] = []
        batch_decodes: list[Sequence] = []
        for seq in sorted(self._running, key=_decode_first):
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
        prompt_due = any(not self._is_batch(s) for s in itertools.chain(prompt_work, self._waiting))
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
        if self._max_draft:
            self._add_drafts(plan)
        self._record_policy_step(plan)
        self._num_new, self._new_from = 0, self._next_seq_id  # every waiting sequence was considered
        released, self._released = tuple(self._released), []
        return StepBatch(
            step_id=next(self._step_ids),
            kv_ops=tuple(plan.kv_ops),
            chunks=tuple(
                self._chunk(seq, n, plan.drafts.get(seq, ()), plan.model_drafts.get(seq, 0))
                for seq, n in plan.scheduled.items()
            ),
            released_seq_ids=released,
        )

    def observe_step(self, batch: StepBatch, seconds: float) -> None:
        """The measured time of a step that ran (the worker's clock): what
        the step-time model, and so batch admission, learns from."""
        self.policy.observe_step(batch.num_tokens, len(batch.chunks), seconds)

    def update(self, batch: StepBatch, result: StepResult) -> list[TokenEvent]:
        """Apply a step's results: advance computed tokens, append sampled
        tokens, detect stops. Returns one event per sequence that sampled."""
        self._now = self._clock()
        events: list[TokenEvent] = []
        self._count_step(batch)
        self._note_restores(batch, result)
        for chunk in batch.chunks:
            seq = self._by_request_seq(chunk.seq_id)
            if seq is None or seq.status is not SeqStatus.RUNNING:
                continue
            if chunk.slot in result.restore_failed:  # the slot is empty and the chunk was not computed
                seq.num_computed_tokens = 0
                continue
            accepted = result.accepted.get(chunk.seq_id, ())
            num_draft = chunk.num_draft + result.drafted.get(chunk.seq_id, 0)
            num_fed = len(chunk.token_ids) - chunk.num_draft
            # The cells the backend kept: the chunk's own tokens, then each accepted draft,
            # which equals the token sampled before it (the first sampled, then all but the last accepted).
            kept = chunk.token_ids[:num_fed]
            if accepted:
                kept += (result.sampled[chunk.seq_id].token_id, *(t.token_id for t in accepted[:-1]))
            seq.num_computed_tokens += len(kept)
            self._slots[chunk.slot].token_ids.extend(kept)
            if num_draft and seq.spec is not None:
                seq.spec.observe(num_draft, len(accepted))
                self.counters.num_draft_tokens += num_draft
                self.counters.num_accepted_tokens += len(accepted)
            if chunk.seq_id in result.failed:
                self._finish(seq, FinishReason.ERROR)
                events.append(self._event(seq, (), "", error=result.failed[chunk.seq_id]))
            elif chunk.sample:
                events.append(self._append_tokens(seq, (result.sampled[chunk.seq_id], *accepted)))
        return events

    def _note_restores(self, batch: StepBatch, result: StepResult) -> None:
        """Learn what a restored token costs; a restore the backend refused
        leaves its slot empty, and its file is not tried again."""
        restores = [op for op in batch.kv_ops if op.kind == "restore"]
        if not restores or self.disk is None:
            return
        for op in restores:
            if op.slot in result.restore_failed:
                self._slots[op.slot].token_ids.clear()
                self.disk.discard(op.key)
        num_tokens = sum(op.num_tokens for op in restores if op.slot not in result.restore_failed)
        if num_tokens:
            self.disk.stats.restore_s += result.restore_s
            self.disk.stats.num_restored_tokens += num_tokens
            per_token = result.restore_s / num_tokens
            mean = self._restore_s_per_token
            self._restore_s_per_token = per_token if mean is None else mean + 0.3 * (per_token - mean)

    def fail(self, batch: StepBatch, message: str) -> list[TokenEvent]:
        """The step raised: end its sequences with an error, forget the KV of
        every slot it touched. Returns their final events; the engine must
        clear `touched_slots(batch)` in the backend."""
        events = []
        for chunk in batch.chunks:
            seq = self._by_request_seq(chunk.seq_id)
            if seq is not None and seq.status is SeqStatus.RUNNING:
                self._finish(seq, FinishReason.ERROR)
                events.append(self._event(seq, (), "", error=message))
        for slot_id in self.touched_slots(batch):
            self._slots[slot_id].token_ids.clear()
        return events

    @staticmethod
    def touched_slots(batch: StepBatch) -> set[int]:
        return {c.slot for c in batch.chunks} | {op.slot for op in batch.kv_ops}

    # ---- internals -----------------------------------------------------------

    def _schedule_running(self, seq: Sequence, plan: StepPlan) -> None:
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

    def _schedule_prompt_work(self, prompt_work: list[Sequence], plan: StepPlan, gate: StepGate, num_kept: int) -> bool:
        """Prompt chunks of running sequences and admissions of waiting ones,
        earliest deadline first. Limited batch work takes what `gate` leaves
        beside the `num_kept` batch decodes still to come, and stays out of a
        step that computes another request's prompt. Returns whether this
        step computes one."""
        waiting = set(self._waiting)
        admitting, others_prompting = True, False
        for seq in sorted(prompt_work + self._waiting, key=_order):
            if plan.budget <= 0:
                break
            limited = self._limited(seq)
            if limited and others_prompting:
                continue  # that step is the other prompt's time to first token
            if seq in waiting and not self._may_admit(seq):
                continue
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

    def _schedule_batch_decodes(self, batch_decodes: list[Sequence], plan: StepPlan, num_seqs: int) -> None:
        """The first `num_seqs` limited batch decodes, earliest deadline first."""
        for seq in batch_decodes:
            if num_seqs <= 0:
                break
            if seq.status is SeqStatus.RUNNING:
                self._schedule_running(seq, plan)
                num_seqs -= seq in plan.scheduled

    def _record_policy_step(self, plan: StepPlan) -> None:
        num_batch = sum(1 for s in itertools.chain(self._running, self._waiting) if self._is_batch(s))
        in_step = sum(1 for s in plan.scheduled if self._is_batch(s))
        lent = max(0, self._num_batch_running() - self._max_batch_seqs)
        self.policy.record_step(in_step, num_batch - in_step, lent)

    def _num_batch_running(self) -> int:
        return sum(1 for s in self._running if self._is_batch(s))

    def _admit(self, seq: Sequence, plan: StepPlan) -> bool:
        """Give a waiting sequence a slot and its first chunk. False: stop admitting."""
        slot = self._slots.pick(seq)
        if slot is None:
            victim = self._lent_slot_holder(seq) or self._victim(seq)
            if victim is None:
                return False
            self._preempt(victim, plan, keep_cache=True)
            slot = self._slots.pick(seq)
            assert slot is not None
        num_reused = self._slots.reuse_prefix(seq, slot, self._running, plan)
        num_reused = self._restore(seq, slot, num_reused, plan)
        num_new = min(seq.num_tokens - num_reused, plan.budget)
        if not self._is_batch(seq) and seq.num_preemptions == 0:
            self.policy.note_prompt(min(seq.num_tokens - num_reused, self.capacity.max_num_batched_tokens))
        # Room for all its tokens, not just this chunk: a sequence admitted
        # without it is preempted again before its prompt is done (thrashing).
        while not self._make_kv_room(seq.num_tokens - num_reused, plan, protect=None, keep=slot):
            victim = self._victim(seq)
            if victim is None:
                return False  # the trimmed slot stays free, its prefix cached
            self._preempt(victim, plan, keep_cache=False)
        self._waiting.remove(seq)
        self._running.append(seq)
        seq.status = SeqStatus.RUNNING
        seq.slot = slot.slot_id
        seq.num_computed_tokens = num_reused
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = min(num_reused, seq.num_prompt_tokens)
            self.counters.num_cached_tokens += seq.num_cached_tokens
        slot.owner = seq
        plan.add(seq, num_new)
        return True

    def _restore(self, seq: Sequence, slot: Slot, num_reused: int, plan: StepPlan) -> int:
        """Restore the longest saved prefix of `seq` from the disk tier into
        `slot` when it holds a block more than the slots gave and restoring
        is predicted faster than computing it. Returns the tokens reused."""
        disk = self.disk
        if disk is None or seq.num_tokens - 1 < BLOCK or seq.num_preemptions:
            return num_reused
        found = disk.longest(seq.token_ids, seq.num_tokens - 1)
        if found is None or found[0] < num_reused + BLOCK:
            disk.stats.num_misses += found is None
            return num_reused
        num_tokens, key = found
        if not self._restore_pays(num_tokens - num_reused):
            return num_reused
        payload = disk.load(key)
        if payload is None:  # truncated or corrupt: deleted, a miss
            disk.stats.num_misses += 1
            return num_reused
        self._slots.restore(slot, seq.token_ids[:num_tokens], key, payload, plan)
        disk.stats.num_hits += 1
        return num_tokens

    def _restore_pays(self, num_tokens: int) -> bool:
        """Restoring `num_tokens` beats computing them, as measured so far."""
        if self._restore_s_per_token is None:
            return True
        per_token = self.policy.model.coefficients[1]
        return self._restore_s_per_token * num_tokens < per_token * num_tokens or per_token <= 0.0

    def save_ops(self) -> StepBatch:
        """A step of only `save` edits: every slot's whole blocks the disk tier
        lacks (the worker runs it at unload and shutdown)."""
        plan = StepPlan(0, self.kv_used())
        self._slots.save_all(plan)
        return StepBatch(step_id=next(self._step_ids), kv_ops=tuple(plan.kv_ops), chunks=())

    def _make_kv_room(self, num_new: int, plan: StepPlan, protect: Sequence | None, keep: Slot | None = None) -> bool:
        """Evict cached prefixes of free slots, then preempt running sequences
        with later deadlines than `protect`, until `num_new` tokens fit."""
        while plan.kv_used + num_new > self.capacity.kv_tokens:
            if self._slots.evict_cached(plan, keep):
                continue
            if protect is None:
                return False
            victims = [s for s in self._running if s is not protect and _order(s) > _order(protect)]
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
        return max((s for s in self._running if self._is_batch(s)), key=_order)

    def _victim(self, waiting: Sequence) -> Sequence | None:
        """The running sequence `waiting` may preempt, if any."""
        if not self._running:
            return None
        victim = max(self._running, key=_order)
        margin = self.config.preempt_margin * self.config.aging_s
        return victim if waiting.deadline < victim.deadline - margin else None

    def _preempt(self, seq: Sequence, plan: StepPlan, *, keep_cache: bool) -> None:
        slot = self._slots[seq.slot]
        plan.remove(seq)
        SlotTable.free(slot, self._now)
        if not keep_cache:
            self._slots.clear(slot, plan)
        self._running.remove(seq)
        self._waiting.append(seq)
        seq.status = SeqStatus.WAITING
        seq.slot = -1
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.counters.num_preemptions += 1

    def _add_drafts(self, plan: StepPlan) -> None:
        """Drafts for the step's decoding sequences, from the budget and KV
        room the step leaves, as many as pay (speculation.draft_lengths)."""
        proposals: list[tuple[Sequence, list[int]]] = []
        for seq, num_new in plan.scheduled.items():
            if num_new != 1 or seq.num_computed_tokens != seq.num_tokens - 1 or seq.num_output_tokens == 0:
                continue  # a prompt chunk, or the prompt's last token: no output to draft after yet
            if not seq.sampling.speculative or self._limited(seq):
                continue
            if seq.spec is None:
                seq.spec = SpecState()
            # The last sampled token is free; positions stay inside the context.
            room = min(
                self._max_draft,
                seq.sampling.max_tokens - seq.num_output_tokens - 1,
                self.capacity.n_ctx - seq.num_tokens - 1,
            )
            draft_ids = [-1] * room if self._draft_model else seq.spec.drafter.propose(seq.token_ids, room)
            if draft_ids:
                proposals.append((seq, draft_ids))
        if not proposals:
            return
        k = draft_lengths(
            [(seq.spec.acceptance, len(d)) for seq, d in proposals if seq.spec is not None],
            num_tokens=plan.num_tokens,
            num_seqs=plan.num_seqs,
            coefficients=self.policy.model.coefficients,
            max_draft=self._max_draft,
        )
        for seq, draft_ids in proposals:
            take = min(k, len(draft_ids), plan.budget, self.capacity.kv_tokens - plan.kv_used)
            if take > 0 and self._draft_model:
                plan.add_model_drafts(seq, take)
            elif take > 0:
                plan.add_drafts(seq, draft_ids[:take])
            elif seq.spec is not None:
                seq.spec.rest()

    def _chunk(self, seq: Sequence, num_new: int, draft_ids: Iterable[int] = (), num_model_drafts: int = 0) -> SeqChunk:
        start = seq.num_computed_tokens
        drafts = tuple(draft_ids)
        return SeqChunk(
            seq_id=seq.seq_id,
            slot=seq.slot,
            token_ids=tuple(seq.token_ids[start : start + num_new]) + drafts,
            start_pos=start,
            sample=start + num_new == seq.num_tokens,
            sampling=seq.sampling,
            num_draft=len(drafts),
            draft_model_tokens=num_model_drafts,
        )

    def _append_tokens(self, seq: Sequence, sampled: Iterable[SampledToken]) -> TokenEvent:
        """Append a step's sampled tokens (one, or more after accepted drafts)
        in order until one ends the sequence; one event for them all."""
        emitted: list[int] = []
        texts: list[str] = []
        logprobs: list[TokenLogprob] = []
        for token in sampled:
            kept, text = self._append_token(seq, token.token_id)
            emitted += kept
            texts.append(text)
            if token.logprob is not None and kept:
                logprobs.append(token.logprob)
            if seq.status is SeqStatus.FINISHED:
                break
        return self._event(seq, tuple(emitted), "".join(texts), logprobs=tuple(logprobs))

    def _append_token(self, seq: Sequence, token_id: int) -> tuple[tuple[int, ...], str]:
        """Append one token, end the sequence if it stops it; the token ids
        to emit and the text it releases."""
        seq.token_ids.append(token_id)
        params = seq.sampling
        may_stop = seq.num_output_tokens > params.min_tokens
        text = ""
        emitted: tuple[int, ...] = (token_id,)
        reason: FinishReason | None
        is_eog = not params.ignore_eos and token_id in self._eog
        if may_stop and (is_eog or token_id in params.stop_token_ids):
            reason, emitted = FinishReason.STOP, ()
        else:
            text = seq.output.push(self._token_bytes(token_id))
            reason = FinishReason.STOP if seq.output.stopped_by is not None else None
        if reason is None and (seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.capacity.n_ctx):
            reason = FinishReason.LENGTH
        if reason is not None:
            text += seq.output.flush()
            self._finish(seq, reason)
        return emitted, text

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SeqStatus.RUNNING:
            SlotTable.free(self._slots[seq.slot], self._now)
            self._running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self._waiting.remove(seq)
            if seq.seq_id >= self._new_from:
                self._num_new -= 1
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        del self._by_request[seq.request_id]
        del self._by_seq_id[seq.seq_id]
        self._released.append(seq.seq_id)

    def _event(
        self, seq: Sequence, token_ids: tuple[int, ...], text: str, *, logprobs=(), error: str | None = None
    ) -> TokenEvent:  # type: ignore[no-untyped-def]
        return TokenEvent(
            request_id=seq.request_id,
            token_ids=token_ids,
            text=text,
            logprobs=logprobs,
            finish_reason=seq.finish_reason,
            error=error,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_draft_tokens=seq.spec.num_drafted if seq.spec is not None else 0,
            num_accepted_tokens=seq.spec.num_accepted if seq.spec is not None else 0,
        )

    def _by_request_seq(self, seq_id: int) -> Sequence | None:
        return self._by_seq_id.get(seq_id)

    def _count_step(self, batch: StepBatch) -> None:
        """The one prefill/decode rule (the model's stats read these counters):
        a chunk that starts past the prompt is decode work, any other chunk
        prompt work, counted whole."""
        c = self.counters
        for chunk in batch.chunks:
            seq = self._by_request_seq(chunk.seq_id)
            is_decode = seq is not None and chunk.start_pos >= seq.num_prompt_tokens
            if is_decode:
                c.num_decode_tokens += len(chunk.token_ids)
            else:
                c.num_prefill_tokens += len(chunk.token_ids)


def _order(seq: Sequence) -> tuple[float, float, int]:
    return (seq.deadline, seq.arrival_time, seq.seq_id)


def _decode_first(seq: Sequence) -> tuple[bool, float, float, int]:
    """Running sequences with one token to feed go before those still
    computing a prompt, so a long prompt never stalls others' decoding."""
    return (seq.num_tokens - seq.num_computed_tokens > 1, *_order(seq))
