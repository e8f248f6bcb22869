"""Fault injection as a backend: `FaultInjectingBackend` wraps a model's
`GenerativeBackend` and raises inside the steps it is told to fail, as a
failing device would. The step loop knows nothing of it; a model runs through
it only when it was loaded so (the debug fault route, `LOCALSERVE_ENABLE_FAULTS=1`,
wraps every model the engine adds; tests wrap their own backends).

`WrappedBackend` is the delegation both build on: a test that needs to hold
or watch a model's steps overrides `execute` on it.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any

from localserve.engine.backend import BackendInfo, GenerativeBackend, Tokenizer
from localserve.engine.types import Capacity, SamplingParams, StepPlan, StepResult

#: The number of steps that means "every step, until `clear()`".
EVERY_STEP = 1 << 62


class InjectedFault(RuntimeError):
    """What a step that was told to fail raises."""


class WrappedBackend(GenerativeBackend):
    """`inner`, method for method; attributes beyond the interface (a
    backend's own, read by its tests) reach `inner` through `__getattr__`."""

    def __init__(self, inner: GenerativeBackend) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def capacity(self) -> Capacity:
        return self.inner.capacity()

    def tokenizer(self) -> Tokenizer:
        return self.inner.tokenizer()

    def info(self) -> BackendInfo:
        return self.inner.info()

    def warm_up(self) -> None:
        self.inner.warm_up()

    def cpu_threads(self) -> int:
        return self.inner.cpu_threads()

    def set_cpu_threads(self, threads: int) -> None:
        self.inner.set_cpu_threads(threads)

    def execute(self, batch: StepPlan) -> StepResult:
        return self.inner.execute(batch)

    def release(self, seq_ids: Collection[int]) -> None:
        self.inner.release(seq_ids)

    def clear_slots(self, slots: Collection[int]) -> None:
        self.inner.clear_slots(slots)

    def metadata(self) -> dict[str, Any]:
        return self.inner.metadata()

    def validate(self, params: SamplingParams) -> None:
        self.inner.validate(params)

    def kv_state_identity(self) -> str | None:
        return self.inner.kv_state_identity()

    def close(self) -> None:
        self.inner.close()


class FaultInjectingBackend(WrappedBackend):
    """Raises `InjectedFault` in chosen steps instead of computing them.

    `fail_steps` is called from any thread (the event loop, a test); the step
    thread consumes what it armed, so both go through one lock. A model that
    was never armed pays one lock per step, and only when it was wrapped.
    """

    def __init__(self, inner: GenerativeBackend) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self._num_good = 0  # steps still to compute before the failing ones
        self._num_failing = 0

    def fail_steps(self, num_steps: int = 1, *, after: int = 0) -> None:
        """Let the next `after` steps run, then fail `num_steps` steps
        (`EVERY_STEP`: all of them, until `clear`). Replaces what was armed."""
        if num_steps < 1 or after < 0:
            raise ValueError("fail at least one step, after zero or more")
        with self._lock:
            self._num_good, self._num_failing = after, num_steps

    def clear(self) -> None:
        """Fail no more steps."""
        with self._lock:
            self._num_good = self._num_failing = 0

    def execute(self, batch: StepPlan) -> StepResult:
        with self._lock:
            fail = self._num_failing > 0 and self._num_good == 0
            if fail:
                self._num_failing -= 1
            elif self._num_failing:
                self._num_good -= 1
        if fail:
            raise InjectedFault(f"injected fault in step {batch.step_id}")
        return self.inner.execute(batch)
