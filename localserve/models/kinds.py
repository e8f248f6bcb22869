"""What a model is for, in one vocabulary: `ModelKind`. Its values are the
ones the API shows (`/v1/models`' `meta.kind`, `GET /api/v1/loaded`,
`localserve list`) and the catalog's labels."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class ModelKind(StrEnum):
    """Which routes take a model, which backends open it, and which
    `--max-loaded-models` limit it counts against."""

    CHAT = "chat"  # generative: chat, completions, infill; runs in the engine's step thread
    EMBEDDINGS = "embeddings"  # one-shot, through a micro-batcher
    TRANSCRIPTION = "transcription"  # speech recognition, one-shot, through a micro-batcher


#: The kinds that run in batches through a micro-batcher, not in the engine.
ONESHOT_KINDS = (ModelKind.EMBEDDINGS, ModelKind.TRANSCRIPTION)

#: The route that takes each kind (errors name it).
ROUTES = {
    ModelKind.CHAT: "/v1/chat/completions",
    ModelKind.EMBEDDINGS: "/v1/embeddings",
    ModelKind.TRANSCRIPTION: "/v1/audio/transcriptions",
}


def kind_of(labels: Iterable[str]) -> ModelKind:
    """The kind a model's labels name (a catalog entry's, or what its files
    say): embeddings, transcription, else chat."""
    labels = tuple(labels)
    return next((kind for kind in ONESHOT_KINDS if kind in labels), ModelKind.CHAT)
