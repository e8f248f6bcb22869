"""The dynamic one-shot queue for one-shot models (embeddings, speech recognition).

Callers `await queue.submit(items)` on the event loop. One thread per model
runs dispatches one after another, continuous batching for one-shot work:

* an item that finds the model idle leaves at once, alone if it is alone
  (batching never makes an unloaded server slower);
* items that arrive while a dispatch runs wait for it, and then leave
  together in the next dispatch, up to `max_batch_size` items and
  `max_batch_tokens` of work, taken in priority order with aging (so nobody
  starves); the rest go in the dispatch after.

A dispatch is split by group key and, for a padded backend, by length (so
padding stays small), and `backend.run` is called once per group. Each
caller gets its own outputs back in its own order; a group that fails fails
only its callers. `max_wait_ms` (default 0) optionally lets an idle model
wait that long for company before a dispatch that is not full.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from localserve.engine.backend import OneShotBackend
from localserve.engine.oneshot.plan import choose_dispatch, padding_of, plan_groups
from localserve.engine.oneshot.stats import OneShotQueueSnapshot, OneShotQueueStats
from localserve.engine.threads import ThreadChooser, shared_cpu_use
from localserve.engine.types import PRIORITY_ALIASES
from localserve.errors import BackendError, EngineStoppedError, LocalServeError, QueueFullError

log = logging.getLogger(__name__)

ItemT = TypeVar("ItemT")
OutputT = TypeVar("OutputT")


@dataclass(frozen=True, slots=True)
class OneShotQueueConfig:
    """When a dispatch leaves, how big it may be, and how it is grouped."""

    max_batch_size: int = 32  # items per dispatch
    max_batch_tokens: int = 16384  # summed item sizes per dispatch (tokens, audio frames)
    # An idle model dispatches at once; set this > 0 only where one bigger batch
    # is worth a delay (a GPU with a high fixed cost per call): then an item
    # that finds the model idle waits up to this long for company. Items that
    # arrived during a dispatch never wait longer than that dispatch.
    max_wait_ms: float = 0.0
    max_queue: int = 256  # waiting requests before QueueFullError (503)
    group_by_length: bool = True  # sort by size and split so padding stays small
    max_padding: float = 0.25  # a length group closes before its padding passes this share
    aging_s: float = 30.0  # waiting this long improves the priority by one level


@dataclass(slots=True, eq=False)
class _Request(Generic[OutputT]):
    """One caller: its future, its outputs so far, and how many are missing."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[list[OutputT]]
    outputs: list[Any]
    num_missing: int
    num_undispatched: int
    cancelled: bool = False


@dataclass(slots=True)
class _Entry(Generic[ItemT]):
    request: _Request[Any]
    index: int  # position in the request's items
    item: ItemT
    size: int
    key: Hashable
    priority: float
    arrival: float
    order: int  # FIFO tie-break, one per request (its items then go shortest first)
    through_dispatch: bool  # it waited while a dispatch ran: it leaves in the next one, with no extra wait


class OneShotQueue(Generic[ItemT, OutputT]):
    """Dynamic batching in front of one `OneShotBackend`, on its own thread."""

    def __init__(
        self,
        name: str,
        backend: OneShotBackend[ItemT, OutputT],
        config: OneShotQueueConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        adaptive_threads: bool = False,
    ) -> None:
        self.name = name
        self.backend = backend
        self.config = config or OneShotQueueConfig()
        self._clock = clock  # arrivals, aging and the optional wait (tests pass a fake one)
        info = backend.info()
        self._backend_name, self._device = info.backend, info.device
        self._cond = threading.Condition()
        self._pending: list[_Entry[ItemT]] = []
        self._busy = False  # a dispatch is running (set and cleared by the thread, under the lock)
        self._num_waiting_requests = 0
        self._num_in_flight = 0
        self._order = itertools.count()
        self._stats = OneShotQueueStats()
        self._stopping = False
        # --threads auto: each run on the cores other programs leave free (engine/threads.py)
        threads = backend.cpu_threads()
        self.threads: ThreadChooser | None = None
        if adaptive_threads and threads > 1:
            self.threads = ThreadChooser(threads, busy_elsewhere=shared_cpu_use().busy_elsewhere)
        self._thread = threading.Thread(target=self._run, name=f"oneshot-{name}", daemon=True)
        self._thread.start()

    # ---- event loop side -------------------------------------------------------

    async def submit(self, items: Sequence[ItemT], *, priority: float = PRIORITY_ALIASES["default"]) -> list[OutputT]:
        """The outputs for `items`, in their order. Raises `QueueFullError`
        when too many requests wait, `BackendError` when a batch with one of
        them failed, `EngineStoppedError` when the model is closing."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        request: _Request[OutputT] = _Request(loop, loop.create_future(), [None] * len(items), len(items), len(items))
        sizes = [max(1, int(self.backend.item_size(item))) for item in items]
        keys = [self.backend.group_key(item) for item in items]
        with self._cond:
            now = self._clock()
            if self._stopping or not self._thread.is_alive():
                raise EngineStoppedError(f"model {self.name!r} is not running (shut down or crashed); reload it")
            if self._num_waiting_requests >= self.config.max_queue:
                self._stats.num_rejected += 1
                raise QueueFullError(
                    f"model {self.name!r} has {self._num_waiting_requests} requests waiting "
                    f"(limit {self.config.max_queue}); retry shortly",
                    retry_after_s=1,
                )
            order = next(self._order)
            for index, item in enumerate(items):
                entry = _Entry(request, index, item, sizes[index], keys[index], priority, now, order, self._busy)
                self._pending.append(entry)
            self._num_waiting_requests += 1
            self._num_in_flight += 1
            self._stats.num_requests += 1
            self._cond.notify()
        try:
            return await request.future
        except asyncio.CancelledError:
            request.cancelled = True  # its undispatched items are dropped
            raise
        finally:
            with self._cond:
                self._num_in_flight -= 1

    def close(self, timeout: float | None = None) -> None:
        """Stop the thread after the running group; waiting callers get
        `EngineStoppedError`. Blocking: call it off the event loop."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ---- the batching thread ---------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                dispatch = self._collect()
                if dispatch is None:
                    break
                try:
                    self._dispatch(dispatch)
                finally:
                    with self._cond:
                        self._busy = False
        except BaseException as exc:  # never leave callers hanging
            log.exception("queue %s crashed", self.name)
            self._fail_pending(EngineStoppedError(f"model {self.name!r} stopped: {exc}"))
            raise
        self._fail_pending(EngineStoppedError(f"model {self.name!r} is shutting down"))

    def _collect(self) -> list[_Entry[ItemT]] | None:
        """Wait for work, then take one dispatch in priority order: at once,
        unless the optional `max_wait_ms` lets an idle model wait for company."""
        with self._cond:
            while True:
                self._drop_cancelled()
                if self._stopping:
                    return None
                if not self._pending:
                    self._cond.wait()
                    continue
                remaining = self._wait_left()
                if remaining <= 0:
                    self._busy = True
                    return self._take()
                self._cond.wait(remaining)

    def _wait_left(self) -> float:
        """Seconds the pending items still wait for company (0: dispatch now).
        Only with `max_wait_ms` > 0, and only while nothing pending has already
        waited through a dispatch and the next dispatch is not full."""
        cfg = self.config
        if cfg.max_wait_ms <= 0 or any(e.through_dispatch for e in self._pending):
            return 0.0
        if len(self._pending) >= cfg.max_batch_size or sum(e.size for e in self._pending) >= cfg.max_batch_tokens:
            return 0.0
        oldest = min(e.arrival for e in self._pending)
        return oldest + cfg.max_wait_ms / 1000.0 - self._clock()

    def _take(self) -> list[_Entry[ItemT]]:
        cfg = self.config
        chosen = choose_dispatch(
            self._pending,
            self._clock(),
            max_batch_size=cfg.max_batch_size,
            max_batch_tokens=cfg.max_batch_tokens,
            aging_s=cfg.aging_s,
        )
        taken = {id(e) for e in chosen}
        self._pending = [e for e in self._pending if id(e) not in taken]
        for entry in self._pending:  # what did not fit waits through this dispatch
            entry.through_dispatch = True
        for entry in chosen:
            entry.request.num_undispatched -= 1
            if entry.request.num_undispatched == 0:
                self._num_waiting_requests -= 1
        return chosen

    def _drop_cancelled(self) -> None:
        kept = []
        for entry in self._pending:
            if entry.request.cancelled:
                entry.request.num_undispatched -= 1
                if entry.request.num_undispatched == 0:
                    self._num_waiting_requests -= 1
            else:
                kept.append(entry)
        self._pending = kept

    def _dispatch(self, dispatch: list[_Entry[ItemT]]) -> None:
        by_key: dict[Hashable, list[_Entry[ItemT]]] = {}
        for entry in dispatch:
            by_key.setdefault(entry.key, []).append(entry)
        self._stats.num_dispatches += 1  # only this thread writes it
        for entries in by_key.values():
            groups = plan_groups(
                [e.size for e in entries],
                by_length=self.config.group_by_length,
                padding_free=self.backend.padding_free,
                max_padding=self.config.max_padding,
            )
            for group in groups:
                self._run_group([entries[i] for i in group])

    def _follow_threads(self) -> None:
        assert self.threads is not None
        before = self.threads.threads
        after = self.threads.follow_reading()
        if after != before:
            try:
                self.backend.set_cpu_threads(after)
            except Exception:  # keep serving on the count it has
                log.exception("could not change the thread count of %s; it stays fixed", self.name)
                self.threads = None

    def _run_group(self, group: list[_Entry[ItemT]]) -> None:
        group = [e for e in group if not e.request.cancelled and not e.request.future.done()]
        if not group:
            return
        if self.threads is not None:
            self._follow_threads()
        started = time.monotonic()
        try:
            outputs = self.backend.run([e.item for e in group])
            if len(outputs) != len(group):
                raise BackendError(f"the backend returned {len(outputs)} outputs for {len(group)} items")
        except Exception as exc:
            log.exception("batch of %d items on %s failed", len(group), self.name)
            error = (
                exc if isinstance(exc, LocalServeError) else BackendError(f"the backend failed in this batch: {exc}")
            )
            self._record(group, started, failed=True)
            _post_all([(request, _fail, error) for request in {id(e.request): e.request for e in group}.values()])
            return
        self._record(group, started, failed=False)
        by_request: dict[int, list[tuple[int, OutputT]]] = {}
        for entry, output in zip(group, outputs, strict=True):
            by_request.setdefault(id(entry.request), []).append((entry.index, output))
        posts = []
        for entry in group:
            results = by_request.pop(id(entry.request), None)
            if results is not None:
                posts.append((entry.request, _deliver, results))
        _post_all(posts)

    def _record(self, group: list[_Entry[ItemT]], started: float, *, failed: bool) -> None:
        sizes = [e.size for e in group]
        padded = 0 if self.backend.padding_free else padding_of(sizes)
        num_failed = len({id(e.request) for e in group}) if failed else 0
        self._stats.record_run(len(group), sum(sizes), padded, time.monotonic() - started, num_failed)

    def _fail_pending(self, error: LocalServeError) -> None:
        with self._cond:
            requests = {id(e.request): e.request for e in self._pending}
            self._pending = []
            self._num_waiting_requests = 0
        _post_all([(request, _fail, error) for request in requests.values()])

    # ---- stats -----------------------------------------------------------------

    def stats(self, recent_s: float = 10.0) -> OneShotQueueSnapshot:
        """A snapshot for the dashboard and /metrics (cheap; any thread)."""
        with self._cond:
            queue_items, queue_requests = len(self._pending), self._num_waiting_requests
            in_flight, dispatching = self._num_in_flight, self._busy
        cfg, figures = self.config, self._stats.snapshot(recent_s)
        return OneShotQueueSnapshot(
            backend=self._backend_name,
            device=self._device,
            queue_items=queue_items,
            queue_requests=queue_requests,
            in_flight=in_flight,
            dispatching=dispatching,
            **{f.name: getattr(figures, f.name) for f in dataclasses.fields(figures)},  # totals and rates
            padding_free=self.backend.padding_free,
            max_batch_size=cfg.max_batch_size,
            max_batch_tokens=cfg.max_batch_tokens,
            max_wait_ms=cfg.max_wait_ms,
            max_queue=cfg.max_queue,
            group_by_length=cfg.group_by_length,
        )


# ---- delivery on the caller's loop ---------------------------------------------------


def _post_all(posts: list[tuple[_Request[Any], Any, Any]]) -> None:
    """Run each `fn(request, arg)` on its request's loop: one
    `call_soon_threadsafe` per loop (each call writes to the loop's wake-up
    pipe; a batch of 32 from one server is one write, not 32)."""
    by_loop: dict[int, tuple[asyncio.AbstractEventLoop, list[tuple[_Request[Any], Any, Any]]]] = {}
    for post in posts:
        by_loop.setdefault(id(post[0].loop), (post[0].loop, []))[1].append(post)
    for loop, calls in by_loop.values():
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody is listening
            loop.call_soon_threadsafe(_run_posts, calls)


def _run_posts(calls: list[tuple[_Request[Any], Any, Any]]) -> None:
    for request, fn, arg in calls:
        try:
            fn(request, arg)
        except Exception:  # one caller's failure must not strand the others
            log.exception("delivering a batch result failed")


def _deliver(request: _Request[Any], results: list[tuple[int, Any]]) -> None:
    if request.future.done():
        return
    for index, output in results:
        request.outputs[index] = output
    request.num_missing -= len(results)
    if request.num_missing == 0:
        request.future.set_result(request.outputs)


def _fail(request: _Request[Any], error: BaseException) -> None:
    if not request.future.done():
        request.future.set_exception(error)
