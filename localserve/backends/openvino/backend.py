"""The OpenVINO backend: a decoder-only model in OpenVINO IR with past
key/values as inputs (`localserve export --to openvino`, or optimum-intel
with `stateful=False`), on NPU, GPU or CPU.

The raw runtime runs the graph; KV handling, batching and sampling live in
kv_decoder.py, so our scheduler decides every step (openvino-genai's
pipelines would bring a scheduler of their own). On the NPU, which compiles
static shapes only, the graph is compiled twice with shapes fixed from
--ctx-size, --parallel and --batch-tokens (openvino_static.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localserve.backends.device_names import AUTO, CPU, GPU, NPU, DeviceTable, Present
from localserve.backends.hf_tokenizer import HFTokenizer
from localserve.backends.kv_decoder import (
    CallShape,
    DecoderIO,
    KvDecoderBackend,
    describe_io,
    plan_capacity,
    read_model_config,
)
from localserve.backends.openvino.static import (
    StaticShapes,
    needs_static_shapes,
    plan_static_shapes,
    static_calls,
    static_input_shapes,
)
from localserve.engine.backend import BackendInfo
from localserve.engine.types import SeqChunk
from localserve.errors import LocalServeError

OPENVINO = DeviceTable(
    "OpenVINO",
    accepts=(AUTO, CPU, GPU, NPU),
    auto=(NPU, GPU, CPU),  # the first present
    hint="NPU and GPU need Intel's drivers installed.",
)


@dataclass(frozen=True, slots=True)
class OpenVinoConfig:
    """How to load an OpenVINO IR decoder folder (openvino_model.xml + tokenizer files)."""

    model_path: str  # the folder, or its openvino_model.xml
    n_ctx: int = 4096
    num_slots: int = 8
    kv_size: int = 0  # 0: num_slots * n_ctx, memory permitting
    step_tokens: int = 512
    n_threads: int = 0  # 0: OpenVINO's default
    device: str = "auto"  # a device name (backends/device_names.py): auto (NPU > GPU > CPU), cpu, gpu, gpu:N, npu
    precision: str = ""  # INFERENCE_PRECISION_HINT: "" (device default), f32, f16, bf16
    static_shapes: bool | None = None  # None: on the NPU only (openvino_static.py); True forces them (tests)


def available_devices() -> list[str]:
    """OpenVINO's names of the devices it sees (CPU, GPU.0, NPU)."""
    import openvino as ov

    return list(ov.Core().available_devices)


def present_devices(available: list[str]) -> list[Present]:
    """OpenVINO's devices under our names (GPU.1 -> gpu:1, a lone GPU -> gpu), best first."""
    present = []
    for kind in OPENVINO.auto:
        for runtime in sorted(d for d in available if d.split(".")[0].lower() == kind):
            _, dot, number = runtime.partition(".")
            name = f"{kind}:{number}" if dot else kind
            present.append(Present(name, runtime, frozenset({kind}), int(number) if dot else 0))
    return present


def resolve_device(device: str, available: list[str]) -> str:
    """OpenVINO's name of the device for a device name (`gpu:1` -> "GPU.1");
    UnsupportedDeviceError or DeviceNotFoundError name what it sees."""
    _, found = OPENVINO.resolve(device, present_devices(available))
    return found[0].runtime


def model_file(path: Path) -> Path:
    if path.is_dir():
        path = path / "openvino_model.xml"
    if not path.is_file():
        raise LocalServeError(f"OpenVINO model not found: {path}")
    return path


class OpenVinoBackend(KvDecoderBackend):
    """A decoder-only OpenVINO IR model compiled for one device."""

    def __init__(self, config: OpenVinoConfig) -> None:
        import openvino as ov

        path = model_file(Path(config.model_path))
        self.config = config
        core = ov.Core()
        self._device = resolve_device(config.device, list(core.available_devices))
        model = core.read_model(str(path))
        inputs = {p.get_any_name(): (_shape(p), p.get_element_type().get_type_name()) for p in model.inputs}
        outputs = [p.get_any_name() for p in model.outputs]
        io = describe_io(inputs, outputs, str(path))
        properties: dict[str, str] = {"PERFORMANCE_HINT": "LATENCY"}
        if config.n_threads > 0 and self._device == "CPU":
            properties["INFERENCE_NUM_THREADS"] = str(config.n_threads)
        if config.precision:
            properties["INFERENCE_PRECISION_HINT"] = config.precision
        self._model_config = read_model_config(path.parent)
        capacity = plan_capacity(
            io,
            self._model_config,
            n_ctx=config.n_ctx,
            num_slots=config.num_slots,
            kv_size=config.kv_size,
            step_tokens=config.step_tokens,
        )
        self.static: StaticShapes | None = None
        # Call shape -> the graph compiled for it (None: dynamic shapes).
        graphs: dict[CallShape | None, object] = {None: model}
        if needs_static_shapes(self._device, config.static_shapes):
            self.static = plan_static_shapes(
                n_ctx=capacity.n_ctx,
                num_slots=capacity.num_slots,
                step_tokens=config.step_tokens,
                bytes_per_token=io.bytes_per_token,
                device=self._device,
            )
            graphs = {shape: _reshaped(model, shape, io) for shape in {self.static.prefill, self.static.decode}}
        self._requests: dict[CallShape | None, tuple[object, list[object]]] = {}
        for shape, graph in graphs.items():
            try:
                compiled = core.compile_model(graph, self._device, properties)
            except RuntimeError as exc:
                hint = " (static shapes from --ctx-size, --parallel, --batch-tokens: try smaller)" if shape else ""
                raise LocalServeError(f"OpenVINO could not compile {path} for {self._device}{hint}: {exc}") from exc
            outputs = [compiled.output(name) for name in ("logits", *io.present_names)]
            self._requests[shape] = (compiled.create_infer_request(), outputs)
        super().__init__(io, HFTokenizer(path.parent), capacity)

    def _plan(self, chunks: Sequence[SeqChunk]) -> list[tuple[list[SeqChunk], CallShape | None]]:
        if self.static is None:
            return super()._plan(chunks)
        return static_calls(chunks, self.static)  # type: ignore[return-value]

    def _infer(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        # No copies either way: OpenVINO reads our arrays in place, and the
        # caller copies what it keeps of the outputs before the next call.
        shape = None
        if self.static is not None:
            rows, new_tokens = feeds["input_ids"].shape
            shape = CallShape(rows, new_tokens, feeds["attention_mask"].shape[1] - new_tokens)
        request, outputs = self._requests[shape]
        results = request.infer(feeds, share_inputs=True, share_outputs=True)  # type: ignore[attr-defined]
        logits, *presents = (results[port] for port in outputs)
        return logits, presents

    def info(self) -> BackendInfo:
        return BackendInfo(
            backend="openvino",
            device=self._device,
            model_path=self.config.model_path,
            architecture=str(self._model_config.get("model_type", "")),
            n_ctx_train=int(self._model_config.get("max_position_embeddings") or 0),
        )

    def close(self) -> None:
        self._requests = {}
        self._slots = []


def _reshaped(model: object, shape: CallShape, io: DecoderIO) -> object:
    """A copy of `model` with every input fixed to the call shape `shape`."""
    graph = model.clone()  # type: ignore[attr-defined]
    graph.reshape(static_input_shapes(shape, io.past_names, io.num_kv_heads, io.head_dim, io.has_position_ids))
    return graph


def _shape(port: object) -> list[object]:
    """A port's shape with ints for static dimensions, "?" for dynamic ones."""
    shape = port.get_partial_shape()  # type: ignore[attr-defined]
    return [d.get_length() if d.is_static else "?" for d in shape]
