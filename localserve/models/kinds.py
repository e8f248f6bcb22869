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
    EMBEDDINGS = "embeddings"  # one-shot, through a one-shot queue
    TRANSCRIPTION = "transcription"  # speech recognition, one-shot, through a one-shot queue
    # A sequence classifier (`...ForSequenceClassification`), one-shot: with one
    # label a cross-encoder (`rerank`: scores a query and a document read together),
    # with more a text classifier (`classify`). The same graph and backend serve both.
    RERANK = "rerank"
    CLASSIFY = "classify"


#: The kinds that run in batches through a one-shot queue, not in the engine.
ONESHOT_KINDS = (ModelKind.EMBEDDINGS, ModelKind.TRANSCRIPTION, ModelKind.RERANK, ModelKind.CLASSIFY)

#: One kind, or any of several (rerank takes an embeddings model or a cross-encoder).
Kinds = ModelKind | tuple[ModelKind, ...]

#: The route that takes each kind (errors name it).
ROUTES = {
    ModelKind.CHAT: "/v1/chat/completions",
    ModelKind.EMBEDDINGS: "/v1/embeddings",
    ModelKind.TRANSCRIPTION: "/v1/audio/transcriptions",
    ModelKind.RERANK: "/v1/rerank",
    ModelKind.CLASSIFY: "/v1/classify",
}


def kind_of(labels: Iterable[str]) -> ModelKind:
    """The kind a model's labels name (a catalog entry's, or what its files
    say): embeddings, transcription, else chat."""
    labels = tuple(labels)
    return next((kind for kind in ONESHOT_KINDS if kind in labels), ModelKind.CHAT)


def kind_in(kind: ModelKind, wanted: Kinds | None) -> bool:
    """`kind` is what `wanted` asks for (None: any kind)."""
    return wanted is None or kind == wanted or (isinstance(wanted, tuple) and kind in wanted)


def kinds_text(wanted: Kinds, *, article: bool = True) -> str:
    """ "an embeddings or rerank" (or without the article) for error messages."""
    text = " or ".join(str(k) for k in (wanted if isinstance(wanted, tuple) else (wanted,)))
    if not article:
        return text
    return ("an " if text[0] in "aeiou" else "a ") + text
