"""A deterministic `GenerativeBackend` for driving the real `StepWorker` and
`Engine` without llama.cpp.

It wraps the scheduler tests' `ScriptedBackend` (simulated KV slots, each
token derived from what its slot holds), so a request's tokens are those of
`scripted.run_alone` whatever else shares the steps, and a wrong KV edit,
position or batch fails an assertion inside the step (which the worker
reports as a failed step). On top it gives tests control of the step thread:

* `pause(from_step)` / `resume(pause_at)`: an `execute` (the `from_step`-th
  and later ones; the next one by default) blocks until resumed, so requests
  submitted meanwhile reach the scheduler together, between two steps, and a
  test sees the streams as they stand after a given step;
  `wait_for_steps(n)` waits until `n` steps have started;
* `fail_next_step(exc)`: the next `execute` raises `exc` (an error from a step);
* `fail_clear_slots`: `clear_slots` raises too, which ends the step loop.
"""

from __future__ import annotations

import threading
from collections.abc import Collection

from localserve.engine.backend import BackendInfo, GenerativeBackend, Tokenizer
from localserve.engine.types import Capacity, StepPlan, StepResult
from tests.engine.scripted import EOS, VOCAB, NextToken, ScriptedBackend, hashed_next_token, make_capacity, token_bytes

WAIT_S = 10.0  # no test step should ever block this long


class FakeTokenizer(Tokenizer):
    """Token i is the text `t{i} `; EOS is the one end-of-generation token."""

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def token_bytes(self, token_id: int) -> bytes:
        return token_bytes(token_id)

    @property
    def eog_token_ids(self) -> frozenset[int]:
        return frozenset({EOS})

    @property
    def vocab_size(self) -> int:
        return EOS + 1


class FakeBackend(GenerativeBackend):
    """`ScriptedBackend` behind the backend interface, with step-thread controls."""

    def __init__(self, capacity: Capacity | None = None, next_token: NextToken = hashed_next_token) -> None:
        self._capacity = capacity or make_capacity()
        self.script = ScriptedBackend(self._capacity, next_token)
        self.batches: list[StepPlan] = []  # every step executed (failed ones too)
        self.released_seq_ids: list[int] = []
        self.cleared_slots: list[int] = []
        self.fail_clear_slots = False
        self.closed = False
        self._cond = threading.Condition()
        self._paused_from: int | None = None  # the first step that blocks; None: none
        self._num_started = 0
        self._failures: list[BaseException] = []

    # ---- controls (any thread) -------------------------------------------------------

    def pause(self, from_step: int | None = None) -> None:
        """Hold the step thread in `execute` of step `from_step` (counted from 1)
        and after; None: the next step."""
        with self._cond:
            self._paused_from = from_step if from_step is not None else self._num_started + 1

    def resume(self, pause_at: int | None = None) -> None:
        """Let held steps run; with `pause_at`, hold again from that step on."""
        with self._cond:
            self._paused_from = pause_at
            self._cond.notify_all()

    def fail_next_step(self, exc: BaseException) -> None:
        with self._cond:
            self._failures.append(exc)

    def wait_for_steps(self, num_steps: int) -> None:
        """Block until `num_steps` steps have started (a paused one counts)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._num_started >= num_steps, WAIT_S):
                raise TimeoutError(f"{self._num_started} of {num_steps} steps started")

    @property
    def num_steps(self) -> int:
        with self._cond:
            return self._num_started

    # ---- GenerativeBackend (the step thread) -------------------------------------------

    def capacity(self) -> Capacity:
        return self._capacity

    def tokenizer(self) -> Tokenizer:
        return FakeTokenizer()

    def info(self) -> BackendInfo:
        return BackendInfo(backend="fake", device="CPU", model_path="fake.gguf")

    def execute(self, batch: StepPlan) -> StepResult:
        with self._cond:
            self._num_started += 1
            self._cond.notify_all()
            step = self._num_started
            if not self._cond.wait_for(lambda: self._paused_from is None or step < self._paused_from, WAIT_S):
                raise TimeoutError("the test never resumed the backend")
            self.batches.append(batch)
            failure = self._failures.pop(0) if self._failures else None
        if failure is not None:
            raise failure
        return self.script.execute(batch)

    def release(self, seq_ids: Collection[int]) -> None:
        self.released_seq_ids.extend(seq_ids)
        self.script.released_seq_ids.update(seq_ids)

    def clear_slots(self, slots: Collection[int]) -> None:
        if self.fail_clear_slots:
            raise RuntimeError("clear_slots failed")
        for slot in slots:
            self.cleared_slots.append(slot)
            self.script.slots[slot] = []

    def close(self) -> None:
        self.closed = True
