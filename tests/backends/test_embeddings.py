"""all-MiniLM-L6-v2 converted (no torch) to GGUF for llama.cpp and to ONNX for ONNX Runtime.

The converted model is checked against a plain-numpy BERT forward pass over
the original safetensors weights, and its tokenizer against the model's own
`tokenizer.json`: the conversion is exact, not merely plausible. The default
id runs on the faster backend (ONNX Runtime), and on llama.cpp where
onnxruntime is not installed.
"""

from __future__ import annotations

import asyncio
import functools
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localserve.backends.llamacpp.embeddings import LlamaEmbeddingBackend, LlamaEmbeddingConfig
from localserve.backends.onnx.embeddings import OnnxEmbeddingBackend, OnnxEmbeddingConfig
from localserve.engine.oneshot.queue import OneShotQueue, OneShotQueueConfig
from localserve.errors import ContextLengthError, InvalidRequestError
from localserve.models.convert.cache import cached_gguf, read_sentence_transformers
from localserve.models.oneshot import detect_labels, gguf_architecture
from localserve.models.registry import resolve

pytestmark = pytest.mark.slow

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "A monkey is playing drums.",
    "Héllo, wörld! It's 3.14 o'clock; naïve café — 東京.",
    "",
]


@pytest.fixture(scope="module")
def source() -> Path:
    return resolve("all-minilm-l6-v2").path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("localserve-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(home))
        yield home / "models"


@pytest.fixture(scope="module")
def progress_calls() -> list[tuple[str, int, int]]:
    return []


@pytest.fixture(scope="module")
def gguf_path(source: Path, store: Path, progress_calls: list[tuple[str, int, int]]) -> Path:
    return cached_gguf(source, "all-minilm-l6-v2", progress=lambda *call: progress_calls.append(call))


@pytest.fixture(scope="module")
def backend(gguf_path: Path) -> Iterator[LlamaEmbeddingBackend]:
    # One thread: no OpenMP barriers, so the tests keep their pace on a busy machine.
    b = LlamaEmbeddingBackend(LlamaEmbeddingConfig(str(gguf_path), n_threads=1))
    yield b
    b.close()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ---- conversion ----------------------------------------------------------------------


def test_conversion_lands_in_the_store_once(gguf_path: Path, store: Path, source: Path, progress_calls) -> None:
    assert gguf_path.is_file() and gguf_path.is_relative_to(store)
    assert not list(gguf_path.parent.glob("*.part"))  # written atomically
    stages = [stage for stage, _, _ in progress_calls]
    assert stages[-1] == "done" and "token_embd.weight" in stages
    done = [d for _, d, _ in progress_calls]
    assert done == sorted(done) and progress_calls[-1][1] == progress_calls[-1][2] == 101
    mtime = gguf_path.stat().st_mtime_ns
    assert cached_gguf(source, "all-minilm-l6-v2") == gguf_path  # cached: not rewritten
    assert gguf_path.stat().st_mtime_ns == mtime


def test_converted_file_is_a_bert_gguf_with_mean_pooling(gguf_path: Path, source: Path) -> None:
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))

    def value(key: str):  # noqa: ANN202
        field = reader.fields[key]
        return field.contents()

    assert value("general.architecture") == "bert"
    assert value("bert.pooling_type") == gguf.PoolingType.MEAN
    assert value("bert.attention.causal") is False
    assert value("localserve.embedding.normalize") is True
    assert value("tokenizer.ggml.model") == "bert"
    assert len(reader.tensors) == 101  # 5 embedding tensors + 16 per layer; pooler dropped
    st = read_sentence_transformers(source)
    assert st.pooling == "mean" and st.normalize
    assert gguf_architecture(gguf_path) == "bert"
    assert detect_labels(gguf_path) == ("embeddings",)
    assert detect_labels(source) == ("embeddings",)


def test_a_non_bert_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(InvalidRequestError, match="only BERT"):
        read_sentence_transformers(tmp_path)


# ---- tokenizer and numerics against the source --------------------------------------------


def test_tokenizer_matches_the_model_s_tokenizer_json(backend: LlamaEmbeddingBackend, source: Path) -> None:
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(source / "tokenizer.json"))
    reference.no_padding()
    for text in TEXTS:
        assert list(backend.tokenize(text)) == reference.encode(text).ids, text


@functools.cache
def load_weights(source: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(source / "model.safetensors"))


def numpy_minilm(source: Path, token_ids: list[int]) -> np.ndarray:
    """sentence-transformers' all-MiniLM-L6-v2 (BERT, mean pooling, L2
    normalisation), written out in numpy from the safetensors weights."""
    w = load_weights(source)
    n_head, eps = 12, 1e-12
    erf = np.vectorize(math.erf)

    def norm(x: np.ndarray, prefix: str) -> np.ndarray:
        mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + eps) * w[f"{prefix}.weight"] + w[f"{prefix}.bias"]

    def dense(x: np.ndarray, prefix: str) -> np.ndarray:
        return x @ w[f"{prefix}.weight"].T + w[f"{prefix}.bias"]

    n = len(token_ids)
    x = w["embeddings.word_embeddings.weight"][token_ids] + w["embeddings.position_embeddings.weight"][:n]
    x = norm(x + w["embeddings.token_type_embeddings.weight"][0], "embeddings.LayerNorm")
    for layer in range(6):
        p = f"encoder.layer.{layer}"
        q, k, v = (
            dense(x, f"{p}.attention.self.{m}").reshape(n, n_head, -1).transpose(1, 0, 2)
            for m in ("query", "key", "value")
        )
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        context = (scores / scores.sum(-1, keepdims=True) @ v).transpose(1, 0, 2).reshape(n, -1)
        x = norm(x + dense(context, f"{p}.attention.output.dense"), f"{p}.attention.output.LayerNorm")
        h = dense(x, f"{p}.intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
        x = norm(x + dense(h, f"{p}.output.dense"), f"{p}.output.LayerNorm")
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def test_embeddings_equal_a_numpy_bert_over_the_original_weights(backend: LlamaEmbeddingBackend, source: Path) -> None:
    items = [backend.tokenize(t) for t in TEXTS[:4]]
    for item, vector in zip(items, backend.run(items), strict=True):
        assert vector.shape == (384,) and vector.dtype == np.float32
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-5
        assert cosine(vector, numpy_minilm(source, list(item))) > 0.9999


# ---- the must-show properties -----------------------------------------------------------------


def test_food_is_closer_to_bread_than_to_drums(backend: LlamaEmbeddingBackend) -> None:
    food, bread, drums = backend.run([backend.tokenize(t) for t in TEXTS[:3]])
    assert cosine(food, bread) > 0.6 > 0.2 > cosine(food, drums)
    assert abs(cosine(food, bread) - 0.7553) < 0.01  # sentence-transformers' own figure for this pair


def sentences(count: int) -> list[str]:
    rng = np.random.default_rng(7)
    vocab = [
        "the",
        "a",
        "man",
        "woman",
        "dog",
        "cat",
        "is",
        "eating",
        "playing",
        "reading",
        "food",
        "bread",
        "drums",
        "book",
        "in",
        "park",
        "quickly",
    ]
    return [" ".join(rng.choice(vocab, size=int(rng.integers(2, 40)))) for _ in range(count)]


def test_a_batch_equals_one_by_one(backend: LlamaEmbeddingBackend) -> None:
    # 64 at once through the API: tests/api/test_embeddings_api.py
    items = [backend.tokenize(t) for t in sentences(32)]
    batched = backend.run(items)
    for item, vector in zip(items, batched, strict=True):
        assert cosine(vector, backend.run([item])[0]) > 0.999


async def test_the_queue_packs_concurrent_requests_into_one_forward_pass(backend: LlamaEmbeddingBackend) -> None:
    queue = OneShotQueue("minilm", backend, OneShotQueueConfig(max_batch_size=64))
    texts = sentences(24)
    alone = [backend.run([backend.tokenize(t)])[0] for t in texts]
    together = await asyncio.gather(*(queue.submit([backend.tokenize(t)]) for t in texts))
    for one, many in zip(alone, together, strict=True):
        assert cosine(one, many[0]) > 0.999
    stats = queue.stats()
    assert stats.max_batch_size_seen > 1 and stats.padding_ratio == 0.0  # what came during a run went together
    assert stats.backend == "llamacpp"
    await asyncio.to_thread(queue.close)


# ---- input checks ----------------------------------------------------------------------------


def test_inputs_the_model_cannot_embed_are_400s(backend: LlamaEmbeddingBackend) -> None:
    assert backend.max_input_tokens == 512
    with pytest.raises(ContextLengthError, match="at most 512 tokens"):
        backend.check([101] * 513, "input")
    with pytest.raises(InvalidRequestError, match="outside this model's vocabulary"):
        backend.check([101, 30522, 102], "input[3]")
    with pytest.raises(InvalidRequestError, match="empty"):
        backend.check([], "input")
    assert backend.check([101, 102], "input") == (101, 102)


@pytest.mark.parametrize(
    ("decode_tokens", "max_seqs", "expected"), [(64, 128, (64, 64)), (100, 8, (104, 8)), (160, 64, (192, 64))]
)
def test_context_sizes_llama_cpp_would_abort_on_are_rounded(
    gguf_path: Path, decode_tokens: int, max_seqs: int, expected: tuple[int, int]
) -> None:
    # llama.cpp kills the process (GGML_ASSERT) unless n_seq_max <= n_ubatch
    # and n_ubatch is a multiple of n_seq_max.
    b = LlamaEmbeddingBackend(
        LlamaEmbeddingConfig(str(gguf_path), n_threads=1, decode_tokens=decode_tokens, max_seqs=max_seqs)
    )
    try:
        assert (b.decode_tokens, b.max_seqs) == expected
        assert b.max_input_tokens == expected[0]
        vectors = b.run([b.tokenize(t) for t in sentences(10)])  # split over several forward passes
        assert len(vectors) == 10
    finally:
        b.close()


# ---- ONNX Runtime: the same weights as a hand-built ONNX graph -----------------------------------


@pytest.fixture(scope="module")
def onnx_backend(source: Path, store: Path) -> Iterator[OnnxEmbeddingBackend]:
    from localserve.models.convert.bert_onnx import cached_onnx

    path = cached_onnx(source, "all-minilm-l6-v2")
    assert path.is_relative_to(store) and detect_labels(path) == ("embeddings",)
    b = OnnxEmbeddingBackend(OnnxEmbeddingConfig(str(path), n_threads=2))
    yield b
    b.close()


def test_onnx_embeddings_equal_the_numpy_bert_and_llama_cpp(
    onnx_backend: OnnxEmbeddingBackend, backend: LlamaEmbeddingBackend, source: Path
) -> None:
    items = [onnx_backend.tokenize(t) for t in TEXTS[:4]]
    assert items == [backend.tokenize(t) for t in TEXTS[:4]]
    for item, onnx_vector, llama_vector in zip(items, onnx_backend.run(items), backend.run(items), strict=True):
        assert onnx_vector.shape == (384,)
        assert cosine(onnx_vector, numpy_minilm(source, list(item))) > 0.9999
        assert cosine(onnx_vector, llama_vector) > 0.9999


def test_onnx_padded_batches_equal_one_by_one(onnx_backend: OnnxEmbeddingBackend) -> None:
    assert not onnx_backend.padding_free
    items = [onnx_backend.tokenize(t) for t in sentences(16)]
    for item, vector in zip(items, onnx_backend.run(items), strict=True):  # padded to the longest
        assert cosine(vector, onnx_backend.run([item])[0]) > 0.9999


def test_onnx_threads_stop_spinning_between_runs(onnx_backend: OnnxEmbeddingBackend) -> None:
    """Spinning pool threads would burn the cores the event loop and a chat model share between batches."""
    options = onnx_backend._session.get_session_options()
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert options.intra_op_num_threads == 2


async def test_length_grouping_cuts_the_padding_onnx_computes(onnx_backend: OnnxEmbeddingBackend) -> None:
    texts = sentences(48)
    ratios = {}
    for by_length in (False, True):
        queue = OneShotQueue("onnx", onnx_backend, OneShotQueueConfig(max_batch_size=48, group_by_length=by_length))
        results = await asyncio.gather(*(queue.submit([onnx_backend.tokenize(t)]) for t in texts))
        assert len(results) == 48
        ratios[by_length] = queue.stats().padding_ratio
        await asyncio.to_thread(queue.close)
    assert ratios[True] < 0.3 and ratios[True] < ratios[False] / 2


# ---- the default backend: the faster one installed ---------------------------------------------


def open_default(model_id: str, source: Path):  # type: ignore[no-untyped-def]
    from localserve.config import ServerSettings
    from localserve.models.kinds import ModelKind
    from localserve.models.oneshot import open_oneshot

    return open_oneshot(ModelKind.EMBEDDINGS, model_id, source, ServerSettings(threads=1))


def test_the_default_id_runs_on_onnx_runtime_and_embeds_like_the_gguf_path(
    source: Path, store: Path, backend: LlamaEmbeddingBackend
) -> None:
    from localserve.models.oneshot_embeddings import listed_backend

    assert listed_backend("auto", source) == "auto: onnx"
    opened = open_default("all-minilm-l6-v2", source)
    try:
        assert opened.backend.info().backend == "onnxruntime" and opened.source.suffix == ".onnx"
        assert opened.batching.max_wait_ms == 0
        items = [backend.tokenize(t) for t in TEXTS[:4] + sentences(8)]
        for onnx_vector, gguf_vector in zip(opened.backend.run(items), backend.run(items), strict=True):
            assert cosine(onnx_vector, gguf_vector) > 0.99
        queue = OneShotQueue("all-minilm-l6-v2", opened.backend, opened.batching)
        assert queue.stats().backend == "onnxruntime"  # what /api/v1/stats shows under one_shot
        queue.close(10)
    finally:
        opened.backend.close()


def test_without_onnxruntime_the_default_id_falls_back_to_llama_cpp(
    source: Path, store: Path, backend: LlamaEmbeddingBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from localserve.errors import LocalServeError
    from localserve.models.oneshot_embeddings import choose_embeddings_backend, listed_backend

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if it were not installed
    assert listed_backend("auto", source) == "auto: llamacpp"
    assert choose_embeddings_backend(source, "auto").reason == "auto: onnxruntime not installed"
    opened = open_default("all-minilm-l6-v2", source)
    try:
        assert opened.backend.info().backend == "llamacpp" and opened.source.suffix == ".gguf"
        items = [backend.tokenize(t) for t in TEXTS[:3]]
        for fallback, gguf in zip(opened.backend.run(items), backend.run(items), strict=True):
            assert cosine(fallback, gguf) > 0.9999
    finally:
        opened.backend.close()
    with pytest.raises(LocalServeError, match=r"not installed here .*pip install 'localserve\[onnx\]'"):
        open_default("all-minilm-l6-v2-onnx", source)  # asked for by name: a clear error, no fallback


def test_the_explicit_ids_name_their_backend(source: Path, tmp_path: Path) -> None:
    from localserve.models.catalog import catalog_backend
    from localserve.models.oneshot_embeddings import EmbeddingsChoice, choose_embeddings_backend

    for model_id, expected in (
        ("all-minilm-l6-v2-gguf", "llamacpp"),
        ("all-minilm-l6-v2-onnx", "onnx"),
        ("all-minilm-l6-v2-openvino", "openvino"),
    ):
        assert choose_embeddings_backend(source, catalog_backend(model_id)).backend == expected, model_id
    assert catalog_backend("all-minilm-l6-v2") == "auto"
    assert choose_embeddings_backend(source, "").backend == "onnx"  # an id the catalog does not know: auto
    for name, expected in (("m.onnx", "onnx"), ("m.gguf", "llamacpp"), ("m.xml", "openvino")):
        (tmp_path / name).write_bytes(b"")  # a converted file is served by its format's backend
        assert choose_embeddings_backend(tmp_path / name, "onnx" if expected != "onnx" else "llamacpp") == (
            EmbeddingsChoice(expected, "file format")
        )


def test_the_convert_command_shows_progress_and_prints_the_path(
    store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from localserve.cli.main import main

    assert main(["convert", "all-minilm-l6-v2", "--type", "f16"]) == 0
    out, err = capsys.readouterr()
    path = Path(out.strip())
    assert path.is_file() and path.is_relative_to(store) and path.name.endswith("-f16.gguf")
    assert "converting all-minilm-l6-v2 [" in err and "101/101 done" in err and "converted in" in err
    assert main(["convert", "all-minilm-l6-v2", "--type", "f16"]) == 0
    assert "already converted" in capsys.readouterr().err
    assert main(["convert", "whisper-tiny.en"]) == 1
    assert "nothing to convert" in capsys.readouterr().err


def test_the_thread_count_changes_between_runs_with_the_same_vectors(gguf_path: Path) -> None:
    """The queue's adaptive threads (engine/threads.py) call
    `set_cpu_threads` between runs: the vectors stay the same."""
    b = LlamaEmbeddingBackend(LlamaEmbeddingConfig(str(gguf_path), n_threads=2))
    try:
        assert b.cpu_threads() == 2
        texts = [b.tokenize(t) for t in ("fresh bread", "a drum kit", "the weather in Paris")]
        on_two = b.run(texts)
        b.set_cpu_threads(1)
        on_one = b.run(texts)
        for x, y in zip(on_two, on_one, strict=True):
            np.testing.assert_allclose(x, y, atol=1e-5)
    finally:
        b.close()
