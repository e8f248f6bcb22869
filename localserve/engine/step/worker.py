"""One step thread per loaded generative model: it alone owns the model's
`Scheduler` and `Backend`. The event loop talks to it through an inbox of
messages and receives token events through `loop.call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from localserve.engine.backend import GenerativeBackend
from localserve.engine.step.batch_policy import BatchPolicySnapshot
from localserve.engine.step.output_processor import OutputProcessor
from localserve.engine.step.prefix_disk import DiskPrefixStore
from localserve.engine.step.queue_count import QueueCount
from localserve.engine.step.scheduler import Scheduler, SchedulerConfig
from localserve.engine.step.sequence import SeqStatus
from localserve.engine.step.stats import ModelStats, SchedulerSnapshot, StepPublisher
from localserve.engine.threads import ThreadChooser, ThreadState, shared_cpu_use
from localserve.engine.types import FinishReason, GenerateRequest, StepPlan, StepResult, TokenEvent

log = logging.getLogger(__name__)

TRUSTED_AFTER_STEPS = 50  # steps the step-time model learns from before they choose threads
SLOW_STEP_S = 2.0  # a step longer than this is logged with its shape (a stall every running request feels)


@dataclass(frozen=True, slots=True)
class _Add:
    request: GenerateRequest
    submitted_at: float  # the start of its queue wait and of its time to first token


@dataclass(frozen=True, slots=True)
class _Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class _Stop:
    pass


@dataclass(frozen=True, slots=True)
class _Wake:
    """A prefix was read ahead from disk: a waiting sequence may be admitted."""


Message = _Add | _Abort | _Stop | _Wake
Dispatch = Callable[[list[TokenEvent]], None]


class StepWorker:
    """Runs the step loop (docs/architecture.md) for one model on its own thread."""

    def __init__(
        self,
        name: str,
        backend: GenerativeBackend,
        dispatch: Dispatch,
        loop: asyncio.AbstractEventLoop,
        *,
        scheduler_config: SchedulerConfig | None = None,
        stats: ModelStats | None = None,
        disk: DiskPrefixStore | None = None,
        adaptive_threads: bool = False,
    ) -> None:
        tokenizer = backend.tokenizer()
        self.backend = backend
        self.disk = disk
        if disk is not None:
            disk.on_read = lambda: self._inbox.put(_Wake())
        capacity = backend.capacity()
        output = OutputProcessor(
            eog_token_ids=tokenizer.eog_token_ids, token_bytes=tokenizer.token_bytes, n_ctx=capacity.n_ctx
        )
        self.scheduler = Scheduler(capacity, config=scheduler_config, disk=disk, output=output)
        self.stats = stats or ModelStats()
        self._dispatch = dispatch
        self._loop = loop
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"step-{name}", daemon=True)
        self._crashed = False
        self.warmed_up = threading.Event()  # set once the backend has run its warm-up, here on the step thread
        self.queue_count = QueueCount(self.scheduler.capacity.num_slots)  # the queue limit's count
        self.publisher = StepPublisher(self.scheduler, self.stats, self.queue_count, disk)
        # The CPU threads of the next step (engine/threads.py): chosen per window when adaptive.
        threads = backend.cpu_threads()
        self.threads: ThreadChooser | None = None
        if adaptive_threads and threads > 1:
            self.threads = ThreadChooser(threads, busy_elsewhere=shared_cpu_use().busy_elsewhere)
        self.thread_state = ThreadState(threads, threads, self.threads is not None, 0.0, 0)

    def start(self) -> None:
        self._thread.start()

    @property
    def snapshot(self) -> SchedulerSnapshot:
        """The scheduler's last published state (any thread)."""
        return self.publisher.snapshot

    @property
    def batch_policy(self) -> BatchPolicySnapshot:
        """What batch admission did in the last published step (any thread)."""
        return self.publisher.batch_policy

    def add(self, request: GenerateRequest) -> None:
        """Queue a request (on the event loop, like `abort` and `num_waiting`)."""
        self.queue_count.sent_add()
        self._inbox.put(_Add(request, time.monotonic()))

    def abort(self, request_id: str) -> None:
        self.queue_count.sent_abort()
        self._inbox.put(_Abort(request_id))

    def stop(self, timeout: float | None = None) -> None:
        self._inbox.put(_Stop())
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._crashed

    @property
    def num_waiting(self) -> int:
        """Requests that wait for a slot, as the scheduler counts them
        (`engine/step/queue_count.py`); read on the event loop."""
        return self.queue_count.num_waiting

    # ---- the loop ------------------------------------------------------------

    def _warm_up(self) -> None:
        """The backend's first run, on this thread (GenerativeBackend.warm_up);
        a failure only costs the first request its speed."""
        try:
            self.backend.warm_up()
        except Exception:
            log.warning("the warm-up of %s failed; the first request pays for it", self._thread.name, exc_info=True)
        finally:
            self.warmed_up.set()

    def _run(self) -> None:
        self._warm_up()
        try:
            # The scheduler starts with empty slots; make the KV cache agree.
            self.backend.clear_slots(range(self.scheduler.capacity.num_slots))
            # A sequence whose saved prefix is still being read from disk is no
            # work yet: the loop sleeps until the reader's _Wake (or a message).
            idle_from: float | None = None  # when the loop last ran out of ready work
            while True:
                ready = self.scheduler.has_ready_work()
                if not ready and idle_from is None:
                    idle_from = time.monotonic()
                if not self._drain_inbox(block=not ready):
                    break
                if self.scheduler.has_ready_work():
                    if idle_from is not None:
                        if self.threads is not None:  # the CPU reading restarts with the work
                            self.threads.resume(time.monotonic() - idle_from)
                        idle_from = None
                    self._step()
                # Before blocking on an empty inbox, publish the idle state, or
                # readers would see finished requests as running.
                self._publish(force=not self.scheduler.has_work())
            self._save_to_disk()
        except BaseException as exc:  # never leave callers hanging; the thread ends (`alive`)
            log.exception("step loop of %s crashed", self._thread.name)
            self._crashed = True  # `alive` is False from here: nothing new is queued
            message = f"the step loop crashed: {exc}"
            self._fail_everything(message, self._refuse_inbox(message))
        finally:
            self._publish(force=True)

    def _save_to_disk(self) -> None:
        """At unload and shutdown: every slot's whole blocks go to the disk tier
        (the writes finish before the backend closes, within a bound)."""
        if self.disk is None:
            return
        try:
            batch = self.scheduler.save_ops()
            if batch.kv_ops:
                self._hand_over(self.backend.execute(batch))
        except Exception:  # the cache may forget; the unload goes on
            log.exception("could not save the prefix cache of %s to disk", self._thread.name)
        self.disk.close()

    def _hand_over(self, result: StepResult) -> None:
        """Saved KV states go to the disk tier's writer thread."""
        if self.disk is not None:
            for key, (num_tokens, payload) in result.saved.items():
                self.disk.put(key, num_tokens, payload)

    def _drain_inbox(self, *, block: bool) -> bool:
        """Apply queued messages. False when asked to stop."""
        events: list[TokenEvent] = []
        try:
            message = self._inbox.get(block=block)
            while True:
                if isinstance(message, _Stop):
                    self._fail_everything("the server is shutting down", events)
                    return False
                if isinstance(message, _Add):
                    events.extend(self._add(message))
                elif isinstance(message, _Abort):
                    self.queue_count.took_abort()
                    event = self.scheduler.abort(message.request_id)
                    if event is not None:
                        events.append(event)
                message = self._inbox.get_nowait()
        except queue.Empty:
            pass
        finally:
            self.publisher.queue()
            if events:
                self._post(events)
        return True

    def _add(self, message: _Add) -> list[TokenEvent]:
        self.queue_count.took_add()
        request = message.request
        try:
            self.scheduler.add(request)
        except ValueError as exc:  # the API validates first; this is the last guard
            return [_error_event(request.request_id, str(exc), len(request.prompt_token_ids))]
        self.stats.request_arrived(request.request_id, request.priority, message.submitted_at)
        return []

    def _step(self) -> None:
        """One step: plan, compute, apply (docs/architecture.md, "The step loop")."""
        plan = self.scheduler.schedule()
        result = self._execute(plan)
        self._after_step(plan, result, self.scheduler.update(plan, result))

    def _execute(self, plan: StepPlan) -> StepResult:
        """The backend's forward pass over `plan`, timed. A failure is a
        result too (`error`): the backend's KV of the slots the step touched
        is cleared, and `update` ends the step's sequences."""
        self.publisher.step_started(self._running_request_ids(), time.monotonic())
        if plan.empty:
            # Everything waits on room that a running sequence will free; never
            # spin: nothing runs, so this only happens on a scheduler bug.
            log.error("scheduler produced an empty step with work pending")
            self._fail_everything("internal error: the scheduler could not place any request")
            return StepResult({}, error="internal error: an empty step")
        started = time.monotonic()
        try:
            result = self.backend.execute(plan)
            self._hand_over(result)
        except Exception as exc:
            log.exception("step %d failed", plan.step_id)
            failed = StepResult({}, error=f"the backend failed in this step: {exc}", seconds=time.monotonic() - started)
            try:
                self.backend.clear_slots(Scheduler.touched_slots(plan))
                self.backend.release([c.seq_id for c in plan.chunks])
            except BaseException:  # the loop ends; let the step's requests go first
                self._post(self.scheduler.update(plan, failed))
                raise
            return failed
        return dataclasses.replace(result, seconds=time.monotonic() - started)

    def _after_step(self, plan: StepPlan, result: StepResult, events: list[TokenEvent]) -> None:
        """Figures, the next step's threads, and the events out."""
        if result.seconds is not None and result.seconds > SLOW_STEP_S:
            log.warning(
                "%s: a step took %.1f s (%d sequences, %d tokens, %d drafted); every running request waited on it",
                self._thread.name,
                result.seconds,
                len(plan.chunks),
                plan.num_tokens,
                sum(chunk.num_draft for chunk in plan.chunks),
            )
        if plan.empty:
            self.publisher.queue()
        else:
            self.publisher.step_ended(len(plan.chunks), result.seconds or 0.0)
        if self.threads is not None and result.error is None:
            self._choose_threads()
        if events:
            self._post(events)

    def _choose_threads(self) -> None:
        """The step's time against the step-time model's prediction, and the
        CPU other programs take, choose the next step's thread count."""
        assert self.threads is not None
        model = self.scheduler.policy.model
        if model.num_observations < TRUSTED_AFTER_STEPS:
            # The step-time model still predicts from its prior (1 ms a token):
            # every decode looks slow, and a trial judged on that is noise.
            return
        before = self.threads.threads
        after = self.threads.observe(model.last_measured_s, model.last_predicted_s)
        if after != before:
            try:
                self.backend.set_cpu_threads(after)
            except Exception:  # keep serving on the count it has
                log.exception("could not change the thread count of %s; it stays fixed", self._thread.name)
                self.threads = None
            else:
                log.debug("%s: %d -> %d threads (%s)", self._thread.name, before, after, self.threads.why)

    def _running_request_ids(self) -> list[str]:
        ids = []
        for seq in self.scheduler.sequences():  # running ones first
            if seq.status is not SeqStatus.RUNNING:
                break
            ids.append(seq.request_id)
        return ids

    def _post(self, events: list[TokenEvent]) -> None:
        # Every event leaves through here: the one place that times tokens and ends.
        self.stats.record_events(events, time.monotonic())
        if any(event.finished for event in events):
            # Whoever reads the stats after a request's end must not see it still running.
            self._publish(force=True)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
            self._loop.call_soon_threadsafe(self._dispatch, events)

    def _refuse_inbox(self, message: str) -> list[TokenEvent]:
        """Error events for the requests still in the inbox when the loop ends,
        which the scheduler never saw (their streams would wait forever)."""
        events = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._inbox.get_nowait()
                if isinstance(item, _Add):
                    self.queue_count.took_add()
                    request = item.request
                    events.append(_error_event(request.request_id, message, len(request.prompt_token_ids)))
        return events

    def _fail_everything(self, message: str, events: list[TokenEvent] | None = None) -> None:
        events = events if events is not None else []
        for seq in list(self.scheduler.sequences()):
            event = self.scheduler.abort(seq.request_id)
            if event is not None:
                events.append(_error_event(seq.request_id, message, seq.num_prompt_tokens, event))
        if events:
            self._post(events)

    def _publish(self, *, force: bool = False) -> None:
        self.publisher.publish(force=force)
        if self.threads is not None:
            self.thread_state = self.threads.state()


def _error_event(request_id: str, message: str, num_prompt: int, base: TokenEvent | None = None) -> TokenEvent:
    return TokenEvent(
        request_id=request_id,
        token_ids=(),
        text="",
        finish_reason=FinishReason.ERROR,
        error=message,
        num_prompt_tokens=num_prompt,
        num_output_tokens=base.num_output_tokens if base else 0,
        num_cached_tokens=base.num_cached_tokens if base else 0,
    )
