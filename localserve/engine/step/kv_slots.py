"""The KV side of the scheduler: the slots, the prefix cache they form, and
the plan of the step being built.

A slot holds the tokens whose KV is in the backend's cache for it. A free slot
keeps the tokens it last held, so a later sequence with the same prefix can
reuse them. Every change to what a slot holds is also recorded as a `KvOp` in
the step's plan, so that the backend's cache follows (see `Scheduler`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from localserve.engine.step.prefix_disk import BLOCK, DiskPrefixStore, chain_hashes
from localserve.engine.step.sequence import Sequence, Slot, common_prefix_len
from localserve.engine.types import KvOp, KvOpKind, SeqChunk, StepPlan, StepResult

#: Where busy slots are kept in one run (`SlotTable.packed`), a free slot out
#: of the run is taken for a shared prefix only this long: a gap costs every
#: step a forward pass (SmolLM2, 2 threads, 8 streams: 43.7 against 37.3 ms a
#: step) for as long as it lasts, a prefix saves its prompt once.
PACKED_REUSE_MIN = 64


class StepDraft:
    """The step being built: token budget left, KV cells in use, KV edits and
    the tokens scheduled per sequence."""

    __slots__ = ("budget", "kv_used", "kv_ops", "scheduled", "drafts", "model_drafts")

    def __init__(self, budget: int, kv_used: int) -> None:
        self.budget = budget
        self.kv_used = kv_used
        self.kv_ops: list[KvOp] = []
        self.scheduled: dict[Sequence, int] = {}
        self.drafts: dict[Sequence, list[int]] = {}  # drafted tokens a scheduled decode verifies
        self.model_drafts: dict[Sequence, int] = {}  # ... or how many the backend's draft model proposes

    @property
    def num_tokens(self) -> int:
        """Tokens scheduled so far (drafts included)."""
        drafts = sum(len(d) for d in self.drafts.values()) + sum(self.model_drafts.values())
        return sum(self.scheduled.values()) + drafts

    def add_drafts(self, seq: Sequence, draft_ids: list[int]) -> None:
        """`seq`, scheduled to decode, also feeds `draft_ids` (their cells are
        counted until the step's verification removes the rejected ones)."""
        self.drafts[seq] = draft_ids
        self.budget -= len(draft_ids)
        self.kv_used += len(draft_ids)

    def add_model_drafts(self, seq: Sequence, num_draft: int) -> None:
        """`seq`, scheduled to decode, also verifies `num_draft` tokens the backend drafts."""
        self.model_drafts[seq] = num_draft
        self.budget -= num_draft
        self.kv_used += num_draft

    @property
    def num_seqs(self) -> int:
        return len(self.scheduled)

    def add(self, seq: Sequence, num_new: int) -> None:
        self.scheduled[seq] = num_new
        self.budget -= num_new
        self.kv_used += num_new

    def remove(self, seq: Sequence) -> None:
        num_new = self.scheduled.pop(seq, 0) + len(self.drafts.pop(seq, ())) + self.model_drafts.pop(seq, 0)
        self.budget += num_new
        self.kv_used -= num_new

    def chunks(self) -> tuple[SeqChunk, ...]:
        """The step's token chunks: each scheduled sequence's next tokens, then its drafts."""
        chunks = []
        for seq, num_new in self.scheduled.items():
            start = seq.num_computed_tokens
            drafts = tuple(self.drafts.get(seq, ()))
            chunks.append(
                SeqChunk(
                    seq_id=seq.seq_id,
                    slot=seq.slot,
                    token_ids=tuple(seq.token_ids[start : start + num_new]) + drafts,
                    start_pos=start,
                    sample=start + num_new == seq.num_tokens,
                    sampling=seq.sampling,
                    num_draft=len(drafts),
                    draft_model_tokens=self.model_drafts.get(seq, 0),
                )
            )
        return tuple(chunks)


class SlotTable:
    """The KV slots and the prefix cache. Which slot a new sequence takes, how
    much of its prompt it reuses, which cached prefix goes when room is short."""

    def __init__(
        self,
        num_slots: int,
        *,
        enable_prefix_cache: bool = True,
        disk: DiskPrefixStore | None = None,
        packed: bool = False,
    ) -> None:
        """`packed`: keep the busy slots in one run of consecutive ids
        (`Capacity.slot_streams`, see `pick`)."""
        self.slots = [Slot(i) for i in range(num_slots)]
        self.enable_prefix_cache = enable_prefix_cache
        self.disk = disk if enable_prefix_cache else None
        self.packed = packed

    def reuses(self, seq: Sequence) -> bool:
        """May `seq` start from a cached prefix (the prefix cache is on and
        the request did not ask `cache_prompt: false`)?"""
        return self.enable_prefix_cache and seq.sampling.cache_prompt

    def __getitem__(self, slot_id: int) -> Slot:
        return self.slots[slot_id]

    def kv_used(self) -> int:
        """KV cells in use, counted per slot (a shared prefix counts once per slot)."""
        return sum(len(s.token_ids) for s in self.slots)

    def pick(self, seq: Sequence) -> Slot | None:
        """The free slot sharing the longest prefix with `seq`, else an empty
        one, else any; the lowest slot id among equals. None if none is free.

        `packed` (a KV stream per slot): llama.cpp computes each run of
        consecutive busy slots in a forward pass of its own, so every gap
        between busy slots costs every step a pass. There the lowest free
        slot is taken, whatever it holds, unless another holds at least
        PACKED_REUSE_MIN more tokens of the prompt (a conversation's earlier
        turns). Taking empty slots first had 8 streams on 16 slots running
        in two runs for a quarter of their steps."""
        free = [s for s in self.slots if s.owner is None]
        if not free:
            return None
        shared = {s.slot_id: common_prefix_len(s.token_ids, seq.token_ids) for s in free} if self.reuses(seq) else {}
        best = max(free, key=lambda s: (shared.get(s.slot_id, 0), -s.slot_id))
        if self.packed:
            lowest = free[0]  # the slots are in id order
            return best if shared.get(best.slot_id, 0) - shared.get(lowest.slot_id, 0) >= PACKED_REUSE_MIN else lowest
        if shared.get(best.slot_id, 0) > 0:
            return best
        return min(free, key=lambda s: (bool(s.token_ids), s.slot_id))

    def reuse_prefix(self, seq: Sequence, slot: Slot, running: Iterable[Sequence], plan: StepDraft) -> int:
        """Trim `slot` to the prefix it shares with `seq`, or copy a longer one
        from the slot of a `running` sequence. Returns the number of tokens
        reused. At least one token is always left to compute, to get logits to
        sample from."""
        limit = seq.num_tokens - 1
        reuse = self.reuses(seq)
        num_own = min(common_prefix_len(slot.token_ids, seq.token_ids), limit) if reuse else 0
        best_src, num_copy = None, num_own
        if reuse:
            for other in running:
                other_slot = self.slots[other.slot]
                n = min(common_prefix_len(other_slot.token_ids, seq.token_ids), limit)
                if n > num_copy:
                    best_src, num_copy = other_slot, n
        self.save(slot, num_copy if best_src is None else 0, plan)
        plan.kv_used -= len(slot.token_ids)
        if best_src is not None:
            plan.kv_ops.append(KvOp(KvOpKind.COPY, slot.slot_id, num_copy, src=best_src.slot_id))
            slot.token_ids = best_src.token_ids[:num_copy]
        elif len(slot.token_ids) != num_own:
            plan.kv_ops.append(KvOp(KvOpKind.KEEP, slot.slot_id, num_own))
            del slot.token_ids[num_own:]
        plan.kv_used += len(slot.token_ids)
        return len(slot.token_ids)

    def restore(self, slot: Slot, token_ids: list[int], key: str, payload: bytes | memoryview, plan: StepDraft) -> None:
        """Load a saved sequence from the disk tier into `slot`, keeping its
        first `len(token_ids)` cells (the prefix the new prompt shares)."""
        self.save(slot, 0, plan)
        plan.kv_used += len(token_ids) - len(slot.token_ids)
        plan.kv_ops.append(KvOp(KvOpKind.RESTORE, slot.slot_id, len(token_ids), key=key, payload=payload))
        slot.token_ids = list(token_ids)

    def save(self, slot: Slot, num_kept: int, plan: StepDraft) -> None:
        """Before `slot` keeps only its first `num_kept` tokens: if whole blocks
        beyond those would be lost and the disk tier lacks them, save the
        slot's whole sequence (prefix_disk.py: a restore then takes every
        token a prompt shares with it)."""
        if self.disk is None:
            return
        num_tokens = len(slot.token_ids)
        num_blocks = num_tokens // BLOCK * BLOCK
        if num_blocks <= num_kept or num_blocks < BLOCK:
            return
        key = chain_hashes(self.disk.identity, slot.token_ids[:num_blocks])[-1]
        if self.disk.stored_tokens(key) >= num_tokens:
            return
        self.disk.expect(key, slot.token_ids)
        plan.kv_ops.append(KvOp(KvOpKind.SAVE, slot.slot_id, num_tokens, key=key))

    def save_all(self, plan: StepDraft) -> None:
        """Save every slot's whole blocks the disk tier lacks (at unload and shutdown)."""
        for slot in self.slots:
            self.save(slot, 0, plan)

    def evict_cached(self, plan: StepDraft, keep: Slot | None = None) -> bool:
        """Drop the least recently used cached prefix (of a free slot other than
        `keep`). False if there is none."""
        cached = [s for s in self.slots if s.owner is None and s.token_ids and s is not keep]
        if not cached:
            return False
        self.clear(min(cached, key=lambda s: s.last_used), plan)
        return True

    def clear(self, slot: Slot, plan: StepDraft) -> None:
        """Forget everything `slot` holds (its whole blocks go to the disk tier first)."""
        self.save(slot, 0, plan)
        plan.kv_used -= len(slot.token_ids)
        slot.token_ids.clear()
        plan.kv_ops.append(KvOp(KvOpKind.KEEP, slot.slot_id, 0))

    @staticmethod
    def free(slot: Slot, now: float) -> None:
        """The owner is gone; the tokens stay, as a cached prefix."""
        slot.owner = None
        slot.last_used = now


class DiskRestores:
    """The disk tier's restore decisions: which admitted sequence gets a saved
    prefix restored into its slot, and what a restored token costs, as
    measured from the steps that restored."""

    def __init__(self, slots: SlotTable) -> None:
        self._slots = slots
        self._s_per_token: float | None = None  # measured; None: restoring is taken to pay

    def prefetch(self, seq: Sequence, compute_s_per_token: Callable[[], float]) -> None:
        """When `seq` arrives: read its longest saved prefix ahead (on the disk
        tier's reader thread) if it holds a block more than any slot and
        restoring is predicted faster than computing it."""
        disk = self._slots.disk
        if disk is None or seq.num_tokens - 1 < BLOCK or seq.num_preemptions or not self._slots.reuses(seq):
            return
        limit = seq.num_tokens - 1
        found = disk.longest(seq.token_ids, limit)
        if found is None:
            disk.stats.num_misses += 1
            return
        num_tokens, key = found
        in_slots = max((common_prefix_len(s.token_ids, seq.token_ids) for s in self._slots.slots), default=0)
        in_slots = min(in_slots, limit)
        if num_tokens >= in_slots + BLOCK and self._pays(num_tokens - in_slots, compute_s_per_token):
            seq.prefetch = disk.prefetch(num_tokens, key)

    def restore(
        self, seq: Sequence, slot: Slot, num_reused: int, plan: StepDraft, compute_s_per_token: Callable[[], float]
    ) -> int:
        """Restore `seq`'s prefix that was read ahead (`prefetch`, done: the
        scheduler admits no sequence whose read is under way) into `slot` when
        it holds a block more than the slots gave and restoring is predicted
        faster than computing it. Returns the tokens reused. Touches no file."""
        fetch, seq.prefetch = seq.prefetch, None
        disk = self._slots.disk
        if disk is None or fetch is None or not fetch.done or seq.num_preemptions:
            return num_reused
        if fetch.num_tokens < num_reused + BLOCK or not self._pays(fetch.num_tokens - num_reused, compute_s_per_token):
            return num_reused
        if fetch.loaded is None:  # truncated or corrupt: deleted, a miss
            disk.stats.num_misses += 1
            return num_reused
        stored, payload = fetch.loaded
        num_tokens = max(fetch.num_tokens, min(common_prefix_len(stored.tolist(), seq.token_ids), seq.num_tokens - 1))
        self._slots.restore(slot, seq.token_ids[:num_tokens], fetch.key, payload, plan)
        disk.stats.num_hits += 1
        return num_tokens

    def _pays(self, num_tokens: int, compute_s_per_token: Callable[[], float]) -> bool:
        """Restoring `num_tokens` beats computing them, as measured so far."""
        if self._s_per_token is None:
            return True
        per_token = compute_s_per_token()
        return self._s_per_token * num_tokens < per_token * num_tokens or per_token <= 0.0

    def observe(self, batch: StepPlan, result: StepResult) -> None:
        """Learn what a restored token costs; a restore the backend refused
        leaves its slot empty, and its file is not tried again."""
        disk = self._slots.disk
        restores = [op for op in batch.kv_ops if op.kind == KvOpKind.RESTORE]
        if not restores or disk is None:
            return
        for op in restores:
            if op.slot in result.restore_failed:
                self._slots[op.slot].token_ids.clear()
                disk.discard(op.key)
        num_tokens = sum(op.num_tokens for op in restores if op.slot not in result.restore_failed)
        if num_tokens:
            disk.stats.restore_s += result.restore_s
            disk.stats.num_restored_tokens += num_tokens
            per_token = result.restore_s / num_tokens
            mean = self._s_per_token
            self._s_per_token = per_token if mean is None else mean + 0.3 * (per_token - mean)
