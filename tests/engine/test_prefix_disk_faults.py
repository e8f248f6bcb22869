"""The prefix cache's disk tier on a disk that fills or is read-only: writes
pause with one warning and resume later, no half file is left, restores go
on from the files present, and the tier never takes the floor of free space
(it evicts its least recently used files first)."""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest

from localserve import disk as disk_module
from localserve.engine.step.prefix_disk import BLOCK, DiskPrefixStore, chain_hashes
from tests.fixtures.small_disk import fill, read_only, small_tmpfs

from .scripted import prompt

ID = "model.gguf|f16|f16"
LOGGER = "localserve.disk"


def save(disk: DiskPrefixStore, seed: int, payload: bytes) -> str:
    tokens = prompt(seed * 1000, BLOCK)
    key = chain_hashes(ID, tokens)[0]
    disk.expect(key, tokens)
    disk.put(key, len(tokens), payload)
    disk.flush()
    return key


def files(disk: DiskPrefixStore) -> set[str]:
    return {p.stem for p in disk.dir.glob("*.kv")}


def leftovers(root: Path) -> list[Path]:
    return list(root.rglob("*.tmp"))


class FullDisk:
    """`Path.open` that refuses to write the tier's temporary files (ENOSPC or EROFS) until healed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, code: int = errno.ENOSPC) -> None:
        self.full, self.code, self.num_refused = True, code, 0
        real = Path.open

        def open_(path: Path, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if self.full and path.name.endswith(".tmp") and "w" in mode:
                self.num_refused += 1
                raise OSError(self.code, os.strerror(self.code), str(path))
            return real(path, mode, *args, **kwargs)

        monkeypatch.setattr(Path, "open", open_)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_full_disk_pauses_writing_with_one_warning_then_it_resumes(tmp_path, monkeypatch, caplog, code):
    disk = DiskPrefixStore(tmp_path / "prefix-cache", ID, 1 << 30, floor_bytes=0)
    disk.gate.retry_s = 0.2
    kept = save(disk, 0, b"saved before the disk filled")
    full = FullDisk(monkeypatch, code)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        save(disk, 1, bytes(5000))
        save(disk, 2, bytes(5000))  # paused: not even tried
        time.sleep(0.25)
        save(disk, 3, bytes(5000))  # tried again after retry_s: still full
    assert full.num_refused == 2 and disk.stats.num_dropped == 3
    warnings = [r.message for r in caplog.records if "not writing" in r.message]
    assert len(warnings) == 1 and ("full" if code == errno.ENOSPC else "read-only") in warnings[0]
    assert files(disk) == {kept} and not leftovers(tmp_path)
    loaded = disk.load(kept)  # restores go on from the files present
    assert loaded is not None and bytes(loaded[1]) == b"saved before the disk filled"
    full.full = False
    time.sleep(0.25)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        key = save(disk, 4, b"after")
    assert files(disk) == {kept, key} and any("again" in r.message for r in caplog.records)


def test_the_tier_keeps_the_floor_free_by_evicting_its_oldest_files(tmp_path, monkeypatch, caplog):
    root = tmp_path / "prefix-cache"
    floor, room = 100_000, 25_000  # the disk has the floor plus 25 kB free, less what the tier wrote

    def free(path: Path) -> int:
        return floor + room - sum(p.stat().st_size for p in root.rglob("*.kv"))

    monkeypatch.setattr(disk_module, "free_bytes", free)
    disk = DiskPrefixStore(root, ID, 1 << 30, floor_bytes=floor)
    disk.gate.check_s = 0.0
    keys = []
    for i in range(4):
        keys.append(save(disk, i, bytes(9000)))
        os.utime(disk.dir / f"{keys[-1]}.kv", (time.time() - 100 + i, time.time() - 100 + i))
    assert disk.stats.num_saves == 4
    assert files(disk) == set(keys[2:])  # the oldest went to keep the floor
    assert free(root) >= floor
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        save(disk, 9, bytes(200_000))  # cannot fit even with every file gone: dropped
        save(disk, 10, bytes(200_000))
    assert disk.stats.num_saves == 4 and free(root) >= floor
    assert files(disk) == set(keys[2:])  # not emptied for a save that could never fit
    assert len([r for r in caplog.records if "stays free" in r.message]) == 1


def test_a_read_only_home_starts_the_tier_paused_not_failing(tmp_path, monkeypatch, caplog):
    real_mkdir = Path.mkdir

    def mkdir(path: Path, *args: Any, **kwargs: Any) -> None:
        if "prefix-cache" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        disk = DiskPrefixStore(tmp_path / "prefix-cache", ID, 1 << 30)
        save(disk, 0, b"x")
    assert disk.stats.num_saves == 0 and disk.stats.num_dropped == 1
    assert any("read-only" in r.message for r in caplog.records)


def test_a_real_full_tmpfs(tmp_path, caplog):
    with small_tmpfs(tmp_path / "disk", "2m") as mount:
        disk = DiskPrefixStore(mount / "prefix-cache", ID, 1 << 30, floor_bytes=0)
        disk.gate.retry_s = 0.1
        kept = save(disk, 0, bytes(100_000))
        filler = fill(mount)
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            save(disk, 1, os.urandom(300_000))
        assert disk.stats.num_saves == 1 and not leftovers(mount)
        assert any("full" in r.message for r in caplog.records)
        assert disk.load(kept) is not None
        filler.unlink()
        time.sleep(0.15)
        key = save(disk, 2, os.urandom(300_000))
        assert files(disk) == {kept, key}
        disk.close()


def test_a_real_read_only_home(tmp_path):
    home = tmp_path / "home"
    first = DiskPrefixStore(home / "prefix-cache", ID, 1 << 30, floor_bytes=0)
    kept = save(first, 0, b"state")
    first.close()
    with read_only(home):
        again = DiskPrefixStore(home / "prefix-cache", ID, 1 << 30, floor_bytes=0)
        other = DiskPrefixStore(home / "prefix-cache", "other.gguf|f16|f16", 1 << 30, floor_bytes=0)  # dir not made
        tokens = prompt(0, BLOCK)
        assert again.longest(tokens, BLOCK) == (BLOCK, kept)
        loaded = again.load(kept)
        assert loaded is not None and bytes(loaded[1]) == b"state"
        save(again, 1, b"more")
        assert again.stats.num_saves == 0 and files(again) == {kept}
        assert other.longest(tokens, BLOCK) is None
        again.close()
        other.close()
