"""Embeddings with ONNX Runtime: the graph `models.convert.bert_onnx` builds from a
sentence-transformers folder, and its WordPiece tokenizer (`tokenizers`).

Unlike llama.cpp, a batch here is a padded rectangle, so `padding_free` is
False and the queue groups inputs by length before each `run`.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from localserve.backends.onnx.providers import label, session_providers
from localserve.engine.backend import BackendInfo, OneShotBackend
from localserve.errors import ContextLengthError, InvalidRequestError, LocalServeError

TokenIds = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OnnxEmbeddingConfig:
    model_path: str  # the .onnx file; its tokenizer is `<stem>.tokenizer.json` beside it
    device: str = "auto"  # a device name (backends/device_names.py); providers.py maps it
    n_threads: int = 0  # 0: all cores
    max_input_tokens: int = 512


class PaddedEmbeddingBackend(OneShotBackend[TokenIds, np.ndarray]):
    """What the ONNX Runtime and OpenVINO embedding backends share: the
    WordPiece tokenizer beside the graph, input checks, and right-padded
    `input_ids`/`attention_mask` batches. Subclasses run the graph."""

    padding_free = False

    def _open_tokenizer(self, tokenizer_file: Path, max_input_tokens: int) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        self.vocab_size = int(self.tokenizer.get_vocab_size())
        self.max_input_tokens = max_input_tokens
        self.pad_id = int(self.tokenizer.token_to_id("[PAD]") or 0)

    @abstractmethod
    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """Pooled embeddings [rows, n_embd] of one padded batch."""

    def tokenize(self, text: str) -> TokenIds:
        return tuple(self.tokenizer.encode(text).ids)

    def check(self, token_ids: Sequence[int], param: str) -> TokenIds:
        if not token_ids:
            raise InvalidRequestError(f"'{param}' is empty; send at least one token", param=param)
        if len(token_ids) > self.max_input_tokens:
            raise ContextLengthError(
                f"'{param}' has {len(token_ids)} tokens; this model embeds at most {self.max_input_tokens} tokens "
                "per input. Shorten or split it.",
                param=param,
            )
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"'{param}' has token id {bad}, outside this model's vocabulary of {self.vocab_size}", param=param
            )
        return tuple(int(t) for t in token_ids)

    def item_size(self, item: TokenIds) -> int:
        return len(item)

    def run(self, items: Sequence[TokenIds]) -> list[np.ndarray]:
        """One padded forward pass over `items` (the queue keeps their lengths close)."""
        width = max(len(item) for item in items)
        input_ids = np.full((len(items), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), width), dtype=np.int64)
        for row, item in enumerate(items):
            input_ids[row, : len(item)] = item
            mask[row, : len(item)] = 1
        return list(self._forward(input_ids, mask).astype(np.float32))


class OnnxEmbeddingBackend(PaddedEmbeddingBackend):
    """Pooled, normalised sentence embeddings from one ONNX Runtime session."""

    def __init__(self, config: OnnxEmbeddingConfig) -> None:
        path = Path(config.model_path)
        tokenizer_file = path.with_name(path.stem + ".tokenizer.json")
        if not path.is_file() or not tokenizer_file.is_file():
            raise LocalServeError(
                f"{path} and its tokenizer {tokenizer_file.name} are needed; run `localserve convert`"
            )
        self.config = config
        self._session, self._device = open_session(path, config.device, config.n_threads)
        self._open_tokenizer(tokenizer_file, config.max_input_tokens)
        self.n_embd = int(self._session.get_outputs()[0].shape[-1])

    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        (embeddings,) = self._session.run(["embeddings"], {"input_ids": input_ids, "attention_mask": attention_mask})
        return embeddings

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="onnxruntime",
            device=self._device,
            model_path=self.config.model_path,
            architecture="bert",
            n_ctx_train=self.max_input_tokens,
        )

    def close(self) -> None:
        self._session = None


def open_session(path: Path, device: str, n_threads: int) -> tuple[Any, str]:
    """An ONNX Runtime session for an encoder graph, and its device's label."""
    import onnxruntime as ort

    providers = session_providers(device, ort.get_available_providers())
    options = ort.SessionOptions()
    # Arena and memory pattern stay at ONNX Runtime's defaults
    # (bench/onnx_settings.py: off gained nothing consistent). Spinning:
    # the pool threads spin inside a run, where the next operator follows
    # within microseconds, but stop at its end
    # (`session.force_spinning_stop`). Left spinning after a run they
    # burned 1.3-2.5 ms of CPU per short text served at 32 clients, on the
    # cores the event loop, the HTTP clients and any chat model share.
    # Served all-MiniLM-L6-v2 (int8), stopping against spinning on, 2
    # alternating runs of 3 pairs each at load < 0.5: queries 1 client
    # 1.08/1.21x, 32 clients 0.99/1.07x; passages 1 client 1.53/1.12x, 32
    # clients 0.98/0.98x; server CPU per query at 32 clients 4.4-5.4 ms
    # -> 2.8-3.4 ms. Spinning off altogether lost 0.8x at 1 client.
    options.intra_op_num_threads = n_threads or os.cpu_count() or 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(path), options, providers=providers), label(providers)
