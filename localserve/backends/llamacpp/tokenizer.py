"""The tokenizer of a GGUF model, through llama.cpp's vocabulary."""

from __future__ import annotations

import ctypes
from functools import cached_property
from typing import TYPE_CHECKING

import llama_cpp

from localserve.engine.backend import Tokenizer
from localserve.errors import NotUnicodeError

if TYPE_CHECKING:
    import llguidance


class LlamaTokenizer(Tokenizer):
    """Encode/decode with a loaded llama.cpp model's vocabulary. Thread-safe
    for reading (llama.cpp's vocab is immutable after load)."""

    def __init__(self, model: llama_cpp.llama_model_p) -> None:
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self._pieces: list[bytes | None] = [None] * self._n_vocab

    @property
    def vocab(self) -> llama_cpp.llama_vocab_p:
        return self._vocab

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the client's text, not a server fault
            raise NotUnicodeError() from None
        capacity = len(data) + 8
        while True:
            tokens = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), tokens, capacity, add_special, parse_special)
            if n >= 0:
                return list(tokens[:n])
            capacity = -n

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self._n_vocab:
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._piece(token_id, special=False)
            self._pieces[token_id] = piece
        return piece

    def special_text(self, token_id: int) -> str:
        """A token's text with special tokens rendered (e.g. "<|im_end|>")."""
        return self._piece(token_id, special=True).decode("utf-8", errors="replace")

    def _piece(self, token_id: int, *, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, special)
        return buf.raw[:n]

    @cached_property
    def eog_token_ids(self) -> frozenset[int]:
        is_eog = llama_cpp.llama_vocab_is_eog
        vocab = self._vocab
        return frozenset(t for t in range(self._n_vocab) if is_eog(vocab, t))

    @property
    def bos_token_id(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    @property
    def eos_token_id(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._vocab))

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))

    @property
    def bos_token(self) -> str:
        return self.special_text(self.bos_token_id) if self.bos_token_id >= 0 else ""

    @property
    def eos_token(self) -> str:
        return self.special_text(self.eos_token_id) if self.eos_token_id >= 0 else ""

    def guidance_tokenizer(self) -> llguidance.LLTokenizer:
        return self._guidance

    @cached_property
    def _guidance(self) -> llguidance.LLTokenizer:
        from llguidance.llamacpp import lltokenizer_from_vocab

        return lltokenizer_from_vocab(self._vocab, eos_token=sorted(self.eog_token_ids))

    @cached_property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def fim_token_ids(self) -> dict[str, int]:
        """Fill-in-the-middle tokens the GGUF declares (missing ones omitted)."""
        found = {
            "pre": llama_cpp.llama_vocab_fim_pre(self._vocab),
            "suf": llama_cpp.llama_vocab_fim_suf(self._vocab),
            "mid": llama_cpp.llama_vocab_fim_mid(self._vocab),
            "pad": llama_cpp.llama_vocab_fim_pad(self._vocab),
            "rep": llama_cpp.llama_vocab_fim_rep(self._vocab),
            "sep": llama_cpp.llama_vocab_fim_sep(self._vocab),
        }
        return {name: int(tok) for name, tok in found.items() if tok >= 0}
