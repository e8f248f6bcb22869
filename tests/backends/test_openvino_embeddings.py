"""all-MiniLM-L6-v2 converted (no torch) to OpenVINO IR and served by the
OpenVINO embeddings backend: equal to the ONNX Runtime backend and to a
plain-numpy BERT, right on the semantic check, the same with the NPU's
static shapes (forced on the CPU), and over HTTP through the catalog id.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from localserve.backends.onnx.embeddings import OnnxEmbeddingBackend, OnnxEmbeddingConfig
from localserve.backends.openvino.embeddings import OpenVinoEmbeddingBackend, OpenVinoEmbeddingConfig
from localserve.errors import ContextLengthError, DeviceNotFoundError, LocalServeError
from localserve.models.convert.bert_onnx import cached_onnx
from localserve.models.convert.bert_openvino import cached_openvino_embeddings
from localserve.models.oneshot import detect_labels
from localserve.models.registry import resolve
from tests.api.harness import ServerThread, make_settings
from tests.backends.test_embeddings import numpy_minilm, sentences

pytest.importorskip("openvino")
pytestmark = pytest.mark.slow

FOOD, BREAD, DRUMS = "A man is eating food.", "A man is eating a piece of bread.", "A monkey is playing drums."
TEXTS = [FOOD, BREAD, DRUMS, "Héllo, wörld! It's 3.14 o'clock; naïve café — 東京."]


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
def ir_path(source: Path, store: Path) -> Path:
    return cached_openvino_embeddings(source, "all-minilm-l6-v2")


def open_ov(path: Path, **overrides) -> OpenVinoEmbeddingBackend:  # type: ignore[no-untyped-def]
    return OpenVinoEmbeddingBackend(OpenVinoEmbeddingConfig(str(path), **{"device": "cpu", **overrides}))


@pytest.fixture(scope="module")
def ov(ir_path: Path) -> Iterator[OpenVinoEmbeddingBackend]:
    b = open_ov(ir_path)  # the device's default precision (bf16 on this CPU), as the server runs it
    yield b
    b.close()


@pytest.fixture(scope="module")
def onnx(source: Path, store: Path) -> Iterator[OnnxEmbeddingBackend]:
    b = OnnxEmbeddingBackend(OnnxEmbeddingConfig(str(cached_onnx(source, "all-minilm-l6-v2")), n_threads=2))
    yield b
    b.close()


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_the_ir_lands_in_the_store_with_dynamic_batch_and_length(ir_path: Path, store: Path) -> None:
    import openvino as ov

    assert ir_path.is_relative_to(store) and ir_path.with_suffix(".bin").is_file()
    assert detect_labels(ir_path) == ("embeddings",)
    model = ov.Core().read_model(str(ir_path))
    assert all(p.get_partial_shape().is_dynamic for p in model.inputs)
    assert cached_openvino_embeddings(resolve("all-minilm-l6-v2").path, "all-minilm-l6-v2") == ir_path  # cached


def test_openvino_agrees_with_onnx_runtime_and_the_numpy_bert(
    ov: OpenVinoEmbeddingBackend, onnx: OnnxEmbeddingBackend, source: Path
) -> None:
    items = [ov.tokenize(t) for t in TEXTS]
    assert items == [onnx.tokenize(t) for t in TEXTS]
    assert (ov.info().backend, ov.info().device, ov.pooling) == ("openvino", "CPU", "mean")
    for item, ov_vector, onnx_vector in zip(items, ov.run(items), onnx.run(items), strict=True):
        assert ov_vector.shape == (384,) and abs(np.linalg.norm(ov_vector) - 1) < 1e-3  # normalised
        assert cosine(ov_vector, onnx_vector) > 0.999
        assert cosine(ov_vector, numpy_minilm(source, list(item))) > 0.999


def test_food_is_closer_to_bread_than_to_drums(ov: OpenVinoEmbeddingBackend) -> None:
    food, bread, drums = ov.run([ov.tokenize(t) for t in (FOOD, BREAD, DRUMS)])
    assert cosine(food, bread) > cosine(food, drums) + 0.3


def test_padded_batches_equal_one_by_one(ov: OpenVinoEmbeddingBackend) -> None:
    items = [ov.tokenize(t) for t in sentences(12)]
    for item, vector in zip(items, ov.run(items), strict=True):
        assert cosine(vector, ov.run([item])[0]) > 0.999


def test_npu_static_shapes_give_the_same_vectors(ir_path: Path, ov: OpenVinoEmbeddingBackend) -> None:
    """The NPU path (reshape to [npu_batch, npu_tokens], pad every call),
    compiled for the CPU since there is no NPU here."""
    static = open_ov(ir_path, static_shapes=True, npu_batch=4, npu_tokens=32)
    try:
        assert static.static_shape == (4, 32) and static.max_input_tokens == 32
        items = [ov.tokenize(t) for t in sentences(7)]  # 7 rows: two calls, the second padded with 1 empty row
        items = [item[:32] for item in items]
        for a, b in zip(static.run(items), ov.run(items), strict=True):
            assert cosine(a, b) > 0.999
        with pytest.raises(ContextLengthError, match="at most 32 tokens"):
            static.check(tuple(range(1000, 1033)), "input")
    finally:
        static.close()


def test_an_absent_device_names_the_present_ones(ir_path: Path) -> None:
    import openvino as ov

    present = ov.Core().available_devices
    if "GPU" in present:
        pytest.skip("OpenVINO sees a GPU here")
    with pytest.raises(DeviceNotFoundError, match="present: " + ", ".join(d.lower() for d in present)):
        open_ov(ir_path, device="gpu")


def test_a_missing_ir_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(LocalServeError, match="--format openvino"):
        open_ov(tmp_path / "nothing.xml")


def test_the_catalog_id_serves_v1_embeddings_over_http(store: Path, onnx: OnnxEmbeddingBackend, source: Path) -> None:
    """`all-minilm-l6-v2-openvino` (backend "openvino" in the catalog):
    converted to IR on load, then /v1/embeddings."""
    server = ServerThread(make_settings(models=["all-minilm-l6-v2-openvino"], threads=1)).start()
    try:
        server.wait_healthy(timeout=180)
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            reply = http.post(
                "/v1/embeddings", json={"model": "all-minilm-l6-v2-openvino", "input": [FOOD, BREAD, DRUMS]}
            )
            assert reply.status_code == 200, reply.text
            body = reply.json()
            food, bread, drums = (np.array(d["embedding"], np.float32) for d in body["data"])
            assert body["model"] == "all-minilm-l6-v2-openvino" and food.shape == (384,)
            assert cosine(food, bread) > cosine(food, drums) + 0.3
            assert cosine(food, onnx.run([onnx.tokenize(FOOD)])[0]) > 0.999
            stats = http.get("/api/v1/stats").json()
            assert "all-minilm-l6-v2-openvino" in stats["one_shot"]
            too_long = http.post("/v1/embeddings", json={"model": "all-minilm-l6-v2-openvino", "input": "x " * 600})
            assert too_long.status_code == 400 and "at most 512 tokens" in too_long.json()["error"]["message"]
    finally:
        server.stop()
    assert list(store.glob("all-minilm-l6-v2-openvino/*-openvino.xml"))  # converted on first load


def test_serving_openvino_embeddings_never_imports_torch(store: Path, ir_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from pathlib import Path; from localserve.config import ServerSettings; "
        "from localserve.models.oneshot import open_oneshot; import localserve.server; "
        f"open_oneshot('embeddings', 'x', Path({str(ir_path)!r}), ServerSettings(device='auto')); "
        "print([m for m in ('torch', 'transformers', 'optimum') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_convert_command_writes_the_ir(store: Path, ir_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localserve.cli.main import main

    assert main(["convert", "all-minilm-l6-v2", "--format", "openvino"]) == 0
    out, err = capsys.readouterr()
    assert Path(out.strip()) == ir_path and "already converted, 90 MB" in err
