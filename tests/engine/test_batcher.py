"""The one-shot micro-batcher against a recording fake backend."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Hashable, Sequence

import pytest

from localserve.backends.base import BackendInfo, OneShotBackend
from localserve.engine.batcher import Batcher, BatcherConfig, padding_of, plan_groups
from localserve.errors import BackendError, EngineStoppedError, QueueFullError


class FakeBackend(OneShotBackend[str, str]):
    """Upper-cases items; size is the item's length; key is its first
    character when `keyed`. Records every run; can be held or made to fail."""

    def __init__(self, *, padding_free: bool = False, keyed: bool = False, delay_s: float = 0.0) -> None:
        self.padding_free = padding_free
        self.keyed = keyed
        self.delay_s = delay_s
        self.runs: list[list[str]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def run(self, items: Sequence[str]) -> list[str]:
        self.entered.set()
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        self.runs.append(list(items))
        if self.delay_s:
            time.sleep(self.delay_s)
        if any("boom" in item for item in items):
            raise RuntimeError("the model exploded")
        return [item.upper() for item in items]

    def item_size(self, item: str) -> int:
        return len(item)

    def group_key(self, item: str) -> Hashable:
        return item[0] if self.keyed else None

    def info(self) -> BackendInfo:
        return BackendInfo(backend="fake", device="CPU", model_path="")


def make(backend: FakeBackend, **config: float | int | bool) -> Batcher[str, str]:
    return Batcher("fake", backend, BatcherConfig(**config))  # type: ignore[arg-type]


async def close(batcher: Batcher[str, str]) -> None:
    await asyncio.to_thread(batcher.close, 10)


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


# ---- batching --------------------------------------------------------------------------


async def test_each_caller_gets_its_own_outputs_in_its_own_order():
    backend = FakeBackend(padding_free=True)
    batcher = make(backend, max_wait_ms=20)
    inputs = [[f"r{r}-{i}" + "x" * ((r * 7 + i * 3) % 9) for i in range(r % 4 + 1)] for r in range(12)]
    outputs = await asyncio.gather(*(batcher.submit(items) for items in inputs))
    assert outputs == [[item.upper() for item in items] for items in inputs]
    assert max(len(run) for run in backend.runs) > 1  # they were batched together
    await close(batcher)


async def test_concurrent_requests_are_batched_up_to_max_batch_size():
    backend = FakeBackend(padding_free=True)
    batcher = make(backend, max_wait_ms=50, max_batch_size=4)
    outputs = await asyncio.gather(*(batcher.submit([f"item{i}"]) for i in range(10)))
    assert [o[0] for o in outputs] == [f"ITEM{i}" for i in range(10)]
    assert max(len(run) for run in backend.runs) == 4
    assert all(len(run) <= 4 for run in backend.runs)
    stats = batcher.stats()
    assert stats["items"] == 10 and stats["max_batch_size_seen"] == 4 and stats["mean_batch_size"] > 1
    await close(batcher)


async def test_a_lone_request_leaves_after_max_wait():
    backend = FakeBackend()
    batcher = make(backend, max_wait_ms=30, max_batch_size=64)
    started = time.monotonic()
    assert await batcher.submit(["solo"]) == ["SOLO"]
    elapsed = time.monotonic() - started
    assert 0.025 <= elapsed < 1.0
    await close(batcher)


async def test_a_full_dispatch_leaves_without_waiting():
    backend = FakeBackend(padding_free=True)
    batcher = make(backend, max_wait_ms=5000, max_batch_size=3)
    started = time.monotonic()
    await asyncio.gather(*(batcher.submit([f"i{i}"]) for i in range(3)))
    assert time.monotonic() - started < 2.0
    await close(batcher)


async def test_max_batch_tokens_bounds_the_work_of_a_dispatch():
    backend = FakeBackend(padding_free=True)
    batcher = make(backend, max_wait_ms=50, max_batch_size=100, max_batch_tokens=20)
    items = ["a" * 8, "b" * 8, "c" * 8, "d" * 8, "e" * 30]
    outputs = await asyncio.gather(*(batcher.submit([item]) for item in items))
    assert [o[0] for o in outputs] == [item.upper() for item in items]
    for run in backend.runs:
        assert sum(map(len, run)) <= 20 or len(run) == 1  # an oversized item goes alone
    await close(batcher)


async def test_runs_on_the_batcher_thread_never_on_the_event_loop():
    backend = FakeBackend()
    batcher = make(backend, max_wait_ms=1)
    await batcher.submit(["x"])
    assert backend.threads == {"batch-fake"}
    await close(batcher)


# ---- priority ----------------------------------------------------------------------------


async def test_higher_priority_goes_first():
    backend = FakeBackend()
    batcher = make(backend, max_wait_ms=1, max_batch_size=1)
    backend.gate.clear()
    blocker = asyncio.create_task(batcher.submit(["block"]))
    await asyncio.to_thread(backend.entered.wait, 5)
    low = [asyncio.create_task(batcher.submit([f"low{i}"], priority=2.0)) for i in range(3)]
    await asyncio.sleep(0.02)
    high = asyncio.create_task(batcher.submit(["high"], priority=0.0))
    await asyncio.sleep(0.02)
    backend.gate.set()
    await asyncio.gather(blocker, high, *low)
    order = [run[0] for run in backend.runs]
    assert order[:2] == ["block", "high"]
    assert order[2:] == ["low0", "low1", "low2"]  # FIFO within a priority
    await close(batcher)


async def test_waiting_ages_so_low_priority_is_not_starved():
    backend = FakeBackend()
    batcher = make(backend, max_wait_ms=1, max_batch_size=1, aging_s=0.05)
    backend.gate.clear()
    blocker = asyncio.create_task(batcher.submit(["block"]))
    await asyncio.to_thread(backend.entered.wait, 5)
    old = asyncio.create_task(batcher.submit(["old"], priority=2.0))
    await asyncio.sleep(0.3)  # 6 aging periods: now better than a fresh 0
    fresh = asyncio.create_task(batcher.submit(["fresh"], priority=0.0))
    await asyncio.sleep(0.01)
    backend.gate.set()
    await asyncio.gather(blocker, old, fresh)
    assert [run[0] for run in backend.runs] == ["block", "old", "fresh"]
    await close(batcher)


# ---- grouping ------------------------------------------------------------------------------


async def test_length_grouping_lowers_the_padding_ratio():
    sizes = [3, 40, 4, 38, 5, 41, 3, 39] * 2
    ratios = {}
    for by_length in (True, False):
        backend = FakeBackend()
        batcher = make(backend, max_wait_ms=50, max_batch_size=16, group_by_length=by_length)
        outputs = await asyncio.gather(*(batcher.submit(["z" * n]) for n in sizes))
        assert [len(o[0]) for o in outputs] == sizes
        ratios[by_length] = batcher.stats()["padding_ratio"]
        await close(batcher)
    assert ratios[True] < 0.25 < ratios[False]


async def test_padding_free_backends_report_no_padding_and_get_one_run():
    backend = FakeBackend(padding_free=True)
    batcher = make(backend, max_wait_ms=50, max_batch_size=8)
    await asyncio.gather(*(batcher.submit(["z" * n]) for n in (3, 40, 4, 38)))
    assert len(backend.runs) == 1
    assert [len(i) for i in backend.runs[0]] == [3, 4, 38, 40]  # still sorted by length
    assert batcher.stats()["padding_ratio"] == 0.0
    await close(batcher)


async def test_items_with_different_keys_never_share_a_run():
    backend = FakeBackend(padding_free=True, keyed=True)
    batcher = make(backend, max_wait_ms=50)
    items = ["apple", "banana", "avocado", "blueberry", "cherry"]
    outputs = await asyncio.gather(*(batcher.submit([item]) for item in items))
    assert [o[0] for o in outputs] == [i.upper() for i in items]
    for run in backend.runs:
        assert len({item[0] for item in run}) == 1
    assert sorted(map(len, backend.runs)) == [1, 2, 2]
    await close(batcher)


# ---- errors and limits ----------------------------------------------------------------------


async def test_a_failing_batch_fails_only_its_callers():
    backend = FakeBackend(padding_free=True, keyed=True)
    batcher = make(backend, max_wait_ms=50)
    results = await asyncio.gather(
        batcher.submit(["x-boom", "x-two"]),
        batcher.submit(["x-three"]),
        batcher.submit(["y-fine"]),
        batcher.submit(["z-fine", "z-too"]),
        return_exceptions=True,
    )
    assert isinstance(results[0], BackendError) and "exploded" in results[0].message
    assert isinstance(results[1], BackendError)  # shared the failing run
    assert results[2] == ["Y-FINE"]
    assert results[3] == ["Z-FINE", "Z-TOO"]
    assert batcher.stats()["errors"] == 2
    assert await batcher.submit(["x-again"]) == ["X-AGAIN"]  # and the batcher goes on
    await close(batcher)


async def test_a_full_queue_is_a_503_with_retry_after():
    backend = FakeBackend()
    batcher = make(backend, max_wait_ms=1, max_batch_size=1, max_queue=2)
    backend.gate.clear()
    running = asyncio.create_task(batcher.submit(["run"]))
    await asyncio.to_thread(backend.entered.wait, 5)
    waiting = [asyncio.create_task(batcher.submit([f"w{i}"])) for i in range(2)]
    await asyncio.sleep(0.01)
    with pytest.raises(QueueFullError) as info:
        await batcher.submit(["one too many"])
    assert info.value.status == 503 and info.value.retry_after_s >= 1 and "limit 2" in info.value.message
    assert batcher.stats()["rejected"] == 1
    backend.gate.set()
    await asyncio.gather(running, *waiting)
    await close(batcher)


async def test_a_cancelled_caller_s_items_are_dropped():
    backend = FakeBackend()
    batcher = make(backend, max_wait_ms=1, max_batch_size=1)
    backend.gate.clear()
    running = asyncio.create_task(batcher.submit(["run"]))
    await asyncio.to_thread(backend.entered.wait, 5)
    gone = asyncio.create_task(batcher.submit(["gone1", "gone2"]))
    stays = asyncio.create_task(batcher.submit(["stays"]))
    await asyncio.sleep(0.01)
    gone.cancel()
    await asyncio.sleep(0.01)
    backend.gate.set()
    assert await stays == ["STAYS"]
    await running
    assert all("gone" not in item for run in backend.runs for item in run)
    assert batcher.stats()["queue_requests"] == 0
    await close(batcher)


async def test_closing_fails_waiting_callers_and_refuses_new_ones():
    backend = FakeBackend()
    batcher = make(backend, max_wait_ms=1, max_batch_size=1)
    backend.gate.clear()
    running = asyncio.create_task(batcher.submit(["run"]))
    await asyncio.to_thread(backend.entered.wait, 5)
    waiting = asyncio.create_task(batcher.submit(["waits"]))
    await asyncio.sleep(0.01)
    closing = asyncio.create_task(asyncio.to_thread(batcher.close, 10))
    await asyncio.sleep(0.01)
    backend.gate.set()
    await closing
    assert await running == ["RUN"]  # the running group finishes
    with pytest.raises(EngineStoppedError):
        await waiting
    with pytest.raises(EngineStoppedError):
        await batcher.submit(["late"])
    assert not batcher.alive


async def test_stats_has_what_the_dashboard_reads():
    backend = FakeBackend()
    batcher = make(backend, max_wait_ms=10)
    await asyncio.gather(batcher.submit(["aa", "a"]), batcher.submit(["aaaa"]))
    stats = batcher.stats()
    for key in (
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
        assert key in stats, key
    assert stats["requests"] == 2 and stats["items"] == 3 and stats["in_flight"] == 0
    await close(batcher)
