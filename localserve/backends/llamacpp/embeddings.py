"""Embeddings with llama.cpp: an embedding GGUF (BERT and friends, or a
decoder with last-token pooling) in a context opened in embeddings mode.

`run` packs many sequences into one `llama_batch`, padding-free, each under
its own sequence id, and reads each pooled vector with
`llama_get_embeddings_seq`. Outputs are L2-normalised unless the GGUF says
the model has no `Normalize` module. With pooling `none` (llama-server's
`--pooling none`) an item's output is its tokens' vectors instead, one row
per token, as the model gives them (not normalised, as llama-server's).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from localserve.backends.llamacpp.devices import init_llama, load_model
from localserve.backends.llamacpp.tokenizer import LlamaTokenizer
from localserve.engine.backend import BackendInfo, OneShotBackend
from localserve.errors import BackendError, ContextLengthError, InvalidRequestError, LocalServeError

log = logging.getLogger(__name__)

POOLING = {
    "model": llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED,  # what the GGUF says
    "mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
    "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS,
    "last": llama_cpp.LLAMA_POOLING_TYPE_LAST,
    "rank": llama_cpp.LLAMA_POOLING_TYPE_RANK,  # a classifier's head: logits, not a vector (classifier.py)
    "none": llama_cpp.LLAMA_POOLING_TYPE_NONE,  # a vector per token: [n_tokens, n_embd] per item
}
_POOLING_NAMES = {v: k for k, v in POOLING.items() if k != "model"}
NORMALIZE_KEY = b"localserve.embedding.normalize"

TokenIds = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LlamaEmbeddingConfig:
    """How to load an embedding GGUF. Zero means "choose for me"."""

    model_path: str
    decode_tokens: int = 512  # tokens of one llama_decode (also the longest input); attention over them is quadratic
    max_seqs: int = 64  # sequences of one llama_decode
    n_threads: int = 0  # 0: all cores
    device: str = "auto"  # a device name (backends/device_names.py): auto, cpu, gpu, gpu:N, cuda, ...
    n_gpu_layers: int = -1
    pooling: str = "model"  # model | mean | cls | last | none
    normalize: bool | None = None  # None: as the GGUF says (default yes)


class LlamaEmbeddingBackend(OneShotBackend[TokenIds, np.ndarray]):
    """Pooled sentence embeddings from one llama.cpp context."""

    padding_free = True
    ranks = False  # True in the subclass that reads a rank-pooled classifier's logits

    # The native objects: made by __init__ and _open_context, None once freed.
    _model: llama_cpp.llama_model_p | None
    _ctx: llama_cpp.llama_context_p | None
    _mem: llama_cpp.llama_memory_t | None  # None also for an encoder-only model
    _batch: llama_cpp.llama_batch | None
    _encoder_only: bool
    max_input_tokens: int

    def __init__(self, config: LlamaEmbeddingConfig) -> None:
        init_llama()
        path = Path(config.model_path)
        if config.pooling not in POOLING:
            raise InvalidRequestError(f"unknown pooling {config.pooling!r}; use one of {', '.join(POOLING)}")
        self.config = config
        model, self._device = load_model(path, config.device, config.n_gpu_layers, embeddings=True)
        self._model, self._ctx, self._mem, self._batch = model, None, None, None
        try:
            self._open_context(model)
        except BaseException:
            self.close()
            raise
        self.tokenizer = LlamaTokenizer(model)
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self.normalize = config.normalize if config.normalize is not None else self._meta(NORMALIZE_KEY) != "false"

    def _open_context(self, model: llama_cpp.llama_model_p) -> None:
        cfg = self.config
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model))
        # llama.cpp aborts the process unless n_seq_max <= n_ubatch and
        # n_ubatch is a multiple of n_seq_max (it reserves n_ubatch / n_seq_max
        # tokens per sequence); non-causal models also need each sequence
        # whole in one micro-batch, so n_ubatch = n_batch.
        self.max_seqs = max(1, min(cfg.max_seqs, 256, cfg.decode_tokens))
        self.decode_tokens = -(-max(1, cfg.decode_tokens) // self.max_seqs) * self.max_seqs
        threads = self._threads = cfg.n_threads or os.cpu_count() or 1
        params = llama_cpp.llama_context_default_params()
        params.embeddings = True
        params.pooling_type = POOLING[cfg.pooling]
        params.n_ctx = self.decode_tokens
        params.n_batch = self.decode_tokens
        params.n_ubatch = self.decode_tokens
        params.n_seq_max = self.max_seqs
        params.kv_unified = True
        params.n_threads = threads
        params.n_threads_batch = threads
        params.no_perf = True
        ctx = self._ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise LocalServeError(f"llama.cpp could not create an embeddings context of {self.decode_tokens} tokens")
        pooling = llama_cpp.llama_pooling_type(ctx)
        if pooling not in _POOLING_NAMES or (pooling == POOLING["none"] and cfg.pooling != "none"):
            raise InvalidRequestError(
                f"{cfg.model_path} has no pooling for sentence embeddings; load it with pooling mean, cls or last"
            )
        self.pooling = _POOLING_NAMES[pooling]
        if (self.pooling == "rank") != self.ranks:
            what = "a reranker (rank pooling); serve it for /v1/rerank" if not self.ranks else "not a reranker"
            raise InvalidRequestError(f"{cfg.model_path} is {what}")
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._encoder_only = bool(llama_cpp.llama_model_has_encoder(model)) and not bool(
            llama_cpp.llama_model_has_decoder(model)
        )
        self._batch = llama_cpp.llama_batch_init(self.decode_tokens, 0, 1)
        limit = min(self.decode_tokens, self.n_ctx_train) if self.n_ctx_train > 0 else self.decode_tokens
        self.max_input_tokens = int(limit)

    # ---- what the API needs ----------------------------------------------------

    def tokenize(self, text: str) -> TokenIds:
        """Token ids with the model's special tokens ([CLS] ... [SEP]); safe from any thread."""
        return tuple(self.tokenizer.encode(text, add_special=True, parse_special=False))

    def check(self, token_ids: Sequence[int], param: str) -> TokenIds:
        """Raise a 400 for an input this model cannot embed; else the ids."""
        if not token_ids:
            raise InvalidRequestError(f"'{param}' is empty; send at least one token", param=param)
        if len(token_ids) > self.max_input_tokens:
            raise ContextLengthError(
                f"'{param}' has {len(token_ids)} tokens; this model embeds at most {self.max_input_tokens} tokens "
                "per input. Shorten or split it.",
                param=param,
            )
        n_vocab = self.tokenizer.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                f"'{param}' has token id {bad}, outside this model's vocabulary of {n_vocab}", param=param
            )
        return tuple(int(t) for t in token_ids)

    # ---- OneShotBackend ----------------------------------------------------------

    def item_size(self, item: TokenIds) -> int:
        return len(item)

    def cpu_threads(self) -> int:
        return self._threads

    def set_cpu_threads(self, threads: int) -> None:
        if self._ctx:
            threads = max(1, min(self._threads, threads))
            llama_cpp.llama_set_n_threads(self._ctx, threads, threads)

    def info(self) -> BackendInfo:
        model = self._live_model()
        desc = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(model, desc, len(desc))
        return BackendInfo(
            backend="llamacpp",
            device=self._device,
            model_path=self.config.model_path,
            architecture=desc.value.decode("utf-8", errors="replace"),
            num_params=int(llama_cpp.llama_model_n_params(model)),
            n_ctx_train=self.n_ctx_train,
        )

    def run(self, items: Sequence[TokenIds]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        start = 0
        while start < len(items):
            end, num_tokens = start, 0
            while (
                end < len(items) and end - start < self.max_seqs and num_tokens + len(items[end]) <= self.decode_tokens
            ):
                num_tokens += len(items[end])
                end += 1
            if end == start:
                raise BackendError(f"an input of {len(items[start])} tokens does not fit one batch")
            out.extend(self._embed(items[start:end]))
            start = end
        return out

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._mem = None  # the context's
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    # ---- internals ---------------------------------------------------------------

    def _embed(self, items: Sequence[TokenIds]) -> list[np.ndarray]:
        """One forward pass over `items`, each as its own sequence."""
        ctx, b = self._ctx, self._batch
        if ctx is None or b is None:
            raise BackendError("the model is closed")
        token, pos, n_seq_id, seq_id, logits = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        k = 0
        for seq, ids in enumerate(items):
            for p, tok in enumerate(ids):
                token[k] = tok
                pos[k] = p  # type: ignore[call-overload]  # pos is a llama_pos*; llama_cpp's stubs say an array of arrays
                n_seq_id[k] = 1
                seq_id[k][0] = seq
                logits[k] = 1
                k += 1
        b.n_tokens = k
        if self._mem:
            llama_cpp.llama_memory_clear(self._mem, True)
        rc = llama_cpp.llama_encode(ctx, b) if self._encoder_only else llama_cpp.llama_decode(ctx, b)
        if rc != 0:
            raise BackendError(f"llama.cpp failed to embed the batch (code {rc})")
        if self.pooling == "none":
            return self._token_vectors(ctx, items, k)
        vectors = []
        for seq in range(len(items)):
            ptr = llama_cpp.llama_get_embeddings_seq(ctx, seq)
            if not ptr:
                raise BackendError(f"llama.cpp returned no embedding for sequence {seq}")
            vector = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).astype(np.float32, copy=True)
            if self.normalize:
                norm = float(np.linalg.norm(vector))
                vector /= norm if norm > 0 else 1.0
            vectors.append(vector)
        return vectors

    def _token_vectors(self, ctx: llama_cpp.llama_context_p, items: Sequence[TokenIds], k: int) -> list[np.ndarray]:
        """Each item's rows of the batch's output (pooling none: every token is an output, in batch order)."""
        ptr = llama_cpp.llama_get_embeddings(ctx)
        if not ptr:
            raise BackendError("llama.cpp returned no token embeddings")
        rows = np.ctypeslib.as_array(ptr, shape=(k, self.n_embd))
        out, start = [], 0
        for ids in items:
            out.append(rows[start : start + len(ids)].astype(np.float32, copy=True))
            start += len(ids)
        return out

    def _live_model(self) -> llama_cpp.llama_model_p:
        if self._model is None:
            raise BackendError("the model is closed")
        return self._model

    def _meta(self, key: bytes) -> str | None:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_model_meta_val_str(self._live_model(), key, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace") if n >= 0 else None
