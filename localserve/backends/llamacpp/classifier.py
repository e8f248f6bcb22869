"""Rerankers and sequence classifiers on llama.cpp: a GGUF whose pooling is
`rank` (a BERT-family classifier with its `cls` / `cls.output` head, as
llama.cpp's own rerankers are). Each item is one text, or a query and a
document packed as `[CLS] query [SEP] document [SEP]`, one sequence of a
padding-free batch; the output is its row of logits.

llama.cpp's BERT graph adds token type 0 to every token: a model trained
with type 1 on the document (BERT cross-encoders) scores a little
differently here than under transformers; models with one token type
(XLM-RoBERTa rerankers) do not.
"""

from __future__ import annotations

import ctypes
import dataclasses

import llama_cpp

from localserve.backends.llamacpp.embeddings import LlamaEmbeddingBackend, LlamaEmbeddingConfig, TokenIds
from localserve.engine.backend import BackendInfo
from localserve.errors import ContextLengthError


class LlamaClassifierBackend(LlamaEmbeddingBackend):
    """Logits of a rank-pooled GGUF, per text or pair."""

    ranks = True

    def __init__(self, config: LlamaEmbeddingConfig) -> None:
        super().__init__(dataclasses.replace(config, pooling="model", normalize=False))
        model = self._live_model()
        num_labels = max(1, int(llama_cpp.llama_model_n_cls_out(model)))
        self.n_embd = num_labels  # what `_embed` reads per sequence
        self.labels = tuple(_label(model, i) for i in range(num_labels))

    def encode(self, text: str, pair: str | None, *, truncate: bool, param: str) -> tuple[TokenIds, bool]:
        """`[CLS] text [SEP]`, or with `pair`, `[CLS] text [SEP] pair [SEP]`,
        the pair's tokens cut (keeping its closing [SEP]) to fit with `truncate`."""
        first = self.tokenize(text)
        ids = first if pair is None else (*first, *self.tokenize(pair)[1:])
        limit = self.max_input_tokens
        if len(ids) <= limit:
            return ids, False
        if not truncate or len(first) + (1 if pair is None else 2) > limit:
            raise ContextLengthError(
                f"{param} needs {len(ids)} tokens with what comes before it; this model reads at most {limit}. "
                + ("Shorten the query." if truncate else "Shorten it, or leave truncate on to cut it."),
                param=param,
            )
        return (*ids[: limit - 1], ids[-1]), True

    def info(self) -> BackendInfo:
        info = super().info()
        return BackendInfo(
            info.backend, info.device, info.model_path, f"{info.architecture} (rank)", info.num_params, info.n_ctx_train
        )


def _label(model: llama_cpp.llama_model_p, i: int) -> str:
    raw = llama_cpp.llama_model_cls_label(model, i)
    if isinstance(raw, bytes):
        return raw.decode("utf-8", errors="replace")
    if raw:
        return ctypes.cast(raw, ctypes.c_char_p).value.decode("utf-8", errors="replace")  # type: ignore[union-attr]
    return f"LABEL_{i}"
