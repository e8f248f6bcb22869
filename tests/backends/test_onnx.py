"""The ONNX Runtime backend on SmolLM2 exported from the shipped GGUF (the
shared decoder tests), its device choice, and the HTTP API on top."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localserve.backends.kv_decoder import describe_io, plan_calls
from localserve.backends.onnx.backend import OnnxBackend, OnnxConfig
from localserve.engine.types import SamplingParams, SeqChunk
from localserve.errors import DeviceNotFoundError, LocalServeError
from tests.backends.decoder_contract import *  # noqa: F403 - the shared decoder tests
from tests.fixtures.export_smollm2 import exported_smollm2  # noqa: F401 - session fixture

CPU_ONLY = ["CPUExecutionProvider"]


def open_backend(folder: Path, **overrides) -> OnnxBackend:  # type: ignore[no-untyped-def]
    config = dict(n_ctx=1024, num_slots=4, step_tokens=256, n_threads=0)
    return OnnxBackend(OnnxConfig(str(folder), **{**config, **overrides}))


@pytest.fixture(scope="module")
def decoder(exported_smollm2: dict[str, Path]) -> Iterator[OnnxBackend]:  # noqa: F811
    backend = open_backend(exported_smollm2["onnx"])
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def decoder_folder(exported_smollm2: dict[str, Path]) -> Path:  # noqa: F811
    return exported_smollm2["onnx"]


# ---- no model needed -----------------------------------------------------------------


def test_a_graph_without_past_key_values_is_refused() -> None:
    with pytest.raises(LocalServeError, match="no explicit past_key_values"):
        describe_io({"input_ids": (["b", "s"], "tensor(int64)")}, ["logits"], "model.onnx")
    stateful = {"input_ids": (["b", "s"], "i64"), "beam_idx": (["b"], "i32")}
    with pytest.raises(LocalServeError, match="stateful OpenVINO"):
        describe_io(stateful, ["logits"], "openvino_model.xml")


def test_decode_tokens_share_one_call_and_long_prompts_run_apart() -> None:
    def c(seq_id: int, n: int) -> SeqChunk:
        return SeqChunk(seq_id, seq_id, tuple(range(n)), 0, True, SamplingParams())

    calls = plan_calls([c(0, 1), c(1, 300), c(2, 1), c(3, 1), c(4, 12), c(5, 11)])
    assert [[x.seq_id for x in call] for call in calls] == [[0, 2, 3], [5, 4], [1]]


# ---- the real model --------------------------------------------------------------------


@pytest.mark.slow
def test_cuda_on_a_cpu_only_onnxruntime_fails_at_load(exported_smollm2: dict[str, Path]) -> None:  # noqa: F811
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(DeviceNotFoundError, match="present: cpu"):
        open_backend(exported_smollm2["onnx"], device="cuda")


@pytest.mark.slow
def test_info_and_capacity(decoder: OnnxBackend) -> None:
    info, cap = decoder.info(), decoder.capacity()
    assert (info.backend, info.device, info.architecture) == ("onnx", "CPU", "llama")
    assert cap.num_slots == 4 and cap.n_ctx == 1024 and cap.kv_size == 4 * 1024
    assert cap.step_tokens == 256
