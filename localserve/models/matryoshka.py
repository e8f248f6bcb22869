"""Shorter embeddings (`dimensions`) for the models trained to give them.

A model trained with Matryoshka representation learning packs the most
information into the first dimensions of its vector, so the first N
dimensions, renormalised, are an embedding of their own. Other models
(all-MiniLM-L6-v2 among them) were not trained that way: their first N
dimensions are just a worse vector, so they take only their own size.

Known Matryoshka models are matched by name: the model id, the file or
folder name, or a GGUF's `general.name` contains a key of
`MATRYOSHKA_MODELS` (so the catalog's `nomic-embed-text-v1.5`, a
`nomic-embed-text-v1.5.Q4_K_M.gguf` served under its file name, and a blob
without a telling file name, as Ollama stores models, whose header names it,
all count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from localserve.errors import InvalidRequestError, LocalServeError

Resize = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class MatryoshkaRule:
    """How a model's vector is shortened: its model card's recipe."""

    trained_dims: tuple[int, ...]  # the sizes it was trained for (others work, less well)
    layer_norm: bool = False  # layer-normalise the full vector before cutting it


#: Name (lower case) -> recipe. nomic-embed-text v1.5: layer norm, cut, L2
#: normalise (https://huggingface.co/nomic-ai/nomic-embed-text-v1.5).
MATRYOSHKA_MODELS: dict[str, MatryoshkaRule] = {
    "nomic-embed-text-v1.5": MatryoshkaRule(trained_dims=(768, 512, 256, 128, 64), layer_norm=True),
}


def matryoshka_rule(model_id: str, path: Path | None = None) -> MatryoshkaRule | None:
    """The recipe of a Matryoshka-trained model, or None."""
    names = [model_id.lower()]
    if path is not None:
        names.append(path.name.lower())
        names.append(_gguf_name(path).lower())
    return next((rule for key, rule in MATRYOSHKA_MODELS.items() if any(key in name for name in names)), None)


def dimensions_resize(model_id: str, path: Path | None, n_embd: int, dimensions: int | None) -> Resize | None:
    """What turns the model's vectors into `dimensions`-long ones (None:
    leave them as they are); 400 if this model cannot give that size,
    naming the models that can."""
    if dimensions is None or dimensions == n_embd:
        return None
    rule = matryoshka_rule(model_id, path)
    if rule is None:
        takers = ", ".join(MATRYOSHKA_MODELS)
        raise InvalidRequestError(
            f"model {model_id!r} was not trained for shortened embeddings, so 'dimensions' can only be its own "
            f"{n_embd} (or left out). Models that take a smaller 'dimensions': {takers} (Matryoshka-trained).",
            param="dimensions",
        )
    if not 1 <= dimensions <= n_embd:
        raise InvalidRequestError(
            f"'dimensions' must be between 1 and {n_embd} for model {model_id!r}; got {dimensions} "
            f"(trained for {', '.join(map(str, rule.trained_dims))})",
            param="dimensions",
        )
    return lambda vector: shorten(vector, dimensions, rule)


def shorten(vector: np.ndarray, dimensions: int, rule: MatryoshkaRule) -> np.ndarray:
    """The first `dimensions` values of `vector` (layer-normalised first if
    the recipe says so), scaled to unit length."""
    full = vector.astype(np.float32)
    if rule.layer_norm:  # no affine part; the scale does not matter, the L2 norm below sets it
        full = (full - full.mean()) / np.sqrt(full.var() + 1e-5)
    cut = full[:dimensions]
    norm = float(np.linalg.norm(cut))
    return cut / norm if norm > 0 else cut


@lru_cache(maxsize=64)
def _gguf_name(path: Path) -> str:
    """A GGUF's `general.name`, or "" (not a GGUF, unreadable, no name)."""
    from localserve.models.gguf_shape import read_gguf_fields

    try:
        with path.open("rb") as file:  # Ollama's blobs have no .gguf suffix: look at the magic
            if file.read(4) != b"GGUF":
                return ""
        return str(read_gguf_fields(path).get("general.name", ""))
    except (LocalServeError, OSError):  # a folder, a missing or damaged file
        return ""
