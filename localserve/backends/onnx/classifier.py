"""Sequence classifiers (cross-encoders, text classifiers) on ONNX Runtime:
the graph `models.convert.bert_classifier` builds, and its tokenizer.

An item is one text, or a pair (a query and a document) read together as
`[CLS] query [SEP] document [SEP]` with token types 0 and 1 (the tokenizer's
own pair template); the output is its row of logits. Batches are padded
rectangles, so the queue groups items by length, as for embeddings.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localserve.backends.onnx.embeddings import open_session
from localserve.engine.backend import BackendInfo, OneShotBackend
from localserve.errors import ContextLengthError, LocalServeError


@dataclass(frozen=True, slots=True)
class PairTokens:
    """One item: its token ids and their token types (1: a pair's second text)."""

    ids: tuple[int, ...]
    type_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OnnxClassifierConfig:
    model_path: str  # the .onnx file; its tokenizer is `<stem>.tokenizer.json` beside it
    device: str = "auto"
    n_threads: int = 0  # 0: all cores
    max_input_tokens: int = 512


class PaddedClassifierBackend(OneShotBackend[PairTokens, np.ndarray]):
    """What the ONNX Runtime and OpenVINO classifiers share: the tokenizer
    (single texts and pairs, with truncation), and padded batches of
    `input_ids`, `attention_mask` and `token_type_ids`. Subclasses run the graph."""

    padding_free = False
    labels: tuple[str, ...] = ()

    def _open_tokenizer(self, tokenizer_file: Path, max_input_tokens: int) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        # A second copy cuts a pair's second text only (a document, never the query).
        self._pair_cutter = Tokenizer.from_file(str(tokenizer_file))
        self._pair_cutter.no_padding()
        self._pair_cutter.enable_truncation(max_input_tokens, strategy="only_second")
        self.max_input_tokens = max_input_tokens
        self.pad_id = int(self._tokenizer.token_to_id("[PAD]") or 0)

    @abstractmethod
    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray) -> np.ndarray:
        """Logits [rows, num_labels] of one padded batch."""

    def encode(self, text: str, pair: str | None, *, truncate: bool, param: str) -> tuple[PairTokens, bool]:
        """The item for `text` (and `pair`, read after it), and whether it was
        cut to `max_input_tokens`; a 400 naming `param` when it is too long
        and `truncate` is off, or when the first text alone does not fit."""
        encoding = self._tokenizer.encode(text, pair) if pair is not None else self._tokenizer.encode(text)
        ids, types = encoding.ids, encoding.type_ids
        limit = self.max_input_tokens
        if len(ids) <= limit:
            return PairTokens(tuple(ids), tuple(types)), False
        what = "the pair" if pair is not None else f"'{param}'"
        if not truncate:
            raise ContextLengthError(
                f"{what} ({param}) has {len(ids)} tokens; this model reads at most {limit}. "
                "Shorten it, or leave truncate on to cut it.",
                param=param,
            )
        if pair is None:  # keep the closing special token ([SEP])
            return PairTokens((*ids[: limit - 1], ids[-1]), (*types[: limit - 1], types[-1])), True
        try:
            cut = self._pair_cutter.encode(text, pair)
        except Exception:  # the first text alone leaves no room for the second
            cut = None
        if cut is None or len(cut.ids) > limit:
            raise ContextLengthError(
                f"the query is too long: with {param} it needs {len(ids)} tokens, and cutting {param} "
                f"cannot bring it within the model's {limit}. Shorten the query.",
                param=param,
            )
        return PairTokens(tuple(cut.ids), tuple(cut.type_ids)), True

    def item_size(self, item: PairTokens) -> int:
        return len(item.ids)

    def run(self, items: Sequence[PairTokens]) -> list[np.ndarray]:
        """One padded forward pass over `items` (the queue keeps their lengths close)."""
        width = max(len(item.ids) for item in items)
        input_ids = np.full((len(items), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        types = np.zeros((len(items), width), dtype=np.int64)
        for row, item in enumerate(items):
            input_ids[row, : len(item.ids)] = item.ids
            mask[row, : len(item.ids)] = 1
            types[row, : len(item.ids)] = item.type_ids
        return list(self._forward(input_ids, mask, types).astype(np.float32))


class OnnxClassifierBackend(PaddedClassifierBackend):
    """Logits of a BERT sequence classifier from one ONNX Runtime session."""

    def __init__(self, config: OnnxClassifierConfig) -> None:
        path = Path(config.model_path)
        tokenizer_file = path.with_name(path.stem + ".tokenizer.json")
        if not path.is_file() or not tokenizer_file.is_file():
            raise LocalServeError(f"{path} and its tokenizer {tokenizer_file.name} are needed")
        self.config = config
        self._session, self._device = open_session(path, config.device, config.n_threads)
        metadata = self._session.get_modelmeta().custom_metadata_map
        self.labels = tuple(json.loads(metadata.get("localserve.labels", '["LABEL_0"]')))
        self._open_tokenizer(tokenizer_file, config.max_input_tokens)

    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray) -> np.ndarray:
        feeds = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        (logits,) = self._session.run(["logits"], feeds)
        return logits

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="onnxruntime",
            device=self._device,
            model_path=self.config.model_path,
            architecture="bert-classifier",
            n_ctx_train=self.max_input_tokens,
        )

    def close(self) -> None:
        self._session = None
