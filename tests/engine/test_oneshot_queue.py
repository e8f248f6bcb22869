"""The one-shot one-shot queue against a recording fake backend.

Batching decisions are checked by state and order, not by wall-clock
thresholds: the model is held busy with a gate, and the queue's clock
(arrivals, aging, the optional wait) is a fake one the tests move.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable, Hashable, Sequence

import pytest

from localserve.engine.backend import BackendInfo, OneShotBackend
from localserve.engine.oneshot.plan import choose_dispatch, padding_of, plan_groups
from localserve.engine.oneshot.queue import OneShotQueue, OneShotQueueConfig
from localserve.errors import BackendError, EngineStoppedError, QueueFullError

# A queue that waited on its (frozen) clock would hang a test: fail it soon instead.
pytestmark = pytest.mark.timeout(20)


class FakeBackend(OneShotBackend[str, str]):
    """Upper-cases items; size is the item's length; key is its first
    character when `keyed`. Records every run; can be held (`gate`, or one
    run per `permits.release()`) or made to fail."""

    def __init__(self, *, padding_free: bool = False, keyed: bool = False, stepped: bool = False) -> None:
        self.padding_free = padding_free
        self.keyed = keyed
        self.runs: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.started: queue.SimpleQueue[list[str]] = queue.SimpleQueue()  # each run's items, as it starts
        self.permits = threading.Semaphore(0) if stepped else None

    def run(self, items: Sequence[str]) -> list[str]:
        self.entered.set()
        self.started.put(list(items))
        if self.permits is not None:
            self.permits.acquire(timeout=10)
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        self.runs.append(list(items))
        if any("boom" in item for item in items):
            raise RuntimeError("the model exploded")
        return [item.upper() for item in items]

    def item_size(self, item: str) -> int:
        return len(item)

    def group_key(self, item: str) -> Hashable:
        return item[0] if self.keyed else None

    def info(self) -> BackendInfo:
        return BackendInfo(backend="fake", device="CPU", model_path="")


class FakeClock:
    """The queue's clock, frozen until a test moves it: any decision that
    waited on it would never be taken."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def make(backend: FakeBackend, clock: FakeClock | None = None, **config: float | int | bool) -> OneShotQueue[str, str]:
    return OneShotQueue("fake", backend, OneShotQueueConfig(**config), clock=clock or FakeClock())  # type: ignore[arg-type]


async def close(queue: OneShotQueue[str, str]) -> None:
    await asyncio.to_thread(queue.close, 10)


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the event loop run until `condition()` holds (fails after `timeout`)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


async def hold_busy(backend: FakeBackend, queue: OneShotQueue[str, str], size: int = 1) -> asyncio.Task[list[str]]:
    """Start a dispatch of `size` "block" items and keep it running until `backend.gate.set()`."""
    backend.gate.clear()
    blocker = asyncio.create_task(queue.submit(["block"] * size))
    await asyncio.to_thread(backend.entered.wait, 5)
    assert queue.stats().dispatching
    return blocker


async def started_run(backend: FakeBackend) -> list[str]:
    return await asyncio.to_thread(backend.started.get, True, 5)


# ---- grouping (pure) -----------------------------------------------------------------


def test_plan_groups_sorts_by_length_and_keeps_padding_small():
    sizes = [20, 5, 7, 25, 5, 6, 8]
    groups = plan_groups(sizes, by_length=True, padding_free=False, max_padding=0.25)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    for group in groups:
        group_sizes = [sizes[i] for i in group]
        assert group_sizes == sorted(group_sizes)
        assert padding_of(group_sizes) <= 0.25 * sum(group_sizes)
    padded_on = sum(padding_of([sizes[i] for i in g]) for g in groups)
    assert padded_on < padding_of(sizes)


def test_plan_groups_without_length_grouping_or_padding_is_one_group():
    sizes = [20, 5, 7]
    assert plan_groups(sizes, by_length=False, padding_free=False, max_padding=0.25) == [[0, 1, 2]]
    assert plan_groups(sizes, by_length=True, padding_free=True, max_padding=0.25) == [[1, 2, 0]]
    assert plan_groups([], by_length=True, padding_free=False, max_padding=0.25) == []


# ---- batching: at once when idle, together while busy ------------------------------------


async def test_an_item_finding_the_model_idle_is_dispatched_at_once():
    backend = FakeBackend()
    queue = make(backend)  # the clock never moves: a wait for company would never end
    assert OneShotQueueConfig().max_wait_ms == 0
    assert await asyncio.wait_for(queue.submit(["solo"]), 5) == ["SOLO"]
    assert await asyncio.wait_for(queue.submit(["again", "two"]), 5) == ["AGAIN", "TWO"]
    assert backend.runs == [["solo"], ["two", "again"]]  # each alone: nothing else was waiting
    assert queue.stats().dispatches == 2
    await close(queue)


async def test_items_arriving_during_a_dispatch_leave_together_in_the_next_one():
    backend = FakeBackend(padding_free=True)
    queue = make(backend, max_batch_size=64)
    blocker = await hold_busy(backend, queue)
    waiting = [asyncio.create_task(queue.submit([f"item{i}"])) for i in range(5)]
    waiting.append(asyncio.create_task(queue.submit(["pair-a", "pair-b"])))
    await until(lambda: queue.stats().queue_items == 7)
    assert len(backend.runs) == 0  # nothing left while the model was busy
    backend.gate.set()
    assert await blocker == ["BLOCK"]
    outputs = await asyncio.gather(*waiting)
    assert outputs == [[f"ITEM{i}"] for i in range(5)] + [["PAIR-A", "PAIR-B"]]
    assert backend.runs[0] == ["block"]
    assert sorted(backend.runs[1]) == sorted([f"item{i}" for i in range(5)] + ["pair-a", "pair-b"])
    assert len(backend.runs) == 2
    # The thread delivers a dispatch's results before it clears its busy flag.
    await until(lambda: not queue.stats().dispatching)
    stats = queue.stats()
    assert stats.dispatches == 2 and stats.max_batch_size_seen == 7
    await close(queue)


async def test_what_does_not_fit_goes_in_the_dispatch_after_without_waiting():
    backend = FakeBackend(padding_free=True)
    queue = make(backend, max_batch_size=3, max_wait_ms=60_000)  # a long optional wait, on a frozen clock
    blocker = await hold_busy(backend, queue, size=3)  # a full dispatch: it leaves without the wait
    waiting = [asyncio.create_task(queue.submit([f"i{i}"])) for i in range(7)]
    await until(lambda: queue.stats().queue_items == 7)
    backend.gate.set()
    outputs = await asyncio.wait_for(asyncio.gather(blocker, *waiting), 5)
    assert [o[0] for o in outputs[1:]] == [f"I{i}" for i in range(7)]
    assert backend.runs == [["block"] * 3, ["i0", "i1", "i2"], ["i3", "i4", "i5"], ["i6"]]  # FIFO, 3 at most
    await close(queue)


async def test_the_optional_max_wait_holds_an_idle_model_for_company():
    backend = FakeBackend(padding_free=True)
    clock = FakeClock()
    queue = make(backend, clock, max_wait_ms=50, max_batch_size=64)
    first = asyncio.create_task(queue.submit(["aa"]))
    await until(lambda: queue.stats().queue_items == 1)
    await asyncio.sleep(0.2)  # real time passes, the queue's clock does not
    assert backend.runs == [] and queue.stats().queue_items == 1
    second = asyncio.create_task(queue.submit(["bb"]))
    await until(lambda: queue.stats().queue_items == 2)
    clock.advance(0.05)
    assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [["AA"], ["BB"]]
    assert backend.runs == [["aa", "bb"]]
    await close(queue)


async def test_a_full_dispatch_leaves_without_the_optional_wait():
    backend = FakeBackend(padding_free=True)
    queue = make(backend, max_wait_ms=60_000, max_batch_size=3)  # frozen clock: only fullness lets it go
    outputs = await asyncio.wait_for(asyncio.gather(*(queue.submit([f"i{i}"]) for i in range(3))), 5)
    assert [o[0] for o in outputs] == ["I0", "I1", "I2"]
    assert backend.runs == [["i0", "i1", "i2"]]
    await close(queue)


async def test_each_caller_gets_its_own_outputs_in_its_own_order():
    backend = FakeBackend(padding_free=True)
    queue = make(backend)
    blocker = await hold_busy(backend, queue)
    inputs = [[f"r{r}-{i}" + "x" * ((r * 7 + i * 3) % 9) for i in range(r % 4 + 1)] for r in range(12)]
    tasks = [asyncio.create_task(queue.submit(items)) for items in inputs]
    await until(lambda: queue.stats().queue_requests == 12)
    backend.gate.set()
    outputs = await asyncio.gather(*tasks)
    assert outputs == [[item.upper() for item in items] for items in inputs]
    assert len(backend.runs) == 2 and len(backend.runs[1]) == sum(map(len, inputs))  # all in one run
    await blocker
    await close(queue)


async def test_concurrent_requests_are_batched_up_to_max_batch_size():
    backend = FakeBackend(padding_free=True)
    queue = make(backend, max_batch_size=4)
    blocker = await hold_busy(backend, queue)
    tasks = [asyncio.create_task(queue.submit([f"item{i}"])) for i in range(10)]
    await until(lambda: queue.stats().queue_items == 10)
    backend.gate.set()
    outputs = await asyncio.gather(*tasks)
    assert [o[0] for o in outputs] == [f"ITEM{i}" for i in range(10)]
    assert [len(run) for run in backend.runs] == [1, 4, 4, 2]
    await blocker
    stats = queue.stats()
    assert stats.items == 11 and stats.max_batch_size_seen == 4 and stats.mean_batch_size > 1
    await close(queue)


async def test_max_batch_tokens_bounds_the_work_of_a_dispatch():
    backend = FakeBackend(padding_free=True)
    queue = make(backend, max_batch_size=100, max_batch_tokens=20)
    blocker = await hold_busy(backend, queue)
    items = ["a" * 8, "b" * 8, "c" * 8, "d" * 8, "e" * 30]
    tasks = [asyncio.create_task(queue.submit([item])) for item in items]
    await until(lambda: queue.stats().queue_items == 5)
    backend.gate.set()
    outputs = await asyncio.gather(*tasks)
    assert [o[0] for o in outputs] == [item.upper() for item in items]
    assert backend.runs[1:] == [["a" * 8, "b" * 8], ["c" * 8, "d" * 8], ["e" * 30]]  # an oversized item goes alone
    await blocker
    await close(queue)


async def test_a_request_split_over_dispatches_sends_its_items_shortest_first():
    # a rerank of many documents in several dispatches: each dispatch holds
    # items of about one length (least padding), and the caller still gets
    # its outputs in its own order
    backend = FakeBackend()
    queue = make(backend, max_batch_size=100, max_batch_tokens=20, group_by_length=False)
    blocker = await hold_busy(backend, queue)
    items = ["a" * 9, "b" * 2, "c" * 10, "d" * 3, "e" * 8, "f" * 1]
    task = asyncio.create_task(queue.submit(items))
    await until(lambda: queue.stats().queue_items == 6)
    backend.gate.set()
    assert await task == [item.upper() for item in items]
    # item by item in arrival order it was [a b d f], [c e]
    assert backend.runs[1:] == [["f", "bb", "ddd", "e" * 8], ["a" * 9, "c" * 10]]
    await blocker
    await close(queue)


async def test_runs_on_the_queue_thread_never_on_the_event_loop():
    backend = FakeBackend()
    queue = make(backend)
    await queue.submit(["x"])
    assert backend.threads == {"oneshot-fake"}
    await close(queue)


def test_choose_dispatch_ranks_by_aged_priority_then_arrival():
    from types import SimpleNamespace as Item

    waiting = [
        Item(priority=2.0, arrival=0.0, order=0, size=5),  # old and low
        Item(priority=0.0, arrival=9.0, order=1, size=5),  # fresh and high
        Item(priority=1.0, arrival=9.0, order=2, size=50),
        Item(priority=1.0, arrival=9.0, order=3, size=5),
    ]
    pick = choose_dispatch(waiting, 10.0, max_batch_size=3, max_batch_tokens=20, aging_s=5.0)
    assert [w.order for w in pick] == [1, 0, 3]  # 0 aged to 0.0 (ties go to the earlier), 2 is too big
    no_aging = choose_dispatch(waiting, 10.0, max_batch_size=2, max_batch_tokens=100, aging_s=0.0)
    assert [w.order for w in no_aging] == [1, 2]
    alone = choose_dispatch(waiting[2:3], 10.0, max_batch_size=3, max_batch_tokens=20, aging_s=1.0)
    assert [w.order for w in alone] == [2]  # bigger than max_batch_tokens: it goes alone


# ---- priority ----------------------------------------------------------------------------


async def test_higher_priority_goes_first():
    backend = FakeBackend()
    queue = make(backend, max_batch_size=1)
    blocker = await hold_busy(backend, queue)
    low = [asyncio.create_task(queue.submit([f"low{i}"], priority=2.0)) for i in range(3)]
    await until(lambda: queue.stats().queue_items == 3)
    high = asyncio.create_task(queue.submit(["high"], priority=0.0))
    await until(lambda: queue.stats().queue_items == 4)
    backend.gate.set()
    await asyncio.gather(blocker, high, *low)
    order = [run[0] for run in backend.runs]
    assert order[:2] == ["block", "high"]
    assert order[2:] == ["low0", "low1", "low2"]  # FIFO within a priority
    await close(queue)


async def test_waiting_ages_so_low_priority_is_not_starved():
    backend = FakeBackend()
    clock = FakeClock()
    queue = make(backend, clock, max_batch_size=1, aging_s=0.05)
    blocker = await hold_busy(backend, queue)
    old = asyncio.create_task(queue.submit(["old"], priority=2.0))
    await until(lambda: queue.stats().queue_items == 1)
    clock.advance(0.3)  # 6 aging periods: now better than a fresh 0
    fresh = asyncio.create_task(queue.submit(["fresh"], priority=0.0))
    await until(lambda: queue.stats().queue_items == 2)
    backend.gate.set()
    await asyncio.gather(blocker, old, fresh)
    assert [run[0] for run in backend.runs] == ["block", "old", "fresh"]
    await close(queue)


@pytest.mark.parametrize("aging_s", [1.0, 0.0])
async def test_a_flood_of_higher_priority_cannot_starve_a_low_one(aging_s: float):
    """Two fresh priority-0 items arrive during every dispatch of two; a
    priority-2 item that waits still leaves within a bounded number of
    dispatches (priority gap / aging + 1), and only aging makes it so."""
    backend = FakeBackend(padding_free=True, stepped=True)
    clock = FakeClock()
    queue = make(backend, clock, max_batch_size=2, aging_s=aging_s)
    tasks = [asyncio.create_task(queue.submit(["b0"], priority=0.0))]
    assert await started_run(backend) == ["b0"]
    tasks.append(asyncio.create_task(queue.submit(["low"], priority=2.0)))
    runs = []
    for k in range(1, 9):
        tasks += [asyncio.create_task(queue.submit([f"h{k}{x}"], priority=0.0)) for x in "ab"]
        await until(lambda k=k: queue.stats().requests == 2 + 2 * k)
        clock.advance(1.0)
        backend.permits.release()  # type: ignore[union-attr]
        runs.append(await started_run(backend))
        if "low" in runs[-1]:
            break
    if aging_s:
        assert runs == [["h1a", "h1b"], ["h2a", "h2b"], ["low", "h3a"]]
    else:
        assert all("low" not in run for run in runs) and len(runs) == 8
    for _ in range(len(tasks)):
        backend.permits.release()  # type: ignore[union-attr]
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    await close(queue)


# ---- grouping ------------------------------------------------------------------------------


async def submit_while_busy(
    backend: FakeBackend, queue: OneShotQueue[str, str], requests: list[list[str]]
) -> list[list[str] | BaseException]:
    """Submit `requests` while the model is busy, so they share the next dispatch."""
    blocker = await hold_busy(backend, queue)
    tasks = [asyncio.create_task(queue.submit(items)) for items in requests]
    await until(lambda: queue.stats().queue_requests == len(requests))
    backend.gate.set()
    await blocker
    backend.runs.remove(["block"])
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_length_grouping_lowers_the_padding_ratio():
    sizes = [3, 40, 4, 38, 5, 41, 3, 39] * 2
    ratios = {}
    for by_length in (True, False):
        backend = FakeBackend()
        queue = make(backend, max_batch_size=16, group_by_length=by_length)
        outputs = await submit_while_busy(backend, queue, [["z" * n] for n in sizes])
        assert [len(o[0]) for o in outputs] == sizes  # type: ignore[index]
        stats = queue.stats()
        ratios[by_length] = stats.padded_size / (stats.real_size - len("block"))  # "block" ran alone
        await close(queue)
    assert ratios[True] < 0.25 < ratios[False]


async def test_padding_free_backends_report_no_padding_and_get_one_run():
    backend = FakeBackend(padding_free=True)
    queue = make(backend, max_batch_size=8)
    await submit_while_busy(backend, queue, [["z" * n] for n in (3, 40, 4, 38)])
    assert len(backend.runs) == 1
    assert [len(i) for i in backend.runs[0]] == [3, 4, 38, 40]  # still sorted by length
    assert queue.stats().padding_ratio == 0.0
    await close(queue)


async def test_items_with_different_keys_never_share_a_run():
    backend = FakeBackend(padding_free=True, keyed=True)
    queue = make(backend)
    items = ["apple", "banana", "avocado", "blueberry", "cherry"]
    outputs = await submit_while_busy(backend, queue, [[item] for item in items])
    assert [o[0] for o in outputs] == [i.upper() for i in items]  # type: ignore[index]
    for run in backend.runs:
        assert len({item[0] for item in run}) == 1
    assert sorted(map(len, backend.runs)) == [1, 2, 2]
    await close(queue)


# ---- errors and limits ----------------------------------------------------------------------


async def test_a_failing_batch_fails_only_its_callers():
    backend = FakeBackend(padding_free=True, keyed=True)
    queue = make(backend)
    results = await submit_while_busy(
        backend, queue, [["x-boom", "x-two"], ["x-three"], ["y-fine"], ["z-fine", "z-too"]]
    )
    assert isinstance(results[0], BackendError) and "exploded" in results[0].message
    assert isinstance(results[1], BackendError)  # shared the failing run
    assert results[2] == ["Y-FINE"]
    assert results[3] == ["Z-FINE", "Z-TOO"]
    assert queue.stats().errors == 2
    assert await queue.submit(["x-again"]) == ["X-AGAIN"]  # and the queue goes on
    await close(queue)


async def test_a_full_queue_is_a_503_with_retry_after():
    backend = FakeBackend()
    queue = make(backend, max_batch_size=1, max_queue=2)
    running = await hold_busy(backend, queue)
    waiting = [asyncio.create_task(queue.submit([f"w{i}"])) for i in range(2)]
    await until(lambda: queue.stats().queue_requests == 2)
    with pytest.raises(QueueFullError) as info:
        await queue.submit(["one too many"])
    assert info.value.status == 503 and info.value.retry_after_s >= 1 and "limit 2" in info.value.message
    assert queue.stats().rejected == 1
    backend.gate.set()
    await asyncio.gather(running, *waiting)
    await close(queue)


async def test_a_cancelled_caller_s_items_are_dropped():
    backend = FakeBackend()
    queue = make(backend, max_batch_size=1)
    running = await hold_busy(backend, queue)
    gone = asyncio.create_task(queue.submit(["gone1", "gone2"]))
    stays = asyncio.create_task(queue.submit(["stays"]))
    await until(lambda: queue.stats().queue_requests == 2)
    gone.cancel()
    await until(gone.done)
    backend.gate.set()
    assert await stays == ["STAYS"]
    await running
    assert all("gone" not in item for run in backend.runs for item in run)
    assert queue.stats().queue_requests == 0
    await close(queue)


async def test_closing_fails_waiting_callers_and_refuses_new_ones():
    backend = FakeBackend()
    queue = make(backend, max_batch_size=1)
    running = await hold_busy(backend, queue)
    waiting = asyncio.create_task(queue.submit(["waits"]))
    await until(lambda: queue.stats().queue_requests == 1)
    closing = asyncio.create_task(asyncio.to_thread(queue.close, 10))
    await until(lambda: queue._stopping)  # close() has begun: what waits now is not dispatched
    backend.gate.set()
    await closing
    assert await running == ["BLOCK"]  # the running group finishes
    with pytest.raises(EngineStoppedError):
        await waiting
    with pytest.raises(EngineStoppedError):
        await queue.submit(["late"])
    assert not queue.alive


async def test_stats_has_what_the_dashboard_reads():
    backend = FakeBackend()
    queue = make(backend)
    await asyncio.gather(queue.submit(["aa", "a"]), queue.submit(["aaaa"]))
    stats = queue.stats()
    for key in (
        "backend",
        "device",
        "dispatching",
        "queue_items",
        "queue_requests",
        "in_flight",
        "requests",
        "items",
        "batches",
        "errors",
        "rejected",
        "padding_ratio",
        "recent_padding_ratio",
        "mean_batch_size",
        "recent_batch_sizes",
        "items_per_s",
        "busy_fraction",
        "max_batch_size",
        "max_wait_ms",
    ):
        assert hasattr(stats, key), key
    assert stats.requests == 2 and stats.items == 3 and stats.in_flight == 0
    assert (stats.backend, stats.device, stats.max_wait_ms) == ("fake", "CPU", 0.0)
    await close(queue)


async def test_adaptive_threads_follow_the_cpu_reading_between_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """--threads auto: before a run, the queue sets the backend's threads to
    the cores other programs leave free (engine/threads.py), on its thread."""
    from localserve.engine import threads as threads_module
    from localserve.engine.oneshot import queue as queue_module

    class Reading:
        busy = 1.0

        def busy_elsewhere(self) -> float:
            return self.busy

    class Threaded(FakeBackend):
        def __init__(self) -> None:
            super().__init__()
            self.counts: list[tuple[int, str]] = []

        def cpu_threads(self) -> int:
            return 2

        def set_cpu_threads(self, threads: int) -> None:
            self.counts.append((threads, threading.current_thread().name))

    reading = Reading()
    monkeypatch.setattr(queue_module, "shared_cpu_use", lambda: reading)
    monkeypatch.setattr(threads_module, "TICK_S", 0.0)
    monkeypatch.setattr(threads_module.os, "cpu_count", lambda: 2)
    backend = Threaded()
    queue = OneShotQueue("fake", backend, OneShotQueueConfig(), adaptive_threads=True)
    assert await queue.submit(["a"]) == ["A"]
    reading.busy = 0.0
    assert await queue.submit(["b"]) == ["B"]
    await close(queue)
    assert backend.counts == [(1, "oneshot-fake"), (2, "oneshot-fake")]
    fixed = OneShotQueue("fixed", Threaded(), OneShotQueueConfig())
    assert fixed.threads is None
    await close(fixed)
