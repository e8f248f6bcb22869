"""Sequence classifiers through the project's own graph builder with the
classifier head: a randomly initialised `BertForSequenceClassification`
(1 label: a cross-encoder; 3 labels: a classifier) converted without torch
and run on ONNX Runtime (plain, fused and int8 graphs) and OpenVINO, against
transformers' own logits: float32 within 1e-4; int8 with the same ranks and
a cosine >= 0.99. A pair's logits do not depend on what else is in its batch."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localserve.backends.onnx.classifier import OnnxClassifierBackend, OnnxClassifierConfig, PaddedClassifierBackend
from localserve.errors import ContextLengthError
from localserve.models.convert.bert_classifier import cached_classifier_onnx, read_classifier
from tests.fixtures.bert_classifier import LABELS_3, reference_logits, write_classifier

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")
pytest.importorskip("torch")

QUERY = "how do plants turn light into food"
PASSAGES = [
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "Chlorophyll absorbs mostly blue and red light, which is why leaves look green to us.",
    "The committee met on Tuesday to review the proposed budget for the coming fiscal year.",
    "In the dark reactions, carbon dioxide is fixed into organic compounds by the Calvin cycle.",
    "Engineers reported that the aging pipes lose nearly a fifth of the treated water before it reaches homes.",
    "a " * 60,
    "Héllo, wörld! naïve café — 東京.",
    "x",
]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("classifier-home")
        mp.setenv("LOCALSERVE_HOME", str(path))
        yield path


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_classifier(tmp_path_factory.mktemp("ce"), 1, fit=[(QUERY, p) for p in PASSAGES])


@pytest.fixture(scope="module")
def three_labels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_classifier(tmp_path_factory.mktemp("cls3"), 3, fit=[(p, None) for p in PASSAGES])


def onnx_backend(folder: Path, variant: str, **config: Any) -> OnnxClassifierBackend:
    path = cached_classifier_onnx(folder, f"ce-{folder.name}", variant=variant)
    return OnnxClassifierBackend(OnnxClassifierConfig(str(path), n_threads=1, **config))


def pair_logits(backend: PaddedClassifierBackend, query: str, passages: list[str]) -> np.ndarray:
    items = [backend.encode(query, p, truncate=True, param="documents")[0] for p in passages]
    return np.stack(backend.run(items))


def text_logits(backend: PaddedClassifierBackend, texts: list[str]) -> np.ndarray:
    return np.stack(backend.run([backend.encode(t, None, truncate=True, param="input")[0] for t in texts]))


def test_the_folder_reads_as_a_classifier(cross_encoder: Path, three_labels: Path) -> None:
    assert read_classifier(cross_encoder).labels == ("LABEL_0",)
    assert read_classifier(three_labels).labels == LABELS_3


@pytest.mark.parametrize("variant", ["plain", "fused"])
def test_float32_matches_transformers(home: Path, cross_encoder: Path, three_labels: Path, variant: str) -> None:
    backend = onnx_backend(cross_encoder, variant)
    expected = reference_logits(cross_encoder, [QUERY] * len(PASSAGES), PASSAGES)
    np.testing.assert_allclose(pair_logits(backend, QUERY, PASSAGES), expected, atol=1e-4)
    assert np.diff(np.sort(expected[:, 0])).min() > 0.5  # the scores spread (the head was fitted): no near-ties
    backend3 = onnx_backend(three_labels, variant)
    assert backend3.labels == LABELS_3
    np.testing.assert_allclose(text_logits(backend3, PASSAGES), reference_logits(three_labels, PASSAGES), atol=1e-4)


def test_int8_keeps_the_ranks(home: Path, cross_encoder: Path, three_labels: Path) -> None:
    expected = reference_logits(cross_encoder, [QUERY] * len(PASSAGES), PASSAGES)[:, 0]
    got = pair_logits(onnx_backend(cross_encoder, "int8"), QUERY, PASSAGES)[:, 0]
    assert list(np.argsort(-got)) == list(np.argsort(-expected)), (got, expected)
    assert float(got @ expected / np.linalg.norm(got) / np.linalg.norm(expected)) >= 0.99
    expected3 = reference_logits(three_labels, PASSAGES)
    got3 = text_logits(onnx_backend(three_labels, "int8"), PASSAGES)
    assert list(got3.argmax(axis=1)) == list(expected3.argmax(axis=1))
    flat, flat_expected = got3.ravel(), expected3.ravel()  # every input's logits: per row, 3 numbers are too few
    assert float(flat @ flat_expected / np.linalg.norm(flat) / np.linalg.norm(flat_expected)) >= 0.99


@pytest.mark.parametrize("variant", ["fused", "int8"])
def test_a_pair_scores_the_same_in_any_batch(home: Path, cross_encoder: Path, variant: str) -> None:
    backend = onnx_backend(cross_encoder, variant)
    alone = [pair_logits(backend, QUERY, [p])[0] for p in PASSAGES]
    together = pair_logits(backend, QUERY, PASSAGES)  # padded to the longest
    np.testing.assert_allclose(together, np.stack(alone), atol=1e-5)


def test_openvino_float32_matches_transformers(home: Path, cross_encoder: Path, three_labels: Path) -> None:
    pytest.importorskip("openvino")
    from localserve.backends.openvino.classifier import OpenVinoClassifierBackend, OpenVinoClassifierConfig
    from localserve.models.convert.bert_classifier import cached_classifier_openvino

    def backend(folder: Path) -> OpenVinoClassifierBackend:
        path = cached_classifier_openvino(folder, f"ov-{folder.name}")
        return OpenVinoClassifierBackend(OpenVinoClassifierConfig(str(path), device="cpu", precision="f32"))

    expected = reference_logits(cross_encoder, [QUERY] * len(PASSAGES), PASSAGES)
    np.testing.assert_allclose(pair_logits(backend(cross_encoder), QUERY, PASSAGES), expected, atol=1e-4)
    ov3 = backend(three_labels)
    assert ov3.labels == LABELS_3
    np.testing.assert_allclose(text_logits(ov3, PASSAGES), reference_logits(three_labels, PASSAGES), atol=1e-4)


def test_long_pairs_cut_the_document_only(home: Path, cross_encoder: Path) -> None:
    backend = onnx_backend(cross_encoder, "fused", max_input_tokens=32)
    long_doc = "word " * 100
    item, cut = backend.encode(QUERY, long_doc, truncate=True, param="documents[0]")
    query_ids = backend.encode(QUERY, None, truncate=False, param="query")[0].ids
    assert cut and len(item.ids) == 32 and item.ids[: len(query_ids)] == query_ids  # the query whole
    assert item.type_ids[len(query_ids)] == 1 and item.ids[-1] == 102  # the document, then [SEP]
    with pytest.raises(ContextLengthError, match="at most 32"):
        backend.encode(QUERY, long_doc, truncate=False, param="documents[0]")
    with pytest.raises(ContextLengthError, match="query is too long"):
        backend.encode(long_doc, "x", truncate=True, param="documents[0]")
    assert backend.encode(QUERY, "short", truncate=True, param="documents[0]")[1] is False


def test_a_rank_pooled_gguf_on_llama_cpp_matches_transformers(
    home: Path, cross_encoder: Path, three_labels: Path
) -> None:
    """llama.cpp adds token type 0 to every token of a BERT: against
    transformers fed type 0 too. A float32 GGUF, but ggml's CPU GELU reads a
    float16 table, so logits agree to about 1e-2 (ranks and labels exactly)."""
    from localserve.backends.llamacpp.classifier import LlamaClassifierBackend
    from localserve.backends.llamacpp.embeddings import LlamaEmbeddingConfig
    from localserve.models.convert.bert_classifier import cached_classifier_gguf
    from localserve.models.oneshot import detect_labels

    def backend(folder: Path) -> LlamaClassifierBackend:
        path = cached_classifier_gguf(folder, f"gguf-{folder.name}")
        assert detect_labels(path) == detect_labels(folder)  # rerank / classify, from the GGUF's pooling
        return LlamaClassifierBackend(LlamaEmbeddingConfig(str(path), n_threads=1))

    expected = reference_logits(cross_encoder, [QUERY] * len(PASSAGES), PASSAGES, type_zero=True)
    llama = backend(cross_encoder)
    assert llama.labels == ("LABEL_0",) and llama.padding_free
    items = [llama.encode(QUERY, p, truncate=True, param="documents")[0] for p in PASSAGES]
    got = np.stack(llama.run(items))
    np.testing.assert_allclose(got, expected, atol=2e-2)
    assert list(np.argsort(-got[:, 0])) == list(np.argsort(-expected[:, 0]))
    together, alone = np.stack(llama.run(items)), np.stack([llama.run([i])[0] for i in items])
    np.testing.assert_allclose(together, alone, atol=5e-3)  # ggml picks its matmul kernels by batch shape
    llama3 = backend(three_labels)
    assert llama3.labels == LABELS_3
    got3 = np.stack(llama3.run([llama3.encode(p, None, truncate=True, param="input")[0] for p in PASSAGES]))
    expected3 = reference_logits(three_labels, PASSAGES, type_zero=True)
    np.testing.assert_allclose(got3, expected3, atol=2e-2)
    assert list(got3.argmax(axis=1)) == list(expected3.argmax(axis=1))
