"""Pulls from a fake hub (HF_ENDPOINT): progress, a dropped connection that
resumes, checksums, tokens, offline mode."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from localserve.errors import ChecksumMismatchError, PullError
from localserve.models.catalog import locate
from localserve.models.pull import PullCancelled, PullProgress, plan_pull, pull
from localserve.models.store import ModelStore
from tests.models.conftest import write_catalog
from tests.models.hub import FakeHub, git_sha1

SIZE = 3_000_000


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_pull_reports_progress_and_resumes_after_a_dropped_connection(hub: FakeHub) -> None:
    data = os.urandom(SIZE)
    key = hub.add("test/tiny", "model.gguf", data)
    hub.drop_after[key] = 1_200_000
    events: list[PullProgress] = []

    manifest = pull(plan_pull("hf://test/tiny/model.gguf", name="tiny"), progress=events.append)

    store = ModelStore()
    path = store.model_path("tiny")
    assert path is not None and path.read_bytes() == data
    assert manifest.files[0].sha256 == hashlib.sha256(data).hexdigest()
    # The second GET asked for the rest only: fewer bytes re-sent than the file has.
    assert [g[0] for g in hub.gets] == [key, key]
    assert hub.gets[0][1] is None
    resumed_at = int(hub.gets[1][1].removeprefix("bytes=").rstrip("-"))
    assert resumed_at > 0
    assert hub.bytes_sent[key] - SIZE < SIZE
    assert not [p for p in files_under(store.root) if p.name.endswith(".partial")]
    downloading = [e for e in events if e.status == "downloading"]
    assert downloading[-1].completed == downloading[-1].total == SIZE
    assert [e.completed for e in downloading] == sorted(e.completed for e in downloading)
    assert any(e.rate_bytes_per_s > 0 and e.eta_s is not None for e in downloading)
    assert events[0].status == "resolving" and events[-1].status == "success"
    assert locate("tiny") is not None and locate("tiny").labels == ("chat",)  # type: ignore[union-attr]


def test_an_interrupted_pull_resumes_from_its_partial_file(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("localserve.models.pull.PROGRESS_INTERVAL_S", 0.0)  # a report per chunk
    data = os.urandom(SIZE)
    key = hub.add("test/tiny", "model.gguf", data)
    cancel = threading.Event()

    def stop_midway(progress: PullProgress) -> None:
        if progress.completed > SIZE // 3:
            cancel.set()

    plan = plan_pull("hf://test/tiny/model.gguf", name="tiny")
    with pytest.raises(PullCancelled):
        pull(plan, progress=stop_midway, cancel=cancel)
    store = ModelStore()
    partial = [p for p in files_under(store.root) if p.name.endswith(".partial")]
    assert len(partial) == 1 and store.model_path("tiny") is None  # a half-downloaded file is never served
    kept = partial[0].stat().st_size

    pull(plan)
    assert hub.gets[-1] == (key, f"bytes={kept}-")
    assert store.model_path("tiny").read_bytes() == data  # type: ignore[union-attr]


def test_checksum_mismatch_refuses_the_file(hub: FakeHub) -> None:
    hub.add("test/bad", "model.gguf", os.urandom(200_000), served_sha256="ab" * 32)
    with pytest.raises(ChecksumMismatchError, match="sha256"):
        pull(plan_pull("hf://test/bad/model.gguf", name="bad"))
    store = ModelStore()
    assert files_under(store.root) == []  # neither the file nor a .partial stays
    assert store.model_path("bad") is None and locate("bad") is None


def test_a_catalog_digest_that_disagrees_with_the_hub_downloads_nothing(hub: FakeHub, tmp_path: Path) -> None:
    hub.add("test/pinned", "model.gguf", os.urandom(100_000))
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
        "sources": [{"uri": "hf://test/folder@v1", "files": ["config.json", "sub/model.bin"]}],
    }
    write_catalog(tmp_path / "catalog.json", [entry])
    manifest = pull(plan_pull("folder-model"))
    folder = ModelStore().model_path("folder-model")
    assert folder is not None and folder.is_dir()
    assert (folder / "config.json").read_bytes() == config and (folder / "sub" / "model.bin").read_bytes() == weights
    assert manifest.revision == "v1" and manifest.labels == ("transcription",)
    located = locate("folder-model")
    assert located is not None and located.path == folder and located.origin == "store"

    hub.add("test/folder", "lying.json", b"these bytes", lfs=False, served_git_sha1=git_sha1(b"other bytes"))
    with pytest.raises(ChecksumMismatchError, match="git sha1"):
        pull(plan_pull("hf://test/folder/lying.json", name="lying"))
    assert files_under(ModelStore().model_dir("lying")) == []


def test_already_pulled_needs_no_network_and_offline_mode_is_honoured(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add("test/tiny", "model.gguf", os.urandom(50_000))
    plan = plan_pull("hf://test/tiny/model.gguf", name="tiny")
    pull(plan)
    num_gets = len(hub.gets)
    events: list[PullProgress] = []
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pull(plan, progress=events.append)
    assert [e.status for e in events] == ["exists"] and len(hub.gets) == num_gets
    with pytest.raises(PullError, match="HF_HUB_OFFLINE"):
        pull(plan_pull("hf://test/tiny/model.gguf", name="other"))


def test_hf_token_is_sent_and_hub_errors_are_clear(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_test")
    hub.add("test/tiny", "model.gguf", os.urandom(10_000))
    pull(plan_pull("hf://test/tiny/model.gguf", name="tiny"))
    assert hub.auth and all(a == "Bearer hf_secret_for_test" for a in hub.auth)
    with pytest.raises(PullError, match="not found on the hub"):
        pull(plan_pull("hf://test/tiny/missing.gguf", name="missing"))
