"""Embeddings with OpenVINO: the IR `models.convert.bert_openvino` writes from a
sentence-transformers folder (BERT + the folder's pooling and normalisation
inside the graph), and its WordPiece tokenizer.

On CPU and GPU the graph keeps a dynamic batch and sequence length, so a
batch is padded only to its longest input (the queue groups by length).
The NPU plugin compiles static shapes only: there the graph is reshaped to
`[npu_batch, npu_tokens]` once at load, every call is padded to exactly that
(extra rows have an all-zero mask and are dropped), and an input longer than
`npu_tokens` is refused like any over-long input.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localserve.backends.onnx.embeddings import PaddedEmbeddingBackend, TokenIds
from localserve.backends.openvino.backend import resolve_device
from localserve.engine.backend import BackendInfo
from localserve.errors import LocalServeError

#: Static shape on the NPU unless the config says otherwise.
NPU_BATCH, NPU_TOKENS = 8, 256


@dataclass(frozen=True, slots=True)
class OpenVinoEmbeddingConfig:
    model_path: str  # the .xml; its tokenizer is `<stem>.tokenizer.json` beside it
    device: str = "auto"  # a device name (backends/device_names.py): auto (NPU > GPU > CPU), cpu, gpu, gpu:N, npu
    n_threads: int = 0  # 0: OpenVINO's default
    max_input_tokens: int = 512
    precision: str = ""  # INFERENCE_PRECISION_HINT: "" (the device's default), f32, f16, bf16
    static_shapes: bool | None = None  # None: only on the NPU (True forces them anywhere, for tests)
    npu_batch: int = NPU_BATCH  # rows per call with static shapes
    npu_tokens: int = NPU_TOKENS  # tokens per row with static shapes


class OpenVinoEmbeddingBackend(PaddedEmbeddingBackend):
    """Pooled sentence embeddings from one compiled OpenVINO model."""

    def __init__(self, config: OpenVinoEmbeddingConfig) -> None:
        import openvino as ov

        path = Path(config.model_path)
        tokenizer_file = path.with_name(path.stem + ".tokenizer.json")
        if path.suffix != ".xml" or not path.is_file() or not tokenizer_file.is_file():
            raise LocalServeError(
                f"{path} and its tokenizer {tokenizer_file.name} are needed; run "
                "`localserve convert MODEL --format openvino`"
            )
        self.config = config
        core = ov.Core()
        self._device = resolve_device(config.device, list(core.available_devices))
        model = core.read_model(str(path))
        static = self._device.startswith("NPU") if config.static_shapes is None else config.static_shapes
        self.static_shape = (config.npu_batch, min(config.npu_tokens, config.max_input_tokens)) if static else None
        if self.static_shape is not None:
            model.reshape({"input_ids": list(self.static_shape), "attention_mask": list(self.static_shape)})
        properties: dict[str, str] = {}
        if config.n_threads > 0 and self._device == "CPU":
            properties["INFERENCE_NUM_THREADS"] = str(config.n_threads)
        if config.precision:
            properties["INFERENCE_PRECISION_HINT"] = config.precision
        try:
            compiled = core.compile_model(model, self._device, properties)
        except RuntimeError as exc:
            raise LocalServeError(f"OpenVINO could not compile {path} for {self._device}: {exc}") from exc
        self._request = compiled.create_infer_request()
        self._output = compiled.output("embeddings")
        self.n_embd = int(self._output.get_partial_shape()[-1].get_length())
        self.pooling = _rt_info(model, "pooling", "mean")
        self._open_tokenizer(tokenizer_file, self.static_shape[1] if self.static_shape else config.max_input_tokens)

    def run(self, items: list[TokenIds]) -> list[np.ndarray]:  # type: ignore[override]
        if self.static_shape is None:
            return super().run(items)
        rows = self.static_shape[0]
        out: list[np.ndarray] = []
        for start in range(0, len(items), rows):
            out.extend(super().run(items[start : start + rows])[: len(items[start : start + rows])])
        return out

    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        if self.static_shape is not None:  # pad to the compiled shape; the mask hides the padding
            ids = np.full(self.static_shape, self.pad_id, np.int64)
            mask = np.zeros(self.static_shape, np.int64)
            ids[: input_ids.shape[0], : input_ids.shape[1]] = input_ids
            mask[: input_ids.shape[0], : input_ids.shape[1]] = attention_mask
            input_ids, attention_mask = ids, mask
        result = self._request.infer({"input_ids": input_ids, "attention_mask": attention_mask})
        return np.array(result[self._output], dtype=np.float32)

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="openvino",
            device=self._device,
            model_path=self.config.model_path,
            architecture="bert",
            n_ctx_train=self.max_input_tokens,
        )

    def close(self) -> None:
        self._request = None


def _rt_info(model: object, key: str, default: str) -> str:
    """A `localserve` rt_info value the converter wrote, or `default`."""
    try:
        return str(model.get_rt_info(["localserve", key]).astype(str))  # type: ignore[attr-defined]
    except RuntimeError:
        return default
