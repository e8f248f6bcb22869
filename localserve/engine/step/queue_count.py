"""The queue limit's count of one model's waiting requests, read from its
scheduler: `Engine.submit` refuses a request (503) when `num_waiting` reaches
`--max-queue`.

Waiting means what the scheduler holds back (for a slot, KV room or the
batch rules; `Scheduler.num_held`), plus the new requests, in the scheduler
(`Scheduler.num_new`) or still in the step thread's inbox, beyond its free
slots. The step thread publishes its queue (`QueueView`, replaced whole)
after every change and before it waits on anything, so the count never lags
it by a step or an idle spell; what the event loop sent since counts at
once: a new request as new, an abort as one fewer (it may have been a
running request's, which errs towards accepting work, never refusing it).
"""

from __future__ import annotations

from dataclasses import dataclass

from localserve.engine.step.scheduler import Scheduler


@dataclass(frozen=True, slots=True)
class QueueView:
    """The scheduler's queue as the step thread last left it, with how many
    inbox messages it had taken in by then."""

    num_adds_taken: int = 0  # add messages taken from the inbox (queued or refused)
    num_aborts_taken: int = 0
    num_held: int = 0  # waiting sequences a schedule() left waiting
    num_new: int = 0  # waiting sequences no schedule() has seen yet
    num_free_slots: int = 0


class QueueCount:
    """Messages are counted as sent on the event loop and as taken in on the
    step thread; each counter has one writer, and the view is one object."""

    def __init__(self, num_slots: int) -> None:
        self._num_adds_sent = 0  # event loop
        self._num_aborts_sent = 0
        self._num_adds_taken = 0  # step thread
        self._num_aborts_taken = 0
        self._view = QueueView(num_free_slots=num_slots)

    # ---- the event loop -----------------------------------------------------

    def sent_add(self) -> None:
        self._num_adds_sent += 1

    def sent_abort(self) -> None:
        self._num_aborts_sent += 1

    @property
    def num_waiting(self) -> int:
        view = self._view  # read once: one moment of the scheduler
        num_new = view.num_new + self._num_adds_sent - view.num_adds_taken
        num_aborts = self._num_aborts_sent - view.num_aborts_taken
        return max(0, view.num_held + max(0, num_new - view.num_free_slots) - num_aborts)

    # ---- the step thread ----------------------------------------------------

    def took_add(self) -> None:
        self._num_adds_taken += 1

    def took_abort(self) -> None:
        self._num_aborts_taken += 1

    def publish(self, scheduler: Scheduler) -> None:
        """After every change to the scheduler's queue, before any wait."""
        self._view = QueueView(
            num_adds_taken=self._num_adds_taken,
            num_aborts_taken=self._num_aborts_taken,
            num_held=scheduler.num_held,
            num_new=scheduler.num_new,
            num_free_slots=scheduler.capacity.num_slots - scheduler.num_running,
        )
