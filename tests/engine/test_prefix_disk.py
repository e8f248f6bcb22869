"""The prefix cache's disk tier: the store (keys, checks, bounds, several
processes) and the scheduler saving whole sequences keyed by their blocks
and restoring every token a prompt shares with one (scripted backend: the
KV view is checked after every step)."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest

from localserve.engine.step.prefix_disk import BLOCK, DiskPrefixStore, chain_hashes
from localserve.engine.types import StepPlan, StepResult

from .scripted import Driver, make_capacity, prompt

ID = "model.gguf|f16|f16"


def store(tmp_path: Path, identity: str = ID, max_bytes: int = 1 << 30) -> DiskPrefixStore:
    return DiskPrefixStore(tmp_path / "prefix-cache", identity, max_bytes)


def put(disk: DiskPrefixStore, key: str, token_ids: list[int], payload: bytes) -> None:
    """A save, as the scheduler asks it (`expect`) and the worker hands it over (`put`)."""
    disk.expect(key, token_ids)
    disk.put(key, len(token_ids), payload)


# ---- the store -----------------------------------------------------------------------------------


def test_longest_finds_the_longest_saved_whole_block_prefix(tmp_path):
    disk = store(tmp_path)
    tokens = prompt(0, 3 * BLOCK + 10)
    keys = chain_hashes(ID, tokens)
    assert len(keys) == 3
    put(disk, keys[0], tokens[:BLOCK], b"one block")
    put(disk, keys[1], tokens[: 2 * BLOCK + 5], b"two blocks and 5")
    disk.flush()
    assert disk.longest(tokens, len(tokens)) == (2 * BLOCK, keys[1])
    assert disk.longest(tokens, 2 * BLOCK - 1) == (BLOCK, keys[0])  # limited: at most that many tokens
    loaded = disk.load(keys[1])
    assert loaded is not None and list(loaded[0]) == tokens[: 2 * BLOCK + 5] and loaded[1] == b"two blocks and 5"
    other = tokens[:BLOCK] + [7] + tokens[BLOCK + 1 :]  # differs in the second block
    assert disk.longest(other, len(other)) == (BLOCK, keys[0])
    assert store(tmp_path, "another.gguf|f16|f16").longest(tokens, len(tokens)) is None  # other model: no match


def test_a_restarted_store_finds_what_was_written_before(tmp_path):
    tokens = prompt(0, 2 * BLOCK)
    first = store(tmp_path)
    put(first, chain_hashes(ID, tokens)[-1], tokens, b"state")
    first.close()
    again = store(tmp_path)
    assert again.longest(tokens, len(tokens)) == (2 * BLOCK, chain_hashes(ID, tokens)[-1])


@pytest.mark.parametrize("damage", ["flip", "truncate", "renamed"])
def test_a_damaged_file_is_deleted_with_one_warning_and_reads_as_a_miss(tmp_path, caplog, damage):
    disk = store(tmp_path)
    tokens = prompt(0, BLOCK)
    key = chain_hashes(ID, tokens)[0]
    put(disk, key, tokens, os.urandom(5000))
    disk.flush()
    path = disk.dir / f"{key}.kv"
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-10] ^= 0xFF
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:-100]))
    else:  # another key's file under this name
        other = chain_hashes(ID, prompt(1, BLOCK))[0]
        put(disk, other, prompt(1, BLOCK), b"x" * 10)
        disk.flush()
        (disk.dir / f"{other}.kv").replace(path)
    with caplog.at_level(logging.WARNING, logger="localserve.engine.step.prefix_disk"):
        assert disk.load(key) is None
    assert len([r for r in caplog.records if "deleted" in r.message]) == 1
    assert not path.exists() and disk.longest(tokens, BLOCK) is None


def test_the_size_bound_evicts_the_least_recently_used_first(tmp_path):
    disk = store(tmp_path, max_bytes=25_000)
    keys = []
    for i in range(4):
        key = chain_hashes(ID, prompt(i * 1000, BLOCK))[0]
        keys.append(key)
        put(disk, key, prompt(i * 1000, BLOCK), bytes(10_000))
        disk.flush()
        os.utime(disk.dir / f"{key}.kv", (time.time() - 100 + i, time.time() - 100 + i))
    disk.load(keys[2])  # a hit renews it
    put(disk, chain_hashes(ID, prompt(9000, BLOCK))[0], prompt(9000, BLOCK), bytes(10_000))
    disk.flush()
    left = {p.stem for p in disk.dir.glob("*.kv")}
    assert keys[2] in left and keys[0] not in left and keys[1] not in left
    assert sum(p.stat().st_size for p in disk.dir.glob("*.kv")) <= 25_000


def test_two_processes_on_one_home_share_files_and_never_see_half_of_one(tmp_path):
    """Two stores on one root (as two servers would be) write the same keys
    concurrently: every file either reads whole and checked, or is absent."""
    a, b = store(tmp_path), store(tmp_path)
    keys = [chain_hashes(ID, prompt(i * 1000, BLOCK))[0] for i in range(20)]
    for i, key in enumerate(keys):
        payload = bytes([i]) * 50_000
        put(a, key, prompt(i * 1000, BLOCK), payload)
        put(b, key, prompt(i * 1000, BLOCK), payload)
    a.flush()
    b.flush()
    assert not list(a.dir.glob("*.tmp"))
    fresh = store(tmp_path)
    loaded = {key: fresh.load(key) for key in keys}  # a save the busy writer dropped is absent: a cache may forget
    assert all(data is None or data[1] == bytes([i]) * 50_000 for i, data in enumerate(loaded.values()))
    assert sum(data is not None for data in loaded.values()) >= 8


# ---- the scheduler with a disk tier --------------------------------------------------------------

LONG = prompt(0, 2 * BLOCK + 40)  # two whole blocks and a tail


def alone(ids: list[int]) -> list[int]:
    """The answer computed from scratch, without any cache."""
    capacity = make_capacity(num_slots=1, step_tokens=256, kv_size=1024, n_ctx=1024)
    driver = Driver(capacity)
    driver.add("alone", ids, max_tokens=8)
    driver.run()
    return driver.records["alone"].token_ids


def drive(disk: DiskPrefixStore, prompts: dict[str, list[int]], **kwargs) -> Driver:  # type: ignore[no-untyped-def]
    capacity = make_capacity(num_slots=1, step_tokens=256, kv_size=1024, n_ctx=1024)
    driver = Driver(capacity, disk=disk)
    for request_id, ids in prompts.items():
        driver.add(request_id, ids, max_tokens=kwargs.get("max_tokens", 8))
        driver.run()
    return driver


def test_a_prefix_dropped_from_its_slot_is_saved_and_restored_instead_of_recomputed(tmp_path):
    disk = store(tmp_path)
    first = LONG + [1000, 1001]
    other = prompt(3000, 300)  # another prompt takes the one slot: the first's blocks are saved
    again = LONG + [2000]
    driver = drive(disk, {"first": first, "other": other, "again": again})
    assert disk.stats.num_saves >= 1 and disk.stats.num_hits == 1
    restores = [op for b in driver.batches for op in b.kv_ops if op.kind == "restore"]
    # every token the prompt shares with the saved sequence, past the last whole block
    assert [op.num_tokens for op in restores] == [len(LONG)]
    last = driver.records["again"]
    assert last.last.num_cached_tokens == len(LONG)  # cached tokens, as usage reports them: from the disk tier
    assert last.token_ids == alone(again)  # the same answer as computed from scratch
    prefill = [c for b in driver.batches for c in b.chunks if c.seq_id == driver.seq_ids["again"]]
    assert prefill[0].start_pos == len(LONG)  # only what differs was computed


def test_after_a_restart_the_prefix_comes_from_disk(tmp_path):
    first = drive(store(tmp_path), {"first": LONG + [5]})
    first.scheduler_batch = first.scheduler.save_ops()  # shutdown: the slots' blocks go to disk
    result = first.backend.execute(first.scheduler_batch)
    for key, (num_tokens, payload) in result.saved.items():
        first.disk.put(key, num_tokens, payload)  # type: ignore[union-attr]
    first.disk.close()  # type: ignore[union-attr]
    assert result.saved
    restarted = store(tmp_path)
    driver = drive(restarted, {"again": LONG + [6, 7]})
    assert restarted.stats.num_hits == 1
    assert driver.records["again"].token_ids == alone(LONG + [6, 7])


class WatchedStore:
    """A real store that fails on any call schedule() makes, except its
    in-memory index (what is saved, what a save was asked for) and counters:
    the file is read ahead when a request arrives (`prefetch`), never in the
    plan."""

    IN_MEMORY = frozenset({"identity", "stats", "stored_tokens", "expect"})

    def __init__(self, disk: DiskPrefixStore) -> None:
        self._disk = disk
        self.scheduling = False
        self.calls_outside: list[str] = []

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        if self.scheduling and name not in self.IN_MEMORY:
            raise AssertionError(f"schedule() used the disk tier's {name}")
        if not self.scheduling:
            self.calls_outside.append(name)
        return getattr(self._disk, name)


def test_schedule_reads_no_file_the_prefix_is_read_ahead_when_the_request_arrives(tmp_path):
    watched = WatchedStore(store(tmp_path))
    capacity = make_capacity(num_slots=1, step_tokens=256, kv_size=1024, n_ctx=1024)
    driver = Driver(capacity, disk=watched)  # type: ignore[arg-type]
    plan = driver.scheduler.schedule

    def watched_schedule() -> StepPlan:
        watched.scheduling = True
        try:
            return plan()
        finally:
            watched.scheduling = False

    driver.scheduler.schedule = watched_schedule  # type: ignore[method-assign]
    for request_id, ids in {"first": LONG + [1000], "other": prompt(3000, 300), "again": LONG + [2000]}.items():
        driver.add(request_id, ids, max_tokens=8)
        driver.run()
    assert watched.stats.num_hits == 1  # restored, from bytes the reader had ready
    assert "prefetch" in watched.calls_outside and "load" not in watched.calls_outside
    assert driver.records["again"].token_ids == alone(LONG + [2000])


def test_a_sequence_waits_for_its_prefix_while_other_work_runs(tmp_path):
    """A read under way holds back only its own sequence: a step with other
    work runs without it, and it is admitted, restored, once the read is done."""
    first = drive(store(tmp_path), {"first": LONG + [1]})
    saved = first.backend.execute(first.scheduler.save_ops()).saved  # shutdown: the slot's blocks go to disk
    for key, (num_tokens, payload) in saved.items():
        first.disk.put(key, num_tokens, payload)  # type: ignore[union-attr]
    first.disk.close()  # type: ignore[union-attr]
    disk = store(tmp_path)  # restarted, with two slots: room for both requests
    driver = Driver(make_capacity(num_slots=2, step_tokens=512, kv_size=2048, n_ctx=1024), disk=disk)
    release = threading.Event()
    real_load = disk.load

    def slow_load(key: str):  # type: ignore[no-untyped-def]
        release.wait(10)
        return real_load(key)

    disk.load = slow_load  # type: ignore[method-assign]
    driver.add("busy", prompt(5000, 40), max_tokens=4)
    driver.add("again", LONG + [2], max_tokens=4)
    assert driver.scheduler.has_ready_work()
    batch = driver.step()
    assert driver.chunk(batch, "busy") is not None and driver.chunk(batch, "again") is None
    release.set()
    driver.run()
    assert disk.stats.num_hits == 1
    assert driver.records["again"].token_ids == alone(LONG + [2])[:4]


def test_short_prompts_and_a_cache_that_has_more_in_a_slot_do_not_touch_the_disk(tmp_path):
    disk = store(tmp_path)
    drive(disk, {"a": prompt(0, 100), "b": prompt(0, 120)})
    assert disk.stats.num_saves == 0 and disk.stats.num_hits == 0
    driver = drive(disk, {"a": LONG + [1], "b": LONG + [2]})  # the second reuses the slot's prefix
    assert disk.stats.num_hits == 0
    assert driver.records["b"].last.num_cached_tokens == len(LONG)


def test_a_restore_the_backend_refuses_is_recomputed_and_its_file_deleted(tmp_path):
    first = drive(store(tmp_path), {"first": LONG + [1]})
    saved = first.backend.execute(first.scheduler.save_ops()).saved  # shutdown: the slot's blocks go to disk
    for key, (num_tokens, payload) in saved.items():
        first.disk.put(key, num_tokens, payload)  # type: ignore[union-attr]
    first.disk.close()  # type: ignore[union-attr]
    disk = store(tmp_path)  # restarted, with two slots: room for both requests
    driver = Driver(make_capacity(num_slots=2, step_tokens=512, kv_size=2048, n_ctx=1024), disk=disk)
    real_execute = driver.backend.execute

    def refusing(batch: StepPlan) -> StepResult:
        restores = {op.slot for op in batch.kv_ops if op.kind == "restore"}
        if not restores:
            return real_execute(batch)
        kept = tuple(op for op in batch.kv_ops if op.kind != "restore")
        result = real_execute(StepPlan(batch.step_id, kept, (), batch.released_seq_ids))
        for slot in restores:
            driver.backend.slots[slot] = []
        return StepResult({}, restore_failed=tuple(restores), saved=result.saved)

    driver.backend.execute = refusing  # type: ignore[method-assign]
    driver.add("again", LONG + [2], max_tokens=8)
    driver.run()
    assert driver.records["again"].token_ids == alone(LONG + [2])
    assert not list(disk.dir.glob("*.kv")) or disk.longest(LONG, len(LONG)) is None
