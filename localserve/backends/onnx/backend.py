"""The ONNX Runtime backend: a decoder-only model exported to ONNX with past
key/values (optimum-onnx `text-generation-with-past`, or `localserve export
--to onnx`), on any execution provider onnxruntime has here (providers.py
picks it from the device name).

KV handling, batching and sampling live in kv_decoder.py (shared with
OpenVINO); this module opens the session and runs the graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localserve.backends.hf_tokenizer import HFTokenizer
from localserve.backends.kv_decoder import (
    KvDecoderBackend,
    describe_io,
    plan_capacity,
    read_model_config,
)
from localserve.backends.onnx.providers import label, session_providers
from localserve.engine.backend import BackendInfo
from localserve.errors import LocalServeError


@dataclass(frozen=True, slots=True)
class OnnxConfig:
    """How to load an ONNX decoder folder (model.onnx + tokenizer files)."""

    model_path: str  # the folder, or its model.onnx
    n_ctx: int = 4096
    num_slots: int = 8
    kv_size: int = 0  # 0: num_slots * n_ctx, memory permitting
    step_tokens: int = 512
    n_threads: int = 0  # 0: onnxruntime's default (all cores)
    device: str = "auto"  # a device name (backends/device_names.py); providers.py maps it


def model_file(path: Path) -> Path:
    if path.is_dir():
        path = path / "model.onnx"
    if not path.is_file():
        raise LocalServeError(f"ONNX model not found: {path}")
    return path


class OnnxBackend(KvDecoderBackend):
    """A decoder-only ONNX model in one onnxruntime session."""

    def __init__(self, config: OnnxConfig) -> None:
        import onnxruntime as ort

        path = model_file(Path(config.model_path))
        self.config = config
        providers = session_providers(config.device, ort.get_available_providers())
        self._device = label(providers)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = max(0, config.n_threads)
        options.log_severity_level = 3
        if self._device.startswith("DirectML"):  # DirectML needs both off
            options.enable_mem_pattern = False
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        try:
            self._session = ort.InferenceSession(str(path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise LocalServeError(f"onnxruntime could not load {path}: {exc}") from exc
        inputs = {i.name: (list(i.shape), i.type) for i in self._session.get_inputs()}
        outputs = [o.name for o in self._session.get_outputs()]
        io = describe_io(inputs, outputs, str(path))
        self._output_names = ["logits", *io.present_names]
        folder = path.parent
        self._model_config = read_model_config(folder)
        capacity = plan_capacity(
            io,
            self._model_config,
            n_ctx=config.n_ctx,
            num_slots=config.num_slots,
            kv_size=config.kv_size,
            step_tokens=config.step_tokens,
        )
        super().__init__(io, HFTokenizer(folder), capacity)

    def _infer(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        logits, *presents = self._session.run(self._output_names, feeds)
        return logits, presents

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="onnx",
            device=self._device,
            model_path=self.config.model_path,
            architecture=str(self._model_config.get("model_type", "")),
            n_ctx_train=int(self._model_config.get("max_position_embeddings") or 0),
        )

    def close(self) -> None:
        self._session = None  # type: ignore[assignment]
        self._slots = []
