"""Rewrite a CTranslate2 Whisper folder (`model.bin`, `config.json`,
`tokenizer.json`, as faster-whisper loads) into whisper.cpp's ggml model
file, once, cached in the model store. numpy only: no torch.

The two formats hold the same tensors in different containers: CTranslate2
fuses the attention projections (self-attention q|k|v in one matrix,
cross-attention k|v) and names layers `linear_N`; whisper.cpp wants OpenAI's
names (`encoder.blocks.0.attn.query.weight`, ...), a header of hyper-
parameters, the mel filter bank and the byte-level vocabulary. The same
reader also feeds the OpenVINO export (`convert_whisper_openvino.py`).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from localserve.errors import InvalidRequestError
from localserve.models.convert.cache import Progress, model_store, write_atomically
from localserve.models.convert.fingerprint import content_fingerprint

CONVERTER_VERSION = 1
GGML_MAGIC = 0x67676D6C  # "ggml"
N_FFT, SAMPLE_RATE = 400, 16000
# CTranslate2's DataType enum, as model.bin stores it.
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_LAYER = re.compile(r"(encoder|decoder)/layer_(\d+)/")


@dataclass(slots=True)
class Ct2Whisper:
    """The weights and hyper-parameters of a CTranslate2 Whisper folder."""

    path: Path
    variables: dict[str, np.ndarray]
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def weights(self) -> Path:
        return self.path / "model.bin"

    def num_layers(self, side: str) -> int:
        return 1 + max(int(m.group(2)) for name in self.variables if (m := _LAYER.match(name)) and m.group(1) == side)

    def num_heads(self, side: str) -> int:
        return int(self.variables[f"{side}/num_heads"])

    @property
    def n_vocab(self) -> int:
        return int(self.variables["decoder/embeddings/weight"].shape[0])

    @property
    def d_model(self) -> int:
        return int(self.variables["decoder/embeddings/weight"].shape[1])

    @property
    def n_mels(self) -> int:
        return int(self.variables["encoder/conv1/weight"].shape[1])

    @property
    def n_audio_ctx(self) -> int:
        return int(self.variables["encoder/position_encodings/encodings"].shape[0])

    @property
    def n_text_ctx(self) -> int:
        return int(self.variables["decoder/position_encodings/encodings"].shape[0])

    @property
    def multilingual(self) -> bool:
        return self.n_vocab >= 51865  # what whisper.cpp and openai-whisper test

    def tokenizer(self) -> dict[str, Any]:
        data = json.loads((self.path / "tokenizer.json").read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}


def read_ctranslate2(path: Path) -> Ct2Whisper:
    """Read every variable of `path/model.bin` (format version 6, WhisperSpec)."""
    weights = path / "model.bin"
    if not weights.is_file() or not (path / "tokenizer.json").is_file():
        raise InvalidRequestError(f"{path} is not a CTranslate2 Whisper folder (needs model.bin and tokenizer.json)")
    with weights.open("rb") as f:
        (version,) = _unpack(f, "I")
        spec = _string(f)
        if version != 6 or spec != "WhisperSpec":
            raise InvalidRequestError(f"{weights}: expected a CTranslate2 v6 WhisperSpec file, got v{version} {spec!r}")
        _unpack(f, "I")  # spec revision
        variables = dict(_variables(f))
    if any(name.endswith("_scale") for name in variables):
        raise InvalidRequestError(
            f"{path} holds int8-quantized weights; convert a float16/float32 CTranslate2 model instead"
        )
    config = json.loads((path / "config.json").read_text(encoding="utf-8")) if (path / "config.json").is_file() else {}
    return Ct2Whisper(path, variables, config)


def _variables(f: BinaryIO) -> Iterator[tuple[str, np.ndarray]]:
    (count,) = _unpack(f, "I")
    for _ in range(count):
        name = _string(f)
        (rank,) = _unpack(f, "B")
        shape = _unpack(f, "I" * rank)
        dtype_id, num_bytes = _unpack(f, "B")[0], _unpack(f, "I")[0]
        if dtype_id not in _CT2_DTYPES:
            raise InvalidRequestError(f"{name}: unsupported CTranslate2 data type {dtype_id}")
        data = np.frombuffer(f.read(num_bytes), dtype=_CT2_DTYPES[dtype_id])
        yield name, data.reshape(shape) if rank else data[0]
    (num_aliases,) = _unpack(f, "I")
    for _ in range(num_aliases):  # decoder/projection/weight -> the tied embeddings: nothing to copy
        _string(f), _string(f)


def _unpack(f: BinaryIO, fmt: str) -> tuple[Any, ...]:
    size = struct.calcsize("<" + fmt)
    raw = f.read(size)
    if len(raw) != size:
        raise InvalidRequestError(f"{getattr(f, 'name', 'model.bin')} is truncated")
    return struct.unpack("<" + fmt, raw)


def _string(f: BinaryIO) -> str:
    (length,) = _unpack(f, "H")
    return f.read(length).rstrip(b"\0").decode("utf-8")


# ---- OpenAI's tensor names (what whisper.cpp loads) -------------------------------------


def openai_state_dict(model: Ct2Whisper) -> dict[str, np.ndarray]:
    """The model's tensors under openai-whisper's names, fused projections split
    (whisper's key projections have no bias: CTranslate2 stores zeros there)."""
    v, d = model.variables, model.d_model
    out: dict[str, np.ndarray] = {}
    for conv in ("conv1", "conv2"):
        out[f"encoder.{conv}.weight"] = v[f"encoder/{conv}/weight"]
        out[f"encoder.{conv}.bias"] = v[f"encoder/{conv}/bias"]
    out["encoder.positional_embedding"] = v["encoder/position_encodings/encodings"]
    for i in range(model.num_layers("encoder")):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        out |= _attention(v, f"{src}/self_attention", f"{dst}.attn", d, fused_qkv=True)
        out |= _norm(v, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln")
        out |= _mlp(v, src, dst)
    out |= _norm(v, "encoder/layer_norm", "encoder.ln_post")
    out["decoder.token_embedding.weight"] = v["decoder/embeddings/weight"]
    out["decoder.positional_embedding"] = v["decoder/position_encodings/encodings"]
    for i in range(model.num_layers("decoder")):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        out |= _attention(v, f"{src}/self_attention", f"{dst}.attn", d, fused_qkv=True)
        out |= _norm(v, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln")
        out |= _attention(v, f"{src}/attention", f"{dst}.cross_attn", d, fused_qkv=False)
        out |= _norm(v, f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln")
        out |= _mlp(v, src, dst)
    out |= _norm(v, "decoder/layer_norm", "decoder.ln")
    return out


def _attention(v: dict[str, np.ndarray], src: str, dst: str, d: int, *, fused_qkv: bool) -> dict[str, np.ndarray]:
    if fused_qkv:  # self-attention: linear_0 = q|k|v, linear_1 = out
        w, b = v[f"{src}/linear_0/weight"], v[f"{src}/linear_0/bias"]
        out_name = "linear_1"
    else:  # cross-attention: linear_0 = q, linear_1 = k|v, linear_2 = out
        w = np.concatenate([v[f"{src}/linear_0/weight"], v[f"{src}/linear_1/weight"]])
        b = np.concatenate([v[f"{src}/linear_0/bias"], v[f"{src}/linear_1/bias"]])
        out_name = "linear_2"
    return {
        f"{dst}.query.weight": w[:d],
        f"{dst}.query.bias": b[:d],
        f"{dst}.key.weight": w[d : 2 * d],
        f"{dst}.value.weight": w[2 * d :],
        f"{dst}.value.bias": b[2 * d :],
        f"{dst}.out.weight": v[f"{src}/{out_name}/weight"],
        f"{dst}.out.bias": v[f"{src}/{out_name}/bias"],
    }


def _norm(v: dict[str, np.ndarray], src: str, dst: str) -> dict[str, np.ndarray]:
    return {f"{dst}.weight": v[f"{src}/gamma"], f"{dst}.bias": v[f"{src}/beta"]}


def _mlp(v: dict[str, np.ndarray], src: str, dst: str) -> dict[str, np.ndarray]:
    return {
        f"{dst}.mlp.0.weight": v[f"{src}/ffn/linear_0/weight"],
        f"{dst}.mlp.0.bias": v[f"{src}/ffn/linear_0/bias"],
        f"{dst}.mlp.2.weight": v[f"{src}/ffn/linear_1/weight"],
        f"{dst}.mlp.2.bias": v[f"{src}/ffn/linear_1/bias"],
        **_norm(v, f"{src}/ffn/layer_norm", f"{dst}.mlp_ln"),
    }


# ---- whisper.cpp's ggml file ---------------------------------------------------------------


def cached_ggml(source: Path, name: str, *, force: bool = False, progress: Progress | None = None) -> Path:
    """The whisper.cpp model of the CTranslate2 folder `source`, converted now
    unless the model store has an up-to-date copy (keyed by the source)."""
    target = store_target(source, name, "f16.ggml.bin")
    if target.is_file() and not force:
        return target
    model = read_ctranslate2(source)
    return write_atomically(target, lambda tmp: write_ggml(model, tmp, progress))


def store_target(source: Path, name: str, suffix: str) -> Path:
    """`<store>/<name>/<name>-<digest>-<suffix>`; the digest follows the source
    weights and this converter, so a changed source converts again."""
    weights = source / "model.bin"
    if not weights.is_file():
        raise InvalidRequestError(f"{source} is not a CTranslate2 Whisper folder (no model.bin)")
    fingerprint = f"{content_fingerprint(weights)}|{suffix}|v{CONVERTER_VERSION}"
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:12]
    folder = name.replace("/", "--").replace(":", "@")  # org/repo:TAG as one folder name
    return model_store() / folder / f"{folder}-{digest}-{suffix}"


def write_ggml(model: Ct2Whisper, path: Path, progress: Progress | None = None) -> None:
    """Write whisper.cpp's model file: header, mel filters, vocabulary, then
    every tensor (2-D weights in float16, vectors and position tables in
    float32, as whisper.cpp allocates them)."""
    from faster_whisper.feature_extractor import FeatureExtractor

    tensors = openai_state_dict(model)
    with path.open("wb") as f:
        header = (
            model.n_vocab, model.n_audio_ctx, model.d_model, model.num_heads("encoder"), model.num_layers("encoder"),
            model.n_text_ctx, model.d_model, model.num_heads("decoder"), model.num_layers("decoder"), model.n_mels,
            1,  # ftype: float16 weights
        )  # fmt: skip
        f.write(struct.pack("<I", GGML_MAGIC) + struct.pack("<11i", *header))
        filters = FeatureExtractor.get_mel_filters(SAMPLE_RATE, N_FFT, model.n_mels).astype(np.float32)
        f.write(struct.pack("<2i", *filters.shape) + filters.tobytes())
        tokens = vocabulary_bytes(model.tokenizer())
        f.write(struct.pack("<i", len(tokens)))
        for token in tokens:
            f.write(struct.pack("<i", len(token)) + token)
        for done, (name, data) in enumerate(tensors.items()):
            if progress is not None:
                progress(name, done, len(tensors))
            _write_tensor(f, name, data)
    if progress is not None:
        progress("done", len(tensors), len(tensors))


def _write_tensor(f: BinaryIO, name: str, data: np.ndarray) -> None:
    if name in ("encoder.conv1.bias", "encoder.conv2.bias"):
        data = data.reshape(data.shape[0], 1)  # whisper.cpp adds them as [n_state, 1]
    f32 = data.ndim < 2 or name.endswith(("conv1.bias", "conv2.bias", "positional_embedding"))
    data = np.ascontiguousarray(data, dtype=np.float32 if f32 else np.float16)
    encoded = name.encode("utf-8")
    f.write(struct.pack("<3i", data.ndim, len(encoded), 0 if f32 else 1))
    f.write(struct.pack(f"<{data.ndim}i", *reversed(data.shape)))  # ggml: innermost dimension first
    f.write(encoded)
    f.write(data.tobytes())


def vocabulary_bytes(tokenizer: dict[str, Any]) -> list[bytes]:
    """The byte string of every BPE token, by id, through `<|endoftext|>` (as
    OpenAI's vocab.json lists them); whisper.cpp names the later special
    tokens itself."""
    vocab: dict[str, int] = tokenizer.get("model", {}).get("vocab", {})
    specials = [t["id"] for t in tokenizer.get("added_tokens", []) if t.get("special")]
    if not vocab or not specials:
        raise InvalidRequestError("tokenizer.json has no byte-level BPE vocabulary with special tokens")
    count = 1 + max(i for i in vocab.values() if i <= min(specials))
    decoder = {c: b for b, c in _bytes_to_unicode().items()}
    tokens = [b""] * count  # multilingual models have an unused empty token
    for text, token_id in vocab.items():
        if token_id < count:
            tokens[token_id] = bytes(decoder[c] for c in text)
    return tokens


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the
    others are shifted to code points from 256 on."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


def is_ggml_whisper(path: Path) -> bool:
    """True for a whisper.cpp model file (starts with the ggml magic)."""
    try:
        with path.open("rb") as f:
            return f.read(4) == struct.pack("<I", GGML_MAGIC)
    except OSError:
        return False
