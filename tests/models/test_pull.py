"""Pulls through huggingface_hub from a fake hub (HF_ENDPOINT) into the Hugging
Face cache: progress, a dropped connection that resumes, quantization tags,
split models, checksums, tokens, offline mode, an unreachable hub."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from localserve.errors import ChecksumMismatchError, PullError
from localserve.models.pull.hub import PullCancelled, PullProgress, plan_pull, pull
from localserve.models.store import hf_cache
from localserve.models.store.discovery import find
from tests.models.conftest import write_catalog
from tests.models.hub import FakeHub, git_sha1

SIZE = 3_000_000


def gguf_bytes(size: int) -> bytes:
    return b"GGUF" + os.urandom(size - 4)


def cache_files(suffix: str = "") -> list[Path]:
    root = hf_cache.hub_cache_dir()
    return [p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock") and p.name.endswith(suffix)]


def test_pull_reports_progress_resumes_a_dropped_connection_and_lays_out_the_cache(hub: FakeHub) -> None:
    data = gguf_bytes(SIZE)
    key = hub.add("test/tiny-GGUF", "tiny-Q4_K_M.gguf", data)
    hub.add("test/tiny-GGUF", "tiny-Q8_0.gguf", gguf_bytes(1000))
    hub.drop_after[key] = 1_200_000
    events: list[PullProgress] = []

    result = pull(plan_pull("test/tiny-GGUF"), progress=events.append)  # no tag: Q4_K_M

    assert result.model_id == "test/tiny-GGUF:Q4_K_M" and result.path.read_bytes() == data and not result.existed
    # huggingface_hub's layout: a ref, a snapshot link, a blob named by the sha256
    repo = hf_cache.repo_folder("test/tiny-GGUF")
    commit = (repo / "refs" / "main").read_text()
    assert result.path == repo / "snapshots" / commit / "tiny-Q4_K_M.gguf" and result.path.is_symlink()
    assert result.path.resolve() == repo / "blobs" / hashlib.sha256(data).hexdigest()
    assert [g[0] for g in hub.gets] == [key, key] and hub.gets[0][1] is None
    assert int(hub.gets[1][1].removeprefix("bytes=").rstrip("-")) > 0  # the second GET asked for the rest
    assert hub.bytes_sent[key] - SIZE < SIZE
    assert not cache_files(".incomplete")
    downloading = [e for e in events if e.status == "downloading"]
    assert downloading[-1].completed == downloading[-1].total == SIZE
    assert downloading[-1].digest == hashlib.sha256(data).hexdigest()
    assert [e.completed for e in downloading] == sorted(e.completed for e in downloading)
    assert events[0].status == "resolving" and events[-1].status == "success"
    assert "tiny-Q8_0.gguf" not in [g[0].rsplit("/", 1)[1] for g in hub.gets]  # only the quantization asked for
    found = find("test/tiny-GGUF:q4_k_m")
    assert found is not None and found.name == "test/tiny-GGUF:Q4_K_M" and found.source == "huggingface"

    again: list[PullProgress] = []
    assert pull(plan_pull("test/tiny-GGUF:Q4_K_M"), progress=again.append).existed
    assert [e.status for e in again] == ["exists"] and len(hub.gets) == 2


def test_a_split_model_comes_down_whole_and_loads_from_its_first_part(hub: FakeHub) -> None:
    parts = [gguf_bytes(200_000), os.urandom(150_000)]
    for i, part in enumerate(parts, 1):
        hub.add("test/split-GGUF", f"big-Q8_0-{i:05d}-of-00002.gguf", part)
    hub.add("test/split-GGUF", "big-Q2_K.gguf", gguf_bytes(1000))
    result = pull(plan_pull("test/split-GGUF:Q8_0"))
    assert result.path.name == "big-Q8_0-00001-of-00002.gguf" and result.size_bytes == sum(map(len, parts))
    assert (result.path.parent / "big-Q8_0-00002-of-00002.gguf").read_bytes() == parts[1]
    with pytest.raises(PullError, match="no GGUF file for 'Q5_K_M'.*Q2_K, Q8_0"):
        pull(plan_pull("test/split-GGUF:Q5_K_M"))


def test_an_interrupted_pull_resumes_from_its_incomplete_file(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("localserve.models.pull.progress.PROGRESS_INTERVAL_S", 0.0)  # a report per chunk
    data = gguf_bytes(SIZE)
    key = hub.add("test/tiny-GGUF", "tiny-Q4_K_M.gguf", data)
    cancel = threading.Event()

    def stop_midway(progress: PullProgress) -> None:
        if progress.completed > SIZE // 3:
            cancel.set()

    plan = plan_pull("test/tiny-GGUF:Q4_K_M")
    with pytest.raises(PullCancelled):
        pull(plan, progress=stop_midway, cancel=cancel)
    incomplete = cache_files(".incomplete")
    assert len(incomplete) == 1 and find("test/tiny-GGUF:Q4_K_M") is None  # a half-downloaded file is never served
    kept = incomplete[0].stat().st_size

    pull(plan)
    assert hub.gets[-1] == (key, f"bytes={kept}-")
    assert find("test/tiny-GGUF:Q4_K_M").path.read_bytes() == data  # type: ignore[union-attr]


def test_checksum_mismatch_deletes_the_file(hub: FakeHub) -> None:
    hub.add("test/bad", "model-Q4_0.gguf", gguf_bytes(200_000), served_sha256="ab" * 32)
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        pull(plan_pull("test/bad"))
    assert cache_files(".gguf") == [] and not [p for p in cache_files() if p.parent.name == "blobs"]
    assert find("test/bad") is None


def test_a_catalog_digest_that_disagrees_with_the_hub_downloads_nothing(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("test/pinned", "model.gguf", gguf_bytes(100_000))
    entry = {"id": "pinned", "sources": [{"uri": "hf://test/pinned/model.gguf", "sha256": {"model.gguf": "cd" * 32}}]}
    write_catalog(tmp_path / "catalog.json", [entry])
    with pytest.raises(ChecksumMismatchError, match="pins"):
        pull(plan_pull("pinned"))
    assert hub.gets == []


def test_a_folder_model_with_small_files_checked_by_git_sha1(hub: FakeHub, tmp_path: Path) -> None:
    config = b'{"model_type": "test"}'
    weights = os.urandom(300_000)
    hub.add("test/folder", "config.json", config, lfs=False)
    hub.add("test/folder", "sub/model.bin", weights)
    entry = {
        "id": "folder-model",
        "labels": ["transcription"],
        "backend": "whisper",
        "sources": [{"uri": "hf://test/folder", "files": ["config.json", "sub/model.bin"]}],
    }
    write_catalog(tmp_path / "catalog.json", [entry])
    result = pull(plan_pull("folder-model"))
    assert result.path.is_dir() and (result.path / "config.json").read_bytes() == config
    assert (result.path / "sub" / "model.bin").read_bytes() == weights

    hub.add("test/lying", "lying.json", b"these bytes", lfs=False, served_git_sha1=git_sha1(b"other bytes"))
    with pytest.raises(ChecksumMismatchError, match="git sha1"):
        pull(plan_pull("hf://test/lying/lying.json"))


def test_offline_mode_and_an_unreachable_hub_fail_at_once_with_what_to_set(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add("test/tiny-GGUF", "tiny-Q4_K_M.gguf", gguf_bytes(50_000))
    pull(plan_pull("test/tiny-GGUF"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    events: list[PullProgress] = []
    assert pull(plan_pull("test/tiny-GGUF:Q4_K_M"), progress=events.append).existed  # no network needed
    assert [e.status for e in events] == ["exists"]
    with pytest.raises(PullError, match="HF_HUB_OFFLINE"):
        pull(plan_pull("test/other-GGUF"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for endpoint, reason in (("http://127.0.0.1:9", "Connection refused"), ("http://no-such-host.invalid", "")):
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        started = time.monotonic()
        with pytest.raises(PullError) as caught:
            pull(plan_pull("test/other-GGUF"))
        message = caught.value.message
        assert time.monotonic() - started < 5 and "\n" not in message
        assert endpoint in message and "HF_ENDPOINT" in message and "HF_HUB_OFFLINE" in message and reason in message


def test_hf_token_is_sent_and_hub_errors_are_clear(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_test")
    hub.add("test/tiny-GGUF", "tiny-Q4_K_M.gguf", gguf_bytes(10_000))
    pull(plan_pull("test/tiny-GGUF"))
    assert hub.auth and all(a == "Bearer hf_secret_for_test" for a in hub.auth)
    with pytest.raises(PullError, match="not found in test/tiny-GGUF"):
        pull(plan_pull("hf://test/tiny-GGUF/missing.gguf"))
    with pytest.raises(PullError, match="not on the hub"):
        pull(plan_pull("test/nobody"))
