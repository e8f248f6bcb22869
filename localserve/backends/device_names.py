"""The one device vocabulary: the names `--device`, the catalog's and the
config file's `device`, `POST /api/v1/load` options and `localserve devices`
all use, and the one resolver every backend maps them through.

Names (case-insensitive; `localserve devices` shows which a backend sees):

    auto        each backend's default: the best device it sees (its `auto` order)
    cpu         the CPU
    gpu         any GPU the backend can use (llama.cpp: all of them, layers split)
    gpu:N       the Nth GPU only (also `gpu.N`, OpenVINO's spelling)
    npu         a neural processing unit (OpenVINO; ONNX Runtime's QNN or Vitis AI)
    cuda, rocm, vulkan, metal              a GPU through that API (llama.cpp builds)
    cuda, tensorrt, migraphx, directml (dml), coreml, qnn, vitisai
                                           an ONNX Runtime execution provider

`npu` and an API name take `:N` like `gpu` does (`cuda:1`). Each backend declares a
`DeviceTable`: the names it can serve, its `auto` order, and how to get more
devices; it lists what it sees as `Present` entries and asks `resolve`. A
name outside the vocabulary, or one the backend can never serve, is an
`UnsupportedDeviceError`; a name it serves but does not see here is a
`DeviceNotFoundError`. Both are 400s that list the names to use.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from localserve.errors import DeviceNotFoundError, UnsupportedDeviceError

AUTO, CPU, GPU, NPU = "auto", "cpu", "gpu", "npu"
#: GPU APIs named after the llama.cpp build (ggml's device names) or the ONNX
#: Runtime execution provider that runs them.
APIS = ("cuda", "rocm", "vulkan", "metal", "tensorrt", "migraphx", "directml", "coreml", "qnn", "vitisai")
KINDS = (AUTO, CPU, GPU, NPU, *APIS)
ALIASES = {"dml": "directml"}
_NAME = re.compile(r"^([a-z]+)(?:[:.](\d+))?$")
DEVICES_HINT = "`localserve devices` lists what each backend sees here."


@dataclass(frozen=True, slots=True)
class DeviceName:
    """A parsed device name: a kind and, for a GPU, its number."""

    kind: str  # one of KINDS
    index: int | None = None  # gpu:N, npu:N, cuda:N

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def vocabulary() -> str:
    """Every name, for help texts and errors."""
    return f"{AUTO}, {CPU}, {GPU}, {GPU}:N, {NPU}, {', '.join(APIS)}"


def parse_device(text: str) -> DeviceName:
    """`text` as a device name; ValueError names the vocabulary."""
    match = _NAME.match(str(text).strip().lower())
    kind = ALIASES.get(match.group(1), match.group(1)) if match else ""
    if not match or kind not in KINDS or (match.group(2) is not None and kind in (AUTO, CPU)):
        raise ValueError(f"unknown device {text!r}; use one of: {vocabulary()}")
    return DeviceName(kind, None if match.group(2) is None else int(match.group(2)))


def canonical_device(text: str) -> str:
    """`text` in its one spelling (`GPU.1` -> `gpu:1`, `DML` -> `directml`); ValueError if unknown."""
    return str(parse_device(text))


@dataclass(frozen=True, slots=True)
class Present:
    """One device a backend sees here, under our names and its runtime's."""

    name: str  # what `localserve devices` lists: cpu, gpu:0, npu, cuda, ...
    runtime: str  # the runtime's own name: "GPU.1", "CUDAExecutionProvider", "CUDA0"
    kinds: frozenset[str]  # the names that ask for it: {"gpu", "cuda"}
    index: int | None = 0  # its number among its kind; None: the runtime takes any (ONNX Runtime's device_id)
    description: str = ""  # what it is (a GPU's model name, ...)

    def matches(self, wanted: DeviceName) -> bool:
        return wanted.kind in self.kinds and (wanted.index is None or self.index in (None, wanted.index))


@dataclass(frozen=True, slots=True)
class DeviceTable:
    """What one backend can run on: the names it serves, its `auto` order."""

    backend: str  # as users know it: "llama.cpp", "ONNX Runtime"
    accepts: tuple[str, ...]  # kinds (KINDS) it can ever serve
    auto: tuple[str, ...]  # kinds, best first, that `auto` tries
    hint: str = ""  # how to get the devices it lacks

    def accepted(self) -> str:
        """The names this backend serves, as a user types them."""
        names = []
        for kind in self.accepts:
            names.append(kind)
            if kind == GPU:
                names.append("gpu:N")
        return ", ".join(names)

    def resolve(self, device: str, present: Sequence[Present]) -> tuple[DeviceName, tuple[Present, ...]]:
        """The name asked for and the present devices that serve it, best
        first (`gpu` on llama.cpp uses them all; other backends the first)."""
        try:
            wanted = parse_device(device)
        except ValueError as exc:
            raise UnsupportedDeviceError(f"{exc}. {self.backend} can use: {self.accepted()}.") from None
        if wanted.kind not in self.accepts:
            raise UnsupportedDeviceError(
                f"{self.backend} cannot run on {str(wanted)!r}; it can use: {self.accepted()}. {DEVICES_HINT}"
            )
        kinds = self.auto if wanted.kind == AUTO else (wanted.kind,)
        for kind in kinds:
            found = tuple(p for p in present if p.matches(DeviceName(kind, wanted.index)))
            if found:
                return wanted, found
        seen = ", ".join(p.name for p in present) or "none"
        hint = f" {self.hint}" if self.hint and wanted.kind != CPU else ""
        raise DeviceNotFoundError(
            f"device {str(wanted)!r} was asked for, but {self.backend} sees no such device here; present: {seen}."
            f"{hint} {DEVICES_HINT}"
        )
