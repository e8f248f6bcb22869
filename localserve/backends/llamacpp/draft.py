"""A draft model for speculative decoding: a smaller GGUF with the target
model's vocabulary, in the same process, proposing tokens greedily for all
the step's speculating sequences together.

Its context has the target's slot layout (a KV stream per slot, or one pool),
so a slot id means the same sequence in both. It keeps its own record of
the tokens in its KV per slot and catches up lazily: before proposing for a
slot, it drops what differs from the target's tokens (rejected drafts, a
slot reused by another sequence, a prefix the scheduler copied) and computes
only the rest. Catch-up for every sequence is one `llama_decode`, then one
`llama_decode` per drafted position for those still drafting.

A greedy draft is certain (q is one-hot), so the target verifies it by
sampling and comparing (engine/step/speculation.py): the output distribution is
the target's whatever the draft model says.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np

from localserve.backends.llamacpp.devices import load_model, warm_up
from localserve.backends.llamacpp.tokenizer import LlamaTokenizer
from localserve.engine.types import KvOp, KvOpKind, SeqChunk, StepPlan
from localserve.errors import BackendError, LocalServeError

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DraftWant:
    """A slot that wants up to `num_draft` tokens after `token_ids` (all its tokens, the last one fed now)."""

    slot: int
    token_ids: Sequence[int]
    num_draft: int


class DraftModel:
    """A draft GGUF in its own llama.cpp context (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        target: LlamaTokenizer,
        kv_size: int,
        num_slots: int,
        unified: bool,
        step_tokens: int,
        threads: int,
        device: str,
        n_gpu_layers: int,
        flash_attn: int = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    ) -> None:
        self.path = path
        model, self.device = load_model(path, device, n_gpu_layers)
        self._model: llama_cpp.llama_model_p | None = model
        self._ctx: llama_cpp.llama_context_p | None = None
        self._batch: llama_cpp.llama_batch | None = None
        try:
            self._tokenizer = LlamaTokenizer(model)
            check_compatible(self._tokenizer, target, path)
            params = llama_cpp.llama_context_default_params()
            params.n_ctx, params.n_seq_max, params.kv_unified = kv_size, num_slots, unified
            params.n_batch = step_tokens
            params.n_ubatch = min(step_tokens, 512)
            params.n_threads = params.n_threads_batch = threads
            params.no_perf = True
            params.flash_attn_type = flash_attn  # the target's choice (kv_types.resolve_flash_attn)
            self._ctx = llama_cpp.llama_init_from_model(model, params)
            if not self._ctx:
                raise LocalServeError(f"llama.cpp could not create a context for the draft model {path}")
            self._batch = llama_cpp.llama_batch_init(step_tokens, 0, 1)
        except BaseException:
            self.close()
            raise
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._n_vocab = self._tokenizer.vocab_size
        self._step_tokens = step_tokens
        self._tokens: dict[int, list[int]] = {}  # slot -> the tokens in this context's KV
        self._target: dict[int, list[int]] = {}  # slot -> the tokens in the target's KV

    def warm_up(self) -> None:
        """Decode once and forget it, on the step thread (the target's `warm_up`)."""
        ctx, batch = self._native()
        assert self._model is not None
        warm_up(self._model, ctx, batch)

    def set_threads(self, threads: int) -> None:
        """Compute on `threads` from the next decode (the target's `set_cpu_threads`)."""
        ctx, _ = self._native()
        llama_cpp.llama_set_n_threads(ctx, threads, threads)

    # ---- following the target ----------------------------------------------------------------

    def follow_kv_ops(self, kv_ops: Sequence[KvOp]) -> None:
        """The target's KV edits, applied to the record of what its slots hold."""
        for op in kv_ops:
            if op.kind == KvOpKind.KEEP:
                del self._target.setdefault(op.slot, [])[op.num_tokens :]
            elif op.kind == KvOpKind.COPY:
                self._target[op.slot] = self._target.get(op.src, [])[: op.num_tokens]

    def drafts_for(self, batch: StepPlan) -> dict[int, list[int]]:
        """Drafts for the step's chunks that ask the draft model for some, by seq_id."""
        chunks = [c for c in batch.chunks if c.draft_model_tokens > 0]
        if not chunks:
            return {}
        wants = [
            DraftWant(c.slot, self._target.get(c.slot, []) + list(c.token_ids), c.draft_model_tokens) for c in chunks
        ]
        by_slot = self.propose(wants)
        return {c.seq_id: by_slot[c.slot] for c in chunks}

    def record(self, chunk: SeqChunk, fed: Sequence[int]) -> None:
        """What the step left in the target's KV for `chunk`: `fed` (its tokens and the accepted drafts)."""
        self._target.setdefault(chunk.slot, []).extend(fed)

    def forget(self, slots: Sequence[int]) -> None:
        """These slots' KV is gone in the target: drop it here too."""
        for slot in slots:
            self._target.pop(slot, None)
            if self._tokens.pop(slot, None) and self._mem is not None:
                llama_cpp.llama_memory_seq_rm(self._mem, slot, -1, -1)

    # ---- proposing -------------------------------------------------------------------------------

    def propose(self, wants: Sequence[DraftWant]) -> dict[int, list[int]]:
        """Greedy drafts per slot, `num_draft` each at most."""
        ctx, b = self._native()
        drafts: dict[int, list[int]] = {w.slot: [] for w in wants}
        # Catch up: feed what the KV lacks up to each slot's last token (at least that one, for its logits).
        feeds: list[tuple[int, int, list[int]]] = []  # slot, first position, tokens
        for want in wants:
            have = self._tokens.setdefault(want.slot, [])
            keep = min(_common_prefix_len(have, want.token_ids), len(want.token_ids) - 1)
            llama_cpp.llama_memory_seq_rm(self._mem, want.slot, keep, -1)
            del have[keep:]
            feeds.append((want.slot, keep, list(want.token_ids[keep:])))
        nexts = self._decode_feeds(ctx, b, feeds)
        wanting = {w.slot: w.num_draft for w in wants}
        while True:
            for slot, token in nexts.items():
                drafts[slot].append(token)
            active = [s for s in nexts if len(drafts[s]) < wanting[s]]
            if not active:
                return drafts
            nexts = self._decode_feeds(ctx, b, [(s, len(self._tokens[s]), [drafts[s][-1]]) for s in active])

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    # ---- internals ---------------------------------------------------------------------------

    def _native(self) -> tuple[llama_cpp.llama_context_p, llama_cpp.llama_batch]:
        if self._ctx is None or self._batch is None:
            raise BackendError("the draft model is closed")
        return self._ctx, self._batch

    def _decode_feeds(
        self, ctx: llama_cpp.llama_context_p, b: llama_cpp.llama_batch, feeds: list[tuple[int, int, list[int]]]
    ) -> dict[int, int]:
        """Decode every feed (in batches of at most n_batch tokens); the greedy
        next token of each slot, read right after the decode of its last token."""
        nexts: dict[int, int] = {}
        items = [(slot, pos + i, tok, i == len(toks) - 1) for slot, pos, toks in feeds for i, tok in enumerate(toks)]
        for start in range(0, len(items), self._step_tokens):
            part = items[start : start + self._step_tokens]
            for k, (slot, pos, tok, is_last) in enumerate(part):
                b.token[k] = tok
                b.pos[k] = pos  # type: ignore[call-overload]  # a llama_pos*; llama_cpp's stubs say otherwise
                b.n_seq_id[k] = 1
                b.seq_id[k][0] = slot
                b.logits[k] = int(is_last)
                self._tokens[slot].append(tok)
            b.n_tokens = len(part)
            rc = llama_cpp.llama_decode(ctx, b)
            if rc != 0:
                for slot in {item[0] for item in part}:  # the record no longer says what the KV holds
                    self._tokens.pop(slot, None)
                    llama_cpp.llama_memory_seq_rm(self._mem, slot, -1, -1)
                raise BackendError(f"the draft model's llama_decode failed with code {rc}")
            for k, (slot, _, _, is_last) in enumerate(part):
                if is_last:
                    nexts[slot] = self._argmax(ctx, k)
        return nexts

    def _argmax(self, ctx: llama_cpp.llama_context_p, index: int) -> int:
        pointer = llama_cpp.llama_get_logits_ith(ctx, index)
        row = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self._n_vocab,))
        return int(row.argmax())


class DraftMismatchError(LocalServeError):
    """The draft model does not speak the model's tokens."""


def check_compatible(draft: LlamaTokenizer, target: LlamaTokenizer, path: Path) -> None:
    """The draft model must speak the target's tokens: the same vocabulary size,
    end-of-generation tokens and token texts (sampled across the vocabulary)."""
    if draft.vocab_size != target.vocab_size or draft.eog_token_ids != target.eog_token_ids:
        raise DraftMismatchError(
            f"the draft model {path.name} has another vocabulary ({draft.vocab_size} tokens) than the model "
            f"({target.vocab_size}); use a smaller model of the same family"
        )
    step = max(1, target.vocab_size // 512)
    for token in range(0, target.vocab_size, step):
        if draft.token_bytes(token) != target.token_bytes(token):
            raise DraftMismatchError(f"the draft model {path.name} spells token {token} differently than the model")


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
