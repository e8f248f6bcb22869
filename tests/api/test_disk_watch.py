"""The data directory's free space: one warning when it drops under the
threshold, another only after it was back above; read-only is a health
matter, low space is not."""

from __future__ import annotations

import logging
import shutil
from collections import namedtuple
from pathlib import Path

from localserve.api.admin import disk_watch
from localserve.api.admin.disk_watch import DiskWatch

Usage = namedtuple("Usage", "total used free")


def test_low_space_warns_once_until_it_is_back_above(tmp_path: Path, monkeypatch, caplog) -> None:
    free = [10 << 30]
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(100 << 30, 0, free[0]))
    watch = DiskWatch(tmp_path, low_bytes=1 << 30)
    with caplog.at_level(logging.WARNING, logger=disk_watch.__name__):
        for value in (10 << 30, 900 << 20, 800 << 20, 1100 << 20, 700 << 20, 2 << 30, 500 << 20):
            free[0] = value
            watch.check()
    warnings = [r.message for r in caplog.records if "free (under" in r.message]
    assert len(warnings) == 2  # at 900 MiB, and again at 500 MiB after 2 GiB (1.1 GiB did not re-arm)
    assert watch.snapshot() == {
        "data_dir": str(tmp_path),
        "free_bytes": 500 << 20,
        "total_bytes": 100 << 30,
        "writable": True,
        "low": True,
    }
    assert watch.health() is None


def test_a_read_only_directory_says_so_in_health(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(disk_watch, "writable", lambda path: False)
    watch = DiskWatch(tmp_path / "data")
    with caplog.at_level(logging.WARNING, logger=disk_watch.__name__):
        watch.check_writable()
    assert watch.health() == {"data_dir": str(tmp_path / "data"), "writable": False}
    assert len([r for r in caplog.records if "read-only" in r.message]) == 1


def test_writable_looks_at_the_nearest_existing_folder(tmp_path: Path) -> None:
    from localserve.disk import writable

    assert writable(tmp_path / "not" / "made" / "yet")
    assert not (tmp_path / "not").exists()  # asking makes nothing
