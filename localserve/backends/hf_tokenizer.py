"""The tokenizer of a Hugging Face model folder (what optimum-intel,
optimum-onnx and `localserve export` write beside the weights):
`tokenizer.json` through the `tokenizers` library, the chat template and the
special tokens from `tokenizer_config.json`, the stop tokens from
`generation_config.json`/`config.json`. No transformers, no torch.
"""

from __future__ import annotations

import json
import re
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localserve.engine.backend import Tokenizer
from localserve.errors import LocalServeError, NotUnicodeError

if TYPE_CHECKING:
    import llguidance

#: Special tokens that end a turn in the common chat formats; counted as
#: end-of-generation when the vocabulary has them (llama.cpp does the same).
EOG_NAMES = (
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "</s>",
    "<|return|>",
)
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable char -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str:
    """`"<s>"` or `{"content": "<s>", ...}` (AddedToken as JSON) -> "<s>"."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [int(v) for v in value if isinstance(v, int)]
    return []


class HFTokenizer(Tokenizer):
    """Encode/decode with a `tokenizers` tokenizer; safe to read from any thread."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer as RawTokenizer

        path = folder / "tokenizer.json"
        if not path.is_file():
            raise LocalServeError(f"{folder} has no tokenizer.json; export the model with its tokenizer")
        self._raw = RawTokenizer.from_file(str(path))
        # A second instance that reads special-token text as plain text: the
        # setting is per instance, and encode may run on several threads.
        self._raw_literal = RawTokenizer.from_file(str(path))
        self._raw_literal.encode_special_tokens = True
        spec = json.loads(path.read_text(encoding="utf-8"))
        self._config = _read_json(folder / "tokenizer_config.json")
        self._generation = _read_json(folder / "generation_config.json")
        self._model_config = _read_json(folder / "config.json")
        self._byte_level = "ByteLevel" in json.dumps(spec.get("decoder") or spec.get("pre_tokenizer") or {})
        self._special_ids = {int(t["id"]) for t in spec.get("added_tokens", []) if t.get("special")}
        self._n_vocab = self._raw.get_vocab_size(with_added_tokens=True)
        self._pieces: list[bytes | None] = [None] * self._n_vocab
        self._template_file = folder / "chat_template.jinja"
        self._path = path

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        raw = self._raw if parse_special else self._raw_literal
        try:
            ids = list(raw.encode(text, add_special_tokens=add_special).ids)
        except TypeError:  # how `tokenizers` refuses a str that is not UTF-8 (a lone surrogate)
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise NotUnicodeError() from None
            raise
        bos = self.bos_token_id
        if add_special and self.add_bos and bos >= 0 and (not ids or ids[0] != bos):
            ids.insert(0, bos)  # tokenizer.json without a post-processor
        return ids

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self._n_vocab or token_id in self._special_ids:
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._piece(self._raw.id_to_token(token_id) or "")
            self._pieces[token_id] = piece
        return piece

    def _piece(self, token: str) -> bytes:
        if self._byte_level:
            table = _BYTE_DECODER
            if all(ch in table for ch in token):
                return bytes(table[ch] for ch in token)
            return token.encode("utf-8")  # an added (non-special) token kept as text
        match = _BYTE_TOKEN.match(token)
        if match:  # SentencePiece byte fallback
            return bytes([int(match.group(1), 16)])
        return token.replace("\u2581", " ").encode("utf-8")

    def special_text(self, token_id: int) -> str:
        return self._raw.id_to_token(token_id) or ""

    def guidance_tokenizer(self) -> llguidance.LLTokenizer:
        return self._guidance

    @cached_property
    def _guidance(self) -> llguidance.LLTokenizer:
        from localserve.backends.constraints import build_tokenizer_from_json

        return build_tokenizer_from_json(self._path.read_text(encoding="utf-8"), self._n_vocab, self.eog_token_ids)

    @cached_property
    def eog_token_ids(self) -> frozenset[int]:
        ids = set(_ids(self._generation.get("eos_token_id"))) | set(_ids(self._model_config.get("eos_token_id")))
        names = {_token_text(self._config.get("eos_token")), *EOG_NAMES}
        for name in names:
            token_id = self._raw.token_to_id(name) if name else None
            if token_id is not None and (token_id in self._special_ids or name == self.eos_token):
                ids.add(token_id)
        return frozenset(t for t in ids if 0 <= t < self._n_vocab)

    @property
    def add_bos(self) -> bool:
        return bool(self._config.get("add_bos_token", False))

    @property
    def bos_token(self) -> str:
        return _token_text(self._config.get("bos_token"))

    @property
    def eos_token(self) -> str:
        return _token_text(self._config.get("eos_token"))

    @property
    def bos_token_id(self) -> int:
        token_id = self._raw.token_to_id(self.bos_token) if self.bos_token else None
        return -1 if token_id is None else int(token_id)

    @property
    def eos_token_id(self) -> int:
        token_id = self._raw.token_to_id(self.eos_token) if self.eos_token else None
        return -1 if token_id is None else int(token_id)

    @cached_property
    def chat_template(self) -> str | None:
        if self._template_file.is_file():  # newer transformers save it apart
            return self._template_file.read_text(encoding="utf-8")
        template = self._config.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        return template if isinstance(template, str) and template else None


_BYTE_DECODER = _byte_decoder()
