"""What a GGUF file says about a model's memory needs, read from its header only.

`gguf.GGUFReader` parses every field into numpy arrays, vocabulary included:
about 10 s for SmolLM2's 49k tokens on a busy 2-core machine, 15 s for
Gemma's 262k. The auto-fit runs on every load, so this reads the header
itself (type codes and block sizes come from the `gguf` package) and skips
the arrays it does not need: tens of milliseconds.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from localserve.errors import InvalidRequestError

KV_CACHE_BYTES_PER_VALUE = 2  # llama.cpp's default K and V cache type: f16
_T = gguf.GGUFValueType
_SCALARS = {
    _T.UINT8: "B", _T.INT8: "b", _T.UINT16: "H", _T.INT16: "h", _T.UINT32: "I", _T.INT32: "i",
    _T.FLOAT32: "f", _T.BOOL: "?", _T.UINT64: "Q", _T.INT64: "q", _T.FLOAT64: "d",
}  # fmt: skip
_U64 = struct.Struct("<Q")
_MAX_KEPT_ARRAY = 4096  # per-layer arrays are kept; vocabularies and merges are only counted
# What a damaged or hostile header makes the reader raise: a length past the end
# or past any index (OverflowError), a bad type code or an empty file (mmap's
# ValueError), arrays nested without end, a count of the wrong type.
_DAMAGED_HEADER = (
    struct.error, ValueError, KeyError, IndexError, OverflowError, MemoryError, RecursionError, TypeError,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class GgufShape:
    """The sizes that decide how much memory a model and its KV cache take."""

    architecture: str
    n_ctx_train: int
    n_layers: int
    n_embd: int
    n_head: int
    n_vocab: int
    kv_bytes_per_layer: tuple[int, ...]  # one KV cell (token) of each layer, K + V in f16
    layer_bytes: tuple[int, ...]  # weights of each repeating block (blk.N.*)
    weight_bytes: int  # every tensor
    file_bytes: int

    @property
    def kv_bytes_per_cell(self) -> int:
        """KV cache bytes one token takes, all layers together."""
        return sum(self.kv_bytes_per_layer)

    @property
    def other_bytes(self) -> int:
        """Weights outside the repeating blocks: embeddings, output head, norms."""
        return self.weight_bytes - sum(self.layer_bytes)


def read_gguf_shape(path: str | Path) -> GgufShape:
    """The model's shape from its GGUF header; 400 with the reason if the
    file is not a GGUF model llama.cpp could size."""
    path = Path(path)
    try:
        fields, tensors = _read_header(path)
        return _shape(path, fields, tensors)
    except _DAMAGED_HEADER as exc:
        raise InvalidRequestError(f"{path} is not a readable GGUF file: {exc or type(exc).__name__}") from None


def read_gguf_fields(path: str | Path) -> dict[str, Any]:
    """The header's key/value fields (a long array stands for its length);
    400 if the file is not a readable GGUF."""
    path = Path(path)
    try:
        return _read_header(path)[0]
    except _DAMAGED_HEADER as exc:
        raise InvalidRequestError(f"{path} is not a readable GGUF file: {exc or type(exc).__name__}") from None


def _read_header(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _Header(data).read()


def _shape(path: Path, fields: dict[str, Any], tensors: dict[str, int]) -> GgufShape:
    arch = str(fields.get("general.architecture", ""))

    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise InvalidRequestError(f"{path}: the GGUF header has no {arch}.{key}; cannot size the model")
        return value

    n_layers = int(get("block_count"))
    n_embd = int(get("embedding_length"))
    heads = _per_layer(get("attention.head_count"), n_layers)
    heads_kv = _per_layer(get("attention.head_count_kv", heads), n_layers)
    head_dim = n_embd // max(1, max(heads))
    key_length = int(get("attention.key_length", head_dim))
    value_length = int(get("attention.value_length", key_length))
    kv_per_layer = tuple(h * (key_length + value_length) * KV_CACHE_BYTES_PER_VALUE for h in heads_kv)
    layer_bytes = [0] * n_layers
    for name, size in tensors.items():
        if name.startswith("blk."):
            index = int(name.split(".", 2)[1])
            if index < n_layers:
                layer_bytes[index] += size
    n_vocab = int(fields.get(f"{arch}.vocab_size") or fields.get("tokenizer.ggml.tokens") or 0)
    return GgufShape(
        architecture=arch,
        n_ctx_train=int(get("context_length", 0)),
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=max(heads),
        n_vocab=n_vocab,
        kv_bytes_per_layer=kv_per_layer,
        layer_bytes=tuple(layer_bytes),
        weight_bytes=sum(tensors.values()),
        file_bytes=path.stat().st_size,
    )


def _per_layer(value: Any, n_layers: int) -> list[int]:
    """A per-layer count: one number for every layer, or a list of them."""
    if isinstance(value, list | tuple):
        if len(value) != n_layers:
            raise InvalidRequestError(f"a per-layer GGUF field has {len(value)} values for {n_layers} layers")
        return [int(v) for v in value]
    return [int(value)] * n_layers


class _Header:
    """A little-endian GGUF v2/v3 header: key/value fields, then tensor infos."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0

    def read(self) -> tuple[dict[str, Any], dict[str, int]]:
        magic, version = self._unpack("<II")
        if magic != gguf.GGUF_MAGIC:
            raise ValueError("bad magic (not a GGUF file)")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (big-endian or too old?)")
        num_tensors, num_fields = self._unpack("<QQ")
        fields = {}
        for _ in range(num_fields):
            key = self._string()
            fields[key] = self._value(_T(self._unpack("<I")[0]))
        tensors = {}
        for _ in range(num_tensors):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = self._unpack(f"<{n_dims}Q")
            kind, _offset = self._unpack("<IQ")
            block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(kind)]
            num_elements = 1
            for dim in dims:
                num_elements *= dim
            tensors[name] = num_elements // block_size * type_size
        return fields, tensors

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (length,) = self._unpack("<Q")
        raw = self.data[self.pos : self.pos + length]
        if len(raw) != length:
            raise ValueError("truncated string")
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def _value(self, kind: gguf.GGUFValueType) -> Any:
        if kind == _T.STRING:
            return self._string()
        if kind in _SCALARS:
            return self._unpack("<" + _SCALARS[kind])[0]
        if kind != _T.ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item_kind, count = _T(self._unpack("<I")[0]), self._unpack("<Q")[0]
        if item_kind in _SCALARS and count <= _MAX_KEPT_ARRAY:
            return list(self._unpack(f"<{count}{_SCALARS[item_kind]}"))
        if item_kind in _SCALARS:  # a long numeric array (token types, scores): skip it whole
            self.pos += count * struct.calcsize(_SCALARS[item_kind])
        elif item_kind == _T.STRING:  # vocabulary, merges: skip without decoding
            data, pos, unpack = self.data, self.pos, _U64.unpack_from
            for _ in range(count):
                pos += 8 + unpack(data, pos)[0]
            self.pos = pos
        else:
            for _ in range(count):
                self._value(item_kind)
        return count  # a long array stands for its length (tokenizer.ggml.tokens: the vocabulary size)
