"""The OpenVINO backend: a decoder-only model in OpenVINO IR with past
key/values as inputs (`localserve export --to openvino`, or optimum-intel
with `stateful=False`), on NPU, GPU or CPU.

The raw runtime runs the graph; KV handling, batching and sampling live in
kv_decoder.py, so our scheduler decides every step (openvino-genai's
pipelines would bring a scheduler of their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localserve.backends.base import BackendInfo
from localserve.backends.hf_tokenizer import HFTokenizer
from localserve.backends.kv_decoder import KvDecoderBackend, describe_io, plan_capacity, read_model_config
from localserve.errors import DeviceNotFoundError, LocalServeError

#: `auto` takes the first present device of this order.
DEVICE_ORDER = ("NPU", "GPU", "CPU")


@dataclass(frozen=True, slots=True)
class OpenVinoConfig:
    """How to load an OpenVINO IR decoder folder (openvino_model.xml + tokenizer files)."""

    model_path: str  # the folder, or its openvino_model.xml
    n_ctx: int = 4096
    parallel: int = 8
    kv_tokens: int = 0  # 0: parallel * n_ctx, memory permitting
    batch_tokens: int = 512
    n_threads: int = 0  # 0: OpenVINO's default
    device: str = "auto"  # auto | NPU | GPU | CPU (also GPU.1 etc.)
    precision: str = ""  # INFERENCE_PRECISION_HINT: "" (device default), f32, f16, bf16


def available_devices() -> list[str]:
    import openvino as ov

    return list(ov.Core().available_devices)


def resolve_device(device: str, present: list[str]) -> str:
    """The OpenVINO device for `device`; DeviceNotFoundError names the present ones."""
    wanted = device.upper()
    if wanted == "AUTO":
        for kind in DEVICE_ORDER:
            match = next((d for d in present if d.split(".")[0] == kind), None)
            if match is not None:
                return match
        raise DeviceNotFoundError(f"OpenVINO sees no device here (present: {', '.join(present) or 'none'})")
    if wanted in present or (wanted in DEVICE_ORDER and any(d.split(".")[0] == wanted for d in present)):
        return wanted
    raise DeviceNotFoundError(
        f"device {device!r} was asked for, but OpenVINO sees only: {', '.join(present) or 'none'}. "
        "Use --device auto or one of those (NPU and GPU need their drivers installed)."
    )


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
        if self._device.startswith("NPU"):
            raise LocalServeError(
                "OpenVINO's NPU plugin compiles static shapes only (a fixed batch size, prompt length and KV "
                "length, as openvino-genai's MAX_PROMPT_LEN/MIN_RESPONSE_LEN settings fix them); this backend "
                "batches with dynamic shapes and has no fixed-shape NPU mode yet: use --device GPU or CPU"
            )
        model = core.read_model(str(path))
        inputs = {p.get_any_name(): (_shape(p), p.get_element_type().get_type_name()) for p in model.inputs}
        outputs = [p.get_any_name() for p in model.outputs]
        io = describe_io(inputs, outputs, str(path))
        properties: dict[str, str] = {"PERFORMANCE_HINT": "LATENCY"}
        if config.n_threads > 0 and self._device == "CPU":
            properties["INFERENCE_NUM_THREADS"] = str(config.n_threads)
        if config.precision:
            properties["INFERENCE_PRECISION_HINT"] = config.precision
        try:
            self._compiled = core.compile_model(model, self._device, properties)
        except RuntimeError as exc:
            raise LocalServeError(f"OpenVINO could not compile {path} for {self._device}: {exc}") from exc
        self._request = self._compiled.create_infer_request()
        self._outputs = [self._compiled.output(name) for name in ("logits", *io.present_names)]
        self._model_config = read_model_config(path.parent)
        capacity = plan_capacity(
            io,
            self._model_config,
            n_ctx=config.n_ctx,
            parallel=config.parallel,
            kv_tokens=config.kv_tokens,
            batch_tokens=config.batch_tokens,
        )
        super().__init__(io, HFTokenizer(path.parent), capacity)

    def _infer(self, feeds: dict[str, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        # No copies either way: OpenVINO reads our arrays in place, and the
        # caller copies what it keeps of the outputs before the next call.
        results = self._request.infer(feeds, share_inputs=True, share_outputs=True)
        logits, *presents = (results[port] for port in self._outputs)
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
        self._request = None  # type: ignore[assignment]
        self._compiled = None  # type: ignore[assignment]
        self._slots = []


def _shape(port: object) -> list[object]:
    """A port's shape with ints for static dimensions, "?" for dynamic ones."""
    shape = port.get_partial_shape()  # type: ignore[attr-defined]
    return [d.get_length() if d.is_static else "?" for d in shape]
