"""`localserve cache` and `localserve cache prune` over a model store holding
superseded conversions and exports, partial leftovers, prefix-cache folders
and pulls; a conversion removes what it supersedes; a conversion or a pull
that meets a full disk stops with one line naming the space needed and free,
and leaves no partial file."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from localserve.cli.main import main
from localserve.errors import InsufficientStorageError
from localserve.models import caches
from localserve.models.convert.cache import cached_gguf, write_atomically
from localserve.models.pull import hub as hub_module
from localserve.models.pull.hub import plan_pull, pull
from localserve.models.registry import resolve
from tests.fixtures.small_disk import small_tmpfs
from tests.models.hub import FakeHub
from tests.models.test_pull import gguf_bytes

DAY = 24 * 3600


def make(path: Path, size: int, age_s: float, *, folder: bool = False, complete: bool = True) -> Path:
    if folder:
        path.mkdir(parents=True)
        (path / "model.onnx").write_bytes(bytes(size))
        if complete:
            (path / ".complete").write_text("ok\n")
        stamped = [path / "model.onnx", *([path / ".complete"] if complete else []), path]
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes(size))
        stamped = [path]
    when = time.time() - age_s
    for p in stamped:
        os.utime(p, (when, when))
    return path


@pytest.fixture
def store(home: Path) -> Path:
    """A store with two conversions of one model and format (the older one
    superseded), another format, two exports, an unfinished export and a
    temporary file, plus a prefix-cache folder."""
    m = home / "models" / "mini"
    make(m / "mini-aaaaaaaaaaaa-f32.gguf", 3000, 5 * DAY)
    make(m / "mini-bbbbbbbbbbbb-f32.gguf", 4000, 1 * DAY)
    make(m / "mini-cccccccccccc-f16.gguf", 2000, 40 * DAY)
    make(m / "mini-dddddddddddd-onnx-fp32", 5000, 9 * DAY, folder=True)
    make(m / "mini-eeeeeeeeeeee-onnx-fp32", 6000, 2 * DAY, folder=True)
    make(m / "mini-ffffffffffff-openvino-fp32", 7000, 3 * DAY, folder=True, complete=False)
    make(m / ".mini-bbbbbbbbbbbb-f32.gguf.x1y2.part", 100, 2 * DAY)
    kv = make(home / "prefix-cache" / "0123456789ab" / "k.kv", 1000, 10 * DAY)
    os.utime(kv.parent, (kv.stat().st_mtime, kv.stat().st_mtime))
    return home / "models"


def test_survey_sorts_every_entry_and_marks_the_superseded(store: Path) -> None:
    report = caches.survey()
    by_name = {e.path.name: e for e in report.entries}
    assert by_name["mini-aaaaaaaaaaaa-f32.gguf"].superseded and not by_name["mini-bbbbbbbbbbbb-f32.gguf"].superseded
    assert not by_name["mini-cccccccccccc-f16.gguf"].superseded  # another format
    assert (
        by_name["mini-dddddddddddd-onnx-fp32"].kind == "exports" and by_name["mini-dddddddddddd-onnx-fp32"].superseded
    )
    assert by_name["mini-ffffffffffff-openvino-fp32"].kind == "partial"  # never completed
    assert by_name[".mini-bbbbbbbbbbbb-f32.gguf.x1y2.part"].kind == "partial"
    assert by_name["mini-eeeeeeeeeeee-onnx-fp32"].num_bytes == 6003  # the folder's files
    assert [e.path.name for e in report.of("prefix")] == ["0123456789ab"]


def test_cache_lists_each_cache_with_its_size(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache"]) == 0
    out = capsys.readouterr().out
    assert "conversions: 3 entries" in out and "exports: 2 entries" in out and "prefix cache: 1 entries" in out
    assert "mini-aaaaaaaaaaaa-f32.gguf  superseded" in out
    assert f"({store})" in out


def test_prune_keeps_only_the_newest_conversion_and_export(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "prune", "--dry-run"]) == 0
    assert "would remove 4 entries" in capsys.readouterr().out
    assert len(list((store / "mini").iterdir())) == 7  # a dry run removes nothing
    assert main(["cache", "prune"]) == 0
    out = capsys.readouterr().out
    assert "removed 4 entries" in out and "(superseded)" in out and "(partial)" in out
    left = sorted(p.name for p in (store / "mini").iterdir())
    assert left == ["mini-bbbbbbbbbbbb-f32.gguf", "mini-cccccccccccc-f16.gguf", "mini-eeeeeeeeeeee-onnx-fp32"]
    assert (store.parent / "prefix-cache" / "0123456789ab").is_dir()


def test_prune_older_than_removes_what_was_not_used(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "prune", "--older-than", "7"]) == 0
    left = sorted(p.name for p in (store / "mini").iterdir())
    assert left == ["mini-bbbbbbbbbbbb-f32.gguf", "mini-eeeeeeeeeeee-onnx-fp32"]  # the 40-day f16 went too
    assert not (store.parent / "prefix-cache" / "0123456789ab").exists()


def test_a_fresh_partial_file_is_left_to_the_conversion_writing_it(home: Path) -> None:
    fresh = make(home / "models" / "mini" / ".mini-aaaaaaaaaaaa-f32.gguf.abc.part", 10, 60)
    caches.prune(caches.survey())
    assert fresh.exists()


@pytest.mark.slow
def test_a_conversion_removes_the_one_it_supersedes(home: Path) -> None:
    source = resolve("all-minilm-l6-v2").path
    older = make(home / "models" / "mini" / "mini-000000000000-f32.gguf", 10, DAY)
    other_format = make(home / "models" / "mini" / "mini-000000000000-f16.gguf", 10, DAY)
    path = cached_gguf(source, "mini")
    assert path.is_file() and not older.exists() and other_format.exists()


# ---- a full disk --------------------------------------------------------------------------


@pytest.mark.slow
def test_a_conversion_that_cannot_fit_says_so_before_writing(home: Path, tmp_path: Path) -> None:
    source = resolve("all-minilm-l6-v2").path
    with small_tmpfs(home, "2m"):
        with pytest.raises(InsufficientStorageError) as raised:
            cached_gguf(source, "mini")
        assert "needs about" in raised.value.message and "free" in raised.value.message
        assert raised.value.status == 507
        assert not [p for p in home.rglob("*") if p.is_file()]


def test_a_write_that_fills_the_disk_leaves_no_partial_file(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "2m") as disk:
        target = disk / "models" / "mini" / "mini-aaaaaaaaaaaa-f32.gguf"
        with pytest.raises(InsufficientStorageError) as raised:
            write_atomically(target, lambda tmp: tmp.write_bytes(bytes(3 << 20)))
        assert "No space left" in raised.value.message and str(target.parent) in raised.value.message
        assert not list(target.parent.iterdir())


def test_a_pull_that_fills_the_disk_stops_and_removes_its_partial_file(
    hub: FakeHub, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hf = Path(os.environ["HF_HOME"])
    hub.add("test/big-GGUF", "big-Q8_0.gguf", gguf_bytes(3 << 20))
    with small_tmpfs(hf, "4m"):
        make(hf / "ballast", 2 << 20, 0)  # room for the pre-check's sake, not for the file
        monkeypatch.setattr(hub_module, "_check_disk_space", lambda needed: None)
        with pytest.raises(InsufficientStorageError) as raised:
            pull(plan_pull("test/big-GGUF:Q8_0"))
        message = raised.value.message
        assert "pulling test/big-GGUF/big-Q8_0.gguf" in message and "needs about 3.0 MiB" in message, message
        assert raised.value.status == 507
        assert not list(hf.rglob("*.incomplete"))


def test_a_pull_larger_than_the_free_space_is_refused_up_front(hub: FakeHub, home: Path) -> None:
    hf = Path(os.environ["HF_HOME"])
    hub.add("test/big-GGUF", "big-Q8_0.gguf", gguf_bytes(3 << 20))
    with small_tmpfs(hf, "2m"):
        with pytest.raises(InsufficientStorageError) as raised:
            pull(plan_pull("test/big-GGUF:Q8_0"))
        assert "needs about 3.0 MiB" in raised.value.message
        assert not list(hf.rglob("*.incomplete"))


def test_a_command_that_meets_a_full_disk_says_so_in_one_line(
    home: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    from localserve.cli import cache as cache_command

    def full(args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", "/data/answers.jsonl")

    monkeypatch.setattr(cache_command, "cmd_cache", full)
    assert main(["cache"]) == 1
    err = capsys.readouterr().err
    assert err == (
        "localserve: error: No space left on device (/data/answers.jsonl): free some space (`localserve cache prune`)\n"
    )
