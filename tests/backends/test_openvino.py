"""The OpenVINO backend on SmolLM2 exported from the shipped GGUF (the
shared decoder tests, in float32 so tokens match PyTorch), its device
choice, and the HTTP API on top."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localserve.backends.openvino import OpenVinoBackend, OpenVinoConfig, resolve_device
from localserve.errors import DeviceNotFoundError
from tests.backends.decoder_contract import *  # noqa: F403 - the shared decoder tests
from tests.fixtures.export_smollm2 import exported_smollm2  # noqa: F401 - session fixture


def open_backend(folder: Path, **overrides) -> OpenVinoBackend:  # type: ignore[no-untyped-def]
    # f32: this CPU would otherwise run bf16, whose tokens drift from PyTorch's.
    config = dict(n_ctx=1024, parallel=4, batch_tokens=256, device="CPU", precision="f32")
    return OpenVinoBackend(OpenVinoConfig(str(folder), **{**config, **overrides}))


@pytest.fixture(scope="module")
def decoder(exported_smollm2: dict[str, Path]) -> Iterator[OpenVinoBackend]:  # noqa: F811
    backend = open_backend(exported_smollm2["openvino"])
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def decoder_folder(exported_smollm2: dict[str, Path]) -> Path:  # noqa: F811
    return exported_smollm2["openvino"]


# ---- no model needed -----------------------------------------------------------------


def test_auto_prefers_npu_then_gpu_then_cpu() -> None:
    assert resolve_device("auto", ["CPU"]) == "CPU"
    assert resolve_device("auto", ["CPU", "GPU.0", "GPU.1"]) == "GPU.0"
    assert resolve_device("AUTO", ["CPU", "GPU", "NPU"]) == "NPU"
    assert resolve_device("gpu", ["CPU", "GPU.0"]) == "GPU"


@pytest.mark.parametrize("device", ["NPU", "GPU", "gpu.1"])
def test_an_absent_device_is_a_clear_error_naming_those_present(device: str) -> None:
    with pytest.raises(DeviceNotFoundError, match="sees only: CPU"):
        resolve_device(device, ["CPU"])


# ---- the real model --------------------------------------------------------------------


@pytest.mark.slow
def test_absent_gpu_fails_at_load(exported_smollm2: dict[str, Path]) -> None:  # noqa: F811
    import openvino

    if "GPU" in openvino.Core().available_devices:
        pytest.skip("OpenVINO sees a GPU here")
    with pytest.raises(DeviceNotFoundError, match="CPU"):
        open_backend(exported_smollm2["openvino"], device="GPU")


@pytest.mark.slow
def test_info_and_capacity(decoder: OpenVinoBackend) -> None:
    info, cap = decoder.info(), decoder.capacity()
    assert (info.backend, info.device, info.architecture) == ("openvino", "CPU", "llama")
    assert cap.max_num_seqs == 4 and cap.n_ctx == 1024
