"""A cross-encoder and a text classifier served from Hugging Face folders
(`--model ce=DIR`: a randomly initialised `BertForSequenceClassification`,
1 and 3 labels, as `save_pretrained` writes it): `/v1/rerank` ranks by
transformers' own scores, `/v1/classify` answers transformers' own
probabilities under the model's labels, and each kind refuses the other's
work with a 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from localserve.models.convert.bert_classifier import cached_classifier_gguf
from tests.api.harness import ServerThread, make_settings
from tests.fixtures.bert_classifier import LABELS_3, reference_logits, write_classifier

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("torch")

QUERY = "how do plants turn light into food"
DOCUMENTS = [
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "The committee met on Tuesday to review the proposed budget for the coming fiscal year.",
    "Chlorophyll absorbs mostly blue and red light.",
    "a " * 40,
    "x",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    ce = write_classifier(tmp_path_factory.mktemp("ce"), 1, fit=[(QUERY, d) for d in DOCUMENTS])
    return ce, write_classifier(tmp_path_factory.mktemp("cls"), 3, fit=[(d, None) for d in DOCUMENTS])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, folders: tuple[Path, Path]) -> Iterator[ServerThread]:
    ce, cls = folders
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(tmp_path_factory.mktemp("localserve-home")))
        gguf = cached_classifier_gguf(ce, "ce-gguf")  # a GGUF with rank pooling, as llama.cpp's rerankers are
        models = [f"ce={ce}", f"cls={cls}", f"ce-gguf={gguf}"]
        srv = ServerThread(make_settings(models=models, threads=1)).start()
        try:
            srv.wait_healthy(timeout=180)
            yield srv
        finally:
            srv.stop()


@pytest.fixture
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def test_rerank_ranks_by_transformers_scores(http: httpx.Client, folders: tuple[Path, Path]) -> None:
    expected = 1 / (1 + np.exp(-reference_logits(folders[0], [QUERY] * len(DOCUMENTS), DOCUMENTS)[:, 0]))
    body = http.post("/v1/rerank", json={"model": "ce", "query": QUERY, "documents": DOCUMENTS}).json()
    assert [r["index"] for r in body["results"]] == list(np.argsort(-expected))
    got = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert max(abs(got[i] - expected[i]) for i in range(len(DOCUMENTS))) < 1e-4
    assert body["meta"]["method"] == "cross-encoder"
    scores = http.post("/v1/score", json={"model": "ce", "text_1": QUERY, "text_2": DOCUMENTS}).json()["data"]
    assert max(abs(d["score"] - expected[d["index"]]) for d in scores) < 1e-4


def test_a_gguf_reranker_serves_on_llama_cpp(http: httpx.Client, folders: tuple[Path, Path]) -> None:
    logits = reference_logits(folders[0], [QUERY] * len(DOCUMENTS), DOCUMENTS, type_zero=True)[:, 0]
    body = http.post("/v1/rerank", json={"model": "ce-gguf", "query": QUERY, "documents": DOCUMENTS}).json()
    assert [r["index"] for r in body["results"]] == list(np.argsort(-logits)), body
    assert body["meta"]["method"] == "cross-encoder"
    stats = http.get("/api/v1/stats").json()["one_shot"]["ce-gguf"]
    assert stats["backend"] == "llamacpp" and stats["padding_free"] is True


def test_classify_answers_the_labels_and_probabilities(http: httpx.Client, folders: tuple[Path, Path]) -> None:
    logits = reference_logits(folders[1], DOCUMENTS)
    expected = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    body = http.post("/v1/classify", json={"model": "cls", "input": DOCUMENTS}).json()
    assert [d["index"] for d in body["data"]] == list(range(len(DOCUMENTS)))
    assert [d["label"] for d in body["data"]] == [LABELS_3[i] for i in expected.argmax(axis=1)]
    np.testing.assert_allclose([d["probs"] for d in body["data"]], expected, atol=1e-4)
    assert body["data"][0]["num_classes"] == 3 and body["meta"]["labels"] == list(LABELS_3)
    one = http.post("/v1/classify", json={"model": "cls", "input": DOCUMENTS[0]}).json()
    assert len(one["data"]) == 1 and one["usage"]["prompt_tokens"] > 3


def test_the_models_are_listed_with_their_kinds(http: httpx.Client) -> None:
    listed = {m["id"]: m["meta"] for m in http.get("/v1/models").json()["data"]}
    assert listed["ce"]["kind"] == "rerank" and listed["ce"]["rerank"] == "cross-encoder"
    assert listed["cls"]["kind"] == "classify" and "rerank" not in listed["cls"]


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/v1/rerank", {"model": "cls", "query": QUERY, "documents": DOCUMENTS}, "is a classify model"),
        ("/v1/embeddings", {"model": "ce", "input": "x"}, "is a rerank model"),
        ("/v1/chat/completions", {"model": "cls", "messages": [{"role": "user", "content": "hi"}]}, "/v1/classify"),
        ("/v1/rerank", {"model": "ce", "query": QUERY, "documents": ["word " * 600], "truncate": False}, "at most 512"),
    ],
)
def test_the_wrong_work_is_a_400(http: httpx.Client, path: str, body: dict, fragment: str) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]["message"]


def test_a_long_document_is_cut_and_said(http: httpx.Client) -> None:
    body = http.post("/v1/rerank", json={"model": "ce", "query": QUERY, "documents": ["x", "word " * 600]}).json()
    assert body["meta"]["truncated_documents"] == [1]
    stats = http.get("/api/v1/stats").json()["one_shot"]["ce"]
    assert stats["items"] >= 2 and stats["padding_free"] is False
