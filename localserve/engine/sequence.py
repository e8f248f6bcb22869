"""A sequence's state as the scheduler sees it, and the KV slots it lives in."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from localserve.engine.output import OutputText
from localserve.engine.speculation import SpecState
from localserve.engine.types import FinishReason, SamplingParams


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

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


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
