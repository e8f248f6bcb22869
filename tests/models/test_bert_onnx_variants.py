"""The ONNX graphs of all-MiniLM-L6-v2 (the real model, from its PyPI package):
`fused` (ONNX Runtime's contrib operators) gives the embeddings of the plain
graph the converter built before (cosine >= 0.999), and `int8` stays within
cosine >= 0.99 of float32 on a fixed set of queries and passages, with a
text's vector the same in any batch (activations are quantized per token).
The catalog ids open the variant they name; the default id opens `int8`, the
fastest variant that passes the accuracy check.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from localserve.backends.onnx.embeddings import OnnxEmbeddingBackend, OnnxEmbeddingConfig
from localserve.models.convert.bert_onnx import VARIANTS, cached_onnx
from localserve.models.registry import resolve

pytestmark = pytest.mark.slow

QUERIES = [
    "how do I reset my router password",
    "best way to store fresh basil",
    "what causes the northern lights",
    "python list comprehension with condition",
    "symptoms of vitamin D deficiency",
    "cheap flights from Berlin to Lisbon in May",
    "who wrote the novel Middlemarch",
    "difference between TCP and UDP",
]
SENTENCES = [
    "The committee met on Tuesday to review the proposed budget for the coming fiscal year.",
    "Several members raised concerns about rising maintenance costs at the municipal water plant.",
    "Engineers reported that the aging pipes lose nearly a fifth of the treated water before it reaches homes.",
    "A pilot program to replace the oldest sections will begin in the eastern district next spring.",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
    "Chlorophyll absorbs mostly blue and red light, which is why leaves look green to us.",
    "In the dark reactions, carbon dioxide is fixed into organic compounds by the Calvin cycle.",
    "Some desert plants open their stomata only at night to reduce the loss of water.",
]
ODD = [
    "Héllo, wörld! It's 3.14 o'clock; naïve café — 東京.",
    "def add(a, b):\n    return a + b  # 42",
    "a " * 100,
    "x",
]
#: queries, ~200-token passages (rotations of SENTENCES), and odd inputs
TEXTS = QUERIES + [" ".join(SENTENCES[(i + j) % 8] for j in range(12)) for i in range(4)] + ODD


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
def backends(source: Path, store: Path) -> Iterator[dict[str, OnnxEmbeddingBackend]]:
    opened = {
        variant: OnnxEmbeddingBackend(
            OnnxEmbeddingConfig(str(cached_onnx(source, "minilm", variant=variant)), n_threads=2)
        )
        for variant in VARIANTS
    }
    yield opened
    for b in opened.values():
        b.close()


def cosines(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    x, y = np.stack(a), np.stack(b)
    return np.asarray((x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)))


def embed(b: OnnxEmbeddingBackend, batched: bool) -> list[np.ndarray]:
    items = [b.tokenize(t) for t in TEXTS]
    return b.run(items) if batched else [b.run([item])[0] for item in items]


def test_the_passages_are_long_and_the_queries_short(backends: dict[str, OnnxEmbeddingBackend]) -> None:
    lengths = [len(backends["plain"].tokenize(t)) for t in TEXTS]
    assert max(lengths[: len(QUERIES)]) <= 16 and 180 <= min(lengths[len(QUERIES) : len(QUERIES) + 4]) <= 260


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "padded-batch"])
def test_the_fused_graph_embeds_like_the_plain_one(backends: dict[str, OnnxEmbeddingBackend], batched: bool) -> None:
    plain, fused = embed(backends["plain"], batched), embed(backends["fused"], batched)
    assert cosines(fused, plain).min() >= 0.999
    assert np.abs(np.stack(fused) - np.stack(plain)).max() < 1e-4  # float rounding only


@pytest.mark.parametrize("batched", [False, True], ids=["one-by-one", "padded-batch"])
def test_int8_stays_within_the_accuracy_bound_of_float32(
    backends: dict[str, OnnxEmbeddingBackend], batched: bool
) -> None:
    float32, int8 = embed(backends["fused"], batched), embed(backends["int8"], batched)
    found = cosines(int8, float32)
    assert found.min() >= 0.99, dict(zip(TEXTS, found.round(4), strict=True))
    assert found.mean() >= 0.995


def test_an_int8_vector_does_not_depend_on_its_batchmates(backends: dict[str, OnnxEmbeddingBackend]) -> None:
    """Per-token activation scales: a text alone, in a padded batch of mixed
    lengths, and among other texts gives the same vector to float rounding
    (the integer products are exact). ORT's per-call quantization moved
    vectors by ~1e-2 here."""
    one_by_one, batched = embed(backends["int8"], False), embed(backends["int8"], True)
    np.testing.assert_allclose(np.stack(batched), np.stack(one_by_one), atol=1e-6)
    short = backends["int8"].tokenize("x")
    assert (
        np.abs(backends["int8"].run([short, *(backends["int8"].tokenize(t) for t in TEXTS)])[0] - one_by_one[-1]).max()
        < 1e-6
    )


def test_the_fused_graph_is_onnx_runtimes_fused_operators(source: Path, store: Path) -> None:
    import onnx

    counts = collections.Counter(
        n.op_type for n in onnx.load(str(cached_onnx(source, "minilm", variant="fused"))).graph.node
    )
    assert counts["EmbedLayerNormalization"] == 1 and counts["Attention"] == 6 and counts["BiasGelu"] == 6
    assert counts["SkipLayerNormalization"] == 12 and counts["Softmax"] == counts["Erf"] == 0
    int8 = collections.Counter(
        n.op_type for n in onnx.load(str(cached_onnx(source, "minilm", variant="int8"))).graph.node
    )
    # the four projections of each layer; attention on the projected Q, K, V
    assert int8["MatMulIntegerToFloat"] == 24 and int8["MatMul"] == 0 and int8["MultiHeadAttention"] == 6
    assert int8["QuantizeLinear"] == 24 and int8["Attention"] == 0


@pytest.mark.parametrize(
    ("model_id", "suffix"),
    [
        ("all-minilm-l6-v2", "int8-rows.onnx"),
        ("all-minilm-l6-v2-onnx", "f32-fused.onnx"),
        ("all-minilm-l6-v2-onnx-int8", "int8-rows.onnx"),
    ],
)
def test_each_catalog_id_opens_its_variant(source: Path, store: Path, model_id: str, suffix: str) -> None:
    from localserve.config import ServerSettings
    from localserve.models.oneshot_embeddings import open_embeddings

    backend, path = open_embeddings(model_id, source, ServerSettings(threads=1))
    try:
        assert path.name.endswith(suffix) and path.is_relative_to(store)
        assert backend.info().backend == "onnxruntime"
    finally:
        backend.close()


def test_the_default_id_takes_int8_on_cpu_and_float32_on_a_gpu_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime as ort

    from localserve.models.oneshot_embeddings import onnx_variant

    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert onnx_variant("all-minilm-l6-v2", "auto") == "int8"
    assert onnx_variant("all-minilm-l6-v2-onnx", "auto") == "fused"
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert onnx_variant("all-minilm-l6-v2", "auto") == "fused"  # int8 was measured on CPU only
    assert onnx_variant("all-minilm-l6-v2", "cpu") == "int8"
    assert onnx_variant("all-minilm-l6-v2-onnx-int8", "auto") == "int8"  # the id names it


def test_the_convert_command_writes_the_graph_asked_for(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localserve.cli.main import main

    for args, suffix in (
        ([], "int8-rows.onnx"),  # the catalog entry's variant
        (["--graph", "fused"], "f32-fused.onnx"),
        (["--graph", "int8"], "int8-rows.onnx"),
        (["--graph", "plain"], "f32.onnx"),
    ):
        assert main(["convert", "all-minilm-l6-v2", "--format", "onnx", *args]) == 0
        path = Path(capsys.readouterr().out.strip())
        assert path.is_file() and path.is_relative_to(store) and path.name.endswith(suffix)
        assert path.with_name(path.stem + ".tokenizer.json").is_file()
