"""Rerank, score and classify: pairs of texts (a query and a document) or
single texts in, one score or one set of class probabilities each out,
batched across callers by the model's one-shot queue.

Two kinds of model score a pair:

* a **cross-encoder** (a `rerank` model: a sequence classifier with one
  label) reads the two texts together, as one item of its queue, and its
  score is the sigmoid of its logit;
* a **bi-encoder** (any `embeddings` model) embeds each distinct text once,
  each text an item of its queue, and the score is the cosine of the two
  vectors: rerank with the default install, no cross-encoder needed.

A `classify` model (a sequence classifier with several labels) or a
cross-encoder classifies single texts: softmax over the labels (sigmoid for
one label).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from localserve.engine.types import PRIORITY_ALIASES
from localserve.errors import BackendError, InvalidRequestError
from localserve.models.kinds import ModelKind
from localserve.models.registry import LoadedOneShot
from localserve.serving.embeddings import INLINE_TOKENIZE_CHARS, Embedder
from localserve.serving.models import ModelHost, hold_oneshot_model

#: The kinds that score pairs, and the ones that classify texts.
PAIR_KINDS = (ModelKind.RERANK, ModelKind.EMBEDDINGS)
CLASSIFY_KINDS = (ModelKind.CLASSIFY, ModelKind.RERANK)
BI_ENCODER, CROSS_ENCODER = "bi-encoder", "cross-encoder"


@runtime_checkable
class SequenceClassifier(Protocol):
    """What rerank and classify need of a sequence-classification backend
    (besides `OneShotBackend.run`, which returns one logits row per item).
    `encode` may be called from any thread."""

    labels: tuple[str, ...]  # the model's id2label, in logit order
    max_input_tokens: int

    def encode(self, text: str, pair: str | None, *, truncate: bool, param: str) -> tuple[Any, bool]:
        """The queue's item for `text` (and `pair`, read after it), and
        whether it was cut to `max_input_tokens` (the pair's side only); 400
        naming `param` for what cannot be scored (too long without `truncate`)."""
        ...


@dataclass(frozen=True, slots=True)
class PairsRequest:
    """Score pair i = (firsts[i], seconds[i]); one first goes with every second
    (a rerank query). `truncate`: a text longer than the model reads is cut
    (and reported), else a 400."""

    model: str
    firsts: tuple[str, ...]
    seconds: tuple[str, ...]
    priority: float = PRIORITY_ALIASES["default"]
    truncate: bool = True
    first_param: str = "query"
    second_param: str = "documents"

    @property
    def num_pairs(self) -> int:
        return len(self.seconds)

    def first(self, i: int) -> str:
        return self.firsts[0] if len(self.firsts) == 1 else self.firsts[i]


@dataclass(frozen=True, slots=True)
class PairScores:
    """One score per pair, in order; what was cut; the tokens read."""

    model_id: str
    method: str  # BI_ENCODER or CROSS_ENCODER
    scores: list[float] = field(default_factory=list)
    truncated: list[int] = field(default_factory=list)  # pair indices whose second text was cut
    num_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ClassifyRequest:
    model: str
    inputs: tuple[str, ...]
    priority: float = PRIORITY_ALIASES["default"]
    truncate: bool = True
    param: str = "input"


@dataclass(frozen=True, slots=True)
class Classes:
    """Per input: its probabilities over `labels`; what was cut; tokens read."""

    model_id: str
    labels: tuple[str, ...]
    probs: list[np.ndarray] = field(default_factory=list)
    truncated: list[int] = field(default_factory=list)
    num_tokens: int = 0


async def score_pairs(host: ModelHost, request: PairsRequest) -> PairScores:
    """Each pair's score: a cross-encoder's sigmoid, or a bi-encoder's cosine."""
    model = await hold_oneshot_model(host, request.model, PAIR_KINDS)
    if model.kind == ModelKind.EMBEDDINGS:
        return await _cosine_scores(model, request)
    classifier = _classifier(model)
    if len(classifier.labels) != 1:
        raise InvalidRequestError(
            f"model {request.model!r} classifies into {len(classifier.labels)} labels; "
            "only a one-label model (a cross-encoder) scores pairs: use /v1/classify",
            param="model",
        )
    pairs = [(request.first(i), request.seconds[i], _param(request, i)) for i in range(request.num_pairs)]
    items, cut = await _off_loop(_encode_all, classifier, pairs, request.truncate, _size(request))
    logits = await model.queue.submit(items, priority=request.priority)
    scores = [float(_sigmoid(np.asarray(row, np.float64))[0]) for row in logits]
    return PairScores(model.spec.model_id, CROSS_ENCODER, scores, cut, sum(model.backend.item_size(x) for x in items))


async def classify(host: ModelHost, request: ClassifyRequest) -> Classes:
    """Each text's probabilities over the model's labels."""
    model = await hold_oneshot_model(host, request.model, CLASSIFY_KINDS)
    classifier = _classifier(model)
    texts = [
        (text, None, request.param if len(request.inputs) == 1 else f"{request.param}[{i}]")
        for i, text in enumerate(request.inputs)
    ]
    items, cut = await _off_loop(_encode_all, classifier, texts, request.truncate, sum(map(len, request.inputs)))
    logits = await model.queue.submit(items, priority=request.priority)
    probs = [_probabilities(np.asarray(row, np.float64)) for row in logits]
    num_tokens = sum(model.backend.item_size(x) for x in items)
    return Classes(model.spec.model_id, classifier.labels, probs, cut, num_tokens)


# ---- cross-encoder ---------------------------------------------------------------------


def _classifier(model: LoadedOneShot) -> SequenceClassifier:
    backend = model.backend
    if not isinstance(backend, SequenceClassifier):
        raise BackendError(f"model {model.spec.model_id!r}: its backend does not classify")
    return backend


def _encode_all(
    classifier: SequenceClassifier, texts: Sequence[tuple[str, str | None, str]], truncate: bool
) -> tuple[list[Any], list[int]]:
    items, cut = [], []
    for i, (text, pair, param) in enumerate(texts):
        for value, name in ((text, param), (pair, param)):
            if value is not None and not value:
                raise InvalidRequestError(f"'{name}' is an empty string; send some text", param=name)
        item, truncated = classifier.encode(text, pair, truncate=truncate, param=param)
        items.append(item)
        if truncated:
            cut.append(i)
    return items, cut


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))  # type: ignore[no-any-return]


def _probabilities(logits: np.ndarray) -> np.ndarray:
    """Sigmoid for one label (a relevance), softmax over several."""
    if logits.shape[-1] == 1:
        return _sigmoid(logits)
    e = np.exp(logits - logits.max())
    return e / e.sum()  # type: ignore[no-any-return]


# ---- bi-encoder --------------------------------------------------------------------------


async def _cosine_scores(model: LoadedOneShot, request: PairsRequest) -> PairScores:
    """Embed every distinct text once (each an item of the queue), then
    the cosine of each pair's two vectors."""
    backend = model.backend
    if not isinstance(backend, Embedder):
        raise BackendError(f"model {request.model!r}: its backend does not make embeddings")
    texts: dict[str, str] = {}  # text -> the param that names it (the first place it appears)
    for i in range(request.num_pairs):
        texts.setdefault(
            request.first(i), request.first_param if len(request.firsts) == 1 else f"{request.first_param}[{i}]"
        )
        texts.setdefault(request.seconds[i], _param(request, i))
    items, cut_texts = await _off_loop(_embedding_items, backend, list(texts.items()), request.truncate, _size(request))
    vectors = await model.queue.submit(items, priority=request.priority)
    index = {text: n for n, text in enumerate(texts)}
    unit = [np.asarray(v, np.float64) / max(float(np.linalg.norm(v)), 1e-12) for v in vectors]
    scores = [float(unit[index[request.first(i)]] @ unit[index[request.seconds[i]]]) for i in range(request.num_pairs)]
    cut = [i for i in range(request.num_pairs) if index[request.seconds[i]] in cut_texts]
    return PairScores(model.spec.model_id, BI_ENCODER, scores, cut, sum(len(item) for item in items))


def _embedding_items(
    backend: Embedder, texts: Sequence[tuple[str, str]], truncate: bool
) -> tuple[list[tuple[int, ...]], set[int]]:
    """Token lists for the texts (cut to the model's window with `truncate`,
    keeping the closing special token), and which were cut."""
    limit = getattr(backend, "max_input_tokens", None)
    items, cut = [], set()
    for n, (text, param) in enumerate(texts):
        if not text:
            raise InvalidRequestError(f"'{param}' is an empty string; send some text", param=param)
        ids = backend.tokenize(text)
        if truncate and limit and len(ids) > limit:
            ids = (*ids[: limit - 1], ids[-1])
            cut.add(n)
        items.append(backend.check(ids, param))  # 400 for a text too long (without `truncate`)
    return items, cut


# ---- shared ------------------------------------------------------------------------------


def _param(request: PairsRequest, i: int) -> str:
    return f"{request.second_param}[{i}]"


def _size(request: PairsRequest) -> int:
    return sum(map(len, request.firsts)) + sum(map(len, request.seconds))


async def _off_loop(fn: Any, *args: Any) -> Any:
    """`fn(*args[:-1])`, on a worker thread unless the texts (`args[-1]`
    characters) are short enough to tokenize on the event loop."""
    *call_args, num_chars = args
    if num_chars <= INLINE_TOKENIZE_CHARS:
        return fn(*call_args)
    return await asyncio.to_thread(fn, *call_args)
