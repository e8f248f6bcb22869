"""A sequence's state as the scheduler sees it, the table of unfinished ones, and the KV slots they live in."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from localserve.engine.step.output import OutputText
from localserve.engine.step.speculation import SpecState
from localserve.engine.types import FinishReason, GenerateRequest, SamplingParams

if TYPE_CHECKING:
    from localserve.engine.step.prefix_disk import Prefetch


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # never run, or preempted (keeps its tokens)
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One request's tokens. `token_ids` is prompt + output; the first
    `num_computed_tokens` of them are in the KV cache of `slot`."""

    seq_id: int
    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    priority: float
    arrival_time: float
    deadline: float  # arrival + priority * aging_s: the scheduling key
    output: OutputText | None = None  # its text so far (the output processor's)
    status: SeqStatus = SeqStatus.WAITING
    slot: int = -1
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache
    num_preemptions: int = 0
    finish_reason: FinishReason | None = None
    spec: SpecState | None = None  # its drafter and acceptance, once it may speculate
    prefetch: Prefetch | None = None  # its saved prefix, read ahead from the disk tier until admitted

    @property
    def reading(self) -> bool:
        """Its saved prefix is still being read from disk: it waits for it."""
        return self.prefetch is not None and not self.prefetch.done

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class SequenceTable:
    """The unfinished sequences, waiting and running, by request id and by seq
    id; the ids of those that ended since the last step; and how many waiting
    ones no schedule() has seen yet (the next one may still give them free
    slots: the queue limit counts them apart)."""

    def __init__(self) -> None:
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.by_request: dict[str, Sequence] = {}
        self.by_seq_id: dict[int, Sequence] = {}
        self.num_new = 0
        self._next_seq_id = 0
        self._new_from = 0  # new waiting sequences have seq ids from here on
        self._released: list[int] = []

    def add(self, request: GenerateRequest, now: float, aging_s: float) -> Sequence:
        """A waiting sequence for `request`, arrived `now`."""
        seq = Sequence(
            seq_id=self._next_seq_id,
            request_id=request.request_id,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
            sampling=request.sampling,
            priority=request.priority,
            arrival_time=now,
            deadline=now + request.priority * aging_s,
        )
        self._next_seq_id += 1
        self.by_request[seq.request_id] = seq
        self.by_seq_id[seq.seq_id] = seq
        self.waiting.append(seq)
        self.num_new += 1
        return seq

    def start(self, seq: Sequence) -> None:
        """A waiting sequence runs."""
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = SeqStatus.RUNNING

    def requeue(self, seq: Sequence) -> None:
        """A running sequence waits again (preempted)."""
        self.running.remove(seq)
        self.waiting.append(seq)
        seq.status = SeqStatus.WAITING

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
            if seq.seq_id >= self._new_from:
                self.num_new -= 1
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        del self.by_request[seq.request_id]
        del self.by_seq_id[seq.seq_id]
        self._released.append(seq.seq_id)

    def all_seen(self) -> tuple[int, ...]:
        """A schedule() considered every waiting sequence: none is new. Returns
        the seq ids that ended since the last one (the backend releases them)."""
        self.num_new, self._new_from = 0, self._next_seq_id
        released, self._released = tuple(self._released), []
        return released


@dataclass(slots=True, eq=False)
class Slot:
    """A KV slot. A free slot keeps the tokens it last held, so a later
    sequence with the same prefix can reuse them (the prefix cache)."""

    slot_id: int
    token_ids: list[int] = field(default_factory=list)  # tokens whose KV is here
    owner: Sequence | None = None
    last_used: float = 0.0


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in blocks first: long shared system prompts are the common case.
    block = 64
    while i + block <= n and a[i : i + block] == b[i : i + block]:
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i
