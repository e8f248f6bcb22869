"""`dimensions` for embeddings (issue 17, item 11): only Matryoshka-trained
models shorten their vectors, by their model card's recipe; every other
model takes only its own size, and the 400 names the models that take more.
(No Matryoshka model's weights are installable here; the HTTP refusal on
all-minilm-l6-v2 is in tests/reliability/test_hostile_input.py.)"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from localserve.errors import InvalidRequestError
from localserve.models.matryoshka import MATRYOSHKA_MODELS, dimensions_resize, matryoshka_rule, shorten

NOMIC = MATRYOSHKA_MODELS["nomic-embed-text-v1.5"]


def write_named_gguf(path: Path, name: str) -> Path:
    """A header-only GGUF whose `general.name` is `name` (as Ollama's blobs are named)."""
    writer = gguf.GGUFWriter(str(path), arch="nomic-bert")
    writer.add_name(name)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_matryoshka_models_are_known_by_id_file_or_gguf_name(tmp_path: Path) -> None:
    assert matryoshka_rule("nomic-embed-text-v1.5") is NOMIC
    assert matryoshka_rule("embedder", tmp_path / "nomic-embed-text-v1.5.Q4_K_M.gguf") is NOMIC
    blob = write_named_gguf(tmp_path / "sha256-0a109f422b47", "nomic-embed-text-v1.5")  # an Ollama blob
    assert matryoshka_rule("nomic-embed-text:latest", blob) is NOMIC
    other = write_named_gguf(tmp_path / "other.gguf", "all-MiniLM-L6-v2")
    assert matryoshka_rule("all-minilm-l6-v2", other) is None
    assert matryoshka_rule("nomic-embed-text-v1", tmp_path / "nomic-embed-text-v1.f16.gguf") is None  # v1: no
    assert matryoshka_rule("x", tmp_path / "missing.gguf") is None


def test_a_model_not_trained_for_it_takes_only_its_own_size() -> None:
    assert dimensions_resize("all-minilm-l6-v2", None, 384, None) is None
    assert dimensions_resize("all-minilm-l6-v2", None, 384, 384) is None
    with pytest.raises(InvalidRequestError) as refused:
        dimensions_resize("all-minilm-l6-v2", None, 384, 128)
    assert refused.value.param == "dimensions" and refused.value.status == 400
    assert "384" in refused.value.message and "nomic-embed-text-v1.5" in refused.value.message


@pytest.mark.parametrize("dimensions", [0, 769])
def test_a_matryoshka_model_refuses_sizes_it_cannot_give(dimensions: int) -> None:
    with pytest.raises(InvalidRequestError, match="between 1 and 768"):
        dimensions_resize("nomic-embed-text-v1.5", None, 768, dimensions)


def _reference(vector: np.ndarray, dimensions: int) -> np.ndarray:
    """nomic's recipe as its model card writes it with torch: F.layer_norm over
    the full vector, cut, F.normalize (p=2)."""
    x = vector.astype(np.float64)
    normed = (x - x.mean()) / np.sqrt(x.var() + 1e-5)
    cut = normed[:dimensions]
    return cut / np.linalg.norm(cut)


@pytest.mark.parametrize("dimensions", [512, 256, 128, 64, 100])
def test_shortened_vectors_follow_the_model_card_recipe(dimensions: int) -> None:
    rng = np.random.default_rng(dimensions)
    vectors = rng.normal(size=(4, 768)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)  # as the backend returns them
    resize = dimensions_resize("nomic-embed-text-v1.5", None, 768, dimensions)
    assert resize is not None
    for vector in vectors:
        short = resize(vector)
        assert short.shape == (dimensions,) and short.dtype == np.float32
        assert abs(float(np.linalg.norm(short)) - 1.0) < 1e-5
        np.testing.assert_allclose(short, _reference(vector, dimensions), atol=1e-5)
        # Scale does not change the answer (the layer norm removes it), as for the unnormalised pooled vector.
        np.testing.assert_allclose(shorten(vector * 7.5, dimensions, NOMIC), short, atol=1e-5)


def test_shortened_vectors_keep_what_is_similar_similar() -> None:
    """Two near vectors stay nearer than a far one after shortening (what
    Matryoshka training guarantees for real models holds for any vectors
    here only approximately, so the gap is kept wide)."""
    rng = np.random.default_rng(7)
    base = rng.normal(size=768)
    near, far = base + 0.1 * rng.normal(size=768), rng.normal(size=768)
    resize = dimensions_resize("nomic-embed-text-v1.5", None, 768, 256)
    assert resize is not None
    a, b, c = (resize(v.astype(np.float32)) for v in (base, near, far))
    assert float(a @ b) > 0.9 > 0.3 > float(a @ c)
