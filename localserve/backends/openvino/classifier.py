"""Sequence classifiers (cross-encoders, text classifiers) on OpenVINO: the IR
`models.convert.bert_classifier` writes (the plain ONNX graph with the
classifier head), with dynamic batch and sequence length on CPU and GPU.
Tokenizing and padding are the ONNX Runtime classifier's
(`backends/onnx/classifier.py`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localserve.backends.onnx.classifier import PaddedClassifierBackend
from localserve.backends.openvino.backend import resolve_device
from localserve.engine.backend import BackendInfo
from localserve.errors import LocalServeError

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True, slots=True)
class OpenVinoClassifierConfig:
    model_path: str  # the .xml; its tokenizer is `<stem>.tokenizer.json` beside it
    device: str = "auto"  # auto (GPU > CPU here: no static shapes for an NPU yet), cpu, gpu, gpu:N
    n_threads: int = 0  # 0: OpenVINO's default
    max_input_tokens: int = 512
    precision: str = ""  # INFERENCE_PRECISION_HINT: "" (the device's default), f32, f16, bf16


class OpenVinoClassifierBackend(PaddedClassifierBackend):
    """Logits of a BERT sequence classifier from one compiled OpenVINO model."""

    def __init__(self, config: OpenVinoClassifierConfig) -> None:
        import openvino as ov

        path = Path(config.model_path)
        tokenizer_file = path.with_name(path.stem + ".tokenizer.json")
        if path.suffix != ".xml" or not path.is_file() or not tokenizer_file.is_file():
            raise LocalServeError(f"{path} and its tokenizer {tokenizer_file.name} are needed")
        self.config = config
        core = ov.Core()
        self._device = resolve_device(config.device, list(core.available_devices))
        if self._device.startswith("NPU"):
            raise LocalServeError("classifiers run on OpenVINO's CPU and GPU plugins; the NPU needs static shapes")
        model = core.read_model(str(path))
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
        self._output = compiled.output("logits")
        try:
            self.labels = tuple(json.loads(str(model.get_rt_info(["localserve", "labels"]).astype(str))))
        except RuntimeError:
            self.labels = ("LABEL_0",)
        self._open_tokenizer(tokenizer_file, config.max_input_tokens)

    def _forward(self, input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray) -> np.ndarray:
        result = self._request.infer(dict(zip(INPUTS, (input_ids, attention_mask, token_type_ids), strict=True)))
        return np.array(result[self._output], dtype=np.float32)

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="openvino",
            device=self._device,
            model_path=self.config.model_path,
            architecture="bert-classifier",
            n_ctx_train=self.max_input_tokens,
        )

    def close(self) -> None:
        self._request = None
