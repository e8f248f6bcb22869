"""The OpenVINO backend on SmolLM2 exported from the shipped GGUF (the
shared decoder tests, in float32 so tokens match PyTorch), its device
choice, and the HTTP API on top."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localserve.backends.openvino.backend import OpenVinoBackend, OpenVinoConfig
from localserve.backends.openvino.static import (
    StaticShapes,
    needs_static_shapes,
    plan_static_shapes,
    static_calls,
    static_input_shapes,
)
from localserve.engine.types import SamplingParams, SeqChunk
from localserve.errors import DeviceNotFoundError, LocalServeError
from tests.backends.decoder_contract import *  # noqa: F403 - the shared decoder tests
from tests.fixtures.export_smollm2 import exported_smollm2  # noqa: F401 - session fixture


def open_backend(folder: Path, **overrides) -> OpenVinoBackend:  # type: ignore[no-untyped-def]
    # f32: this CPU would otherwise run bf16, whose tokens drift from PyTorch's.
    config = dict(n_ctx=1024, num_slots=4, step_tokens=256, device="CPU", precision="f32")
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


SMOLLM2_KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4  # layers, kv heads, head dim, float32


def test_only_the_npu_needs_static_shapes() -> None:
    assert needs_static_shapes("NPU") and needs_static_shapes("npu.0")
    assert not needs_static_shapes("CPU") and not needs_static_shapes("GPU.1")
    assert needs_static_shapes("CPU", forced=True) and not needs_static_shapes("NPU", forced=False)


def test_npu_static_shapes_come_from_ctx_size_parallel_and_batch_tokens() -> None:
    plan = plan_static_shapes(n_ctx=1024, num_slots=4, step_tokens=256, bytes_per_token=SMOLLM2_KV_BYTES_PER_TOKEN)
    assert plan == StaticShapes(past_tokens=1024, prompt_tokens=256, decode_rows=4)
    assert (plan.prefill.rows, plan.prefill.new_tokens, plan.prefill.past_tokens) == (1, 256, 1024)
    assert (plan.decode.rows, plan.decode.new_tokens, plan.decode.past_tokens) == (4, 1, 1024)
    shapes = static_input_shapes(plan.decode, ["past_key_values.0.key"], 3, 64, has_position_ids=True)
    assert shapes == {
        "input_ids": [4, 1],
        "attention_mask": [4, 1025],
        "position_ids": [4, 1],
        "past_key_values.0.key": [4, 3, 1024, 64],
    }


def test_npu_refuses_the_server_defaults_naming_what_to_set() -> None:
    # --ctx-size 4096 x --parallel 8 of SmolLM2's float32 KV: 1.4 GiB per decode call.
    with pytest.raises(LocalServeError) as refused:
        plan_static_shapes(n_ctx=4096, num_slots=8, step_tokens=512, bytes_per_token=SMOLLM2_KV_BYTES_PER_TOKEN)
    message = refused.value.message
    assert "static shapes" in message and "1.4 GiB" in message
    assert "--ctx-size 2816 (LOCALSERVE_CTX_SIZE=2816)" in message
    assert "--parallel 5 (LOCALSERVE_PARALLEL=5)" in message
    plan_static_shapes(n_ctx=2816, num_slots=8, step_tokens=512, bytes_per_token=SMOLLM2_KV_BYTES_PER_TOKEN)
    plan_static_shapes(n_ctx=4096, num_slots=5, step_tokens=512, bytes_per_token=SMOLLM2_KV_BYTES_PER_TOKEN)


def test_static_calls_share_decode_rows_and_split_long_prompts() -> None:
    def c(seq_id: int, n: int, start: int = 0) -> SeqChunk:
        return SeqChunk(seq_id, seq_id, tuple(range(n)), start, True, SamplingParams())

    plan = StaticShapes(past_tokens=512, prompt_tokens=8, decode_rows=2)
    calls = static_calls([c(0, 1, 40), c(1, 20, 5), c(2, 1, 9), c(3, 1, 3)], plan)
    assert [([x.seq_id for x in call], shape) for call, shape in calls] == [
        ([0, 2], plan.decode),
        ([3], plan.decode),
        ([1], plan.prefill),
        ([1], plan.prefill),
        ([1], plan.prefill),
    ]
    pieces = [call[0] for call, _ in calls[2:]]
    assert [(p.start_pos, len(p.token_ids), p.sample) for p in pieces] == [(5, 8, False), (13, 8, False), (21, 4, True)]
    assert sum((p.token_ids for p in pieces), ()) == tuple(range(20))


# ---- the real model --------------------------------------------------------------------


@pytest.mark.slow
def test_absent_gpu_fails_at_load(exported_smollm2: dict[str, Path]) -> None:  # noqa: F811
    import openvino

    if "GPU" in openvino.Core().available_devices:
        pytest.skip("OpenVINO sees a GPU here")
    with pytest.raises(DeviceNotFoundError, match="present: cpu"):
        open_backend(exported_smollm2["openvino"], device="GPU")


@pytest.mark.slow
def test_info_and_capacity(decoder: OpenVinoBackend) -> None:
    info, cap = decoder.info(), decoder.capacity()
    assert (info.backend, info.device, info.architecture) == ("openvino", "CPU", "llama")
    assert cap.num_slots == 4 and cap.n_ctx == 1024


@pytest.mark.slow
def test_static_shapes_give_the_dynamic_tokens(decoder: OpenVinoBackend, exported_smollm2: dict[str, Path]) -> None:  # noqa: F811
    """The NPU's fixed-shape plan, compiled for the CPU (no NPU here): long
    prompts split into prefill calls, decode rows padded, same greedy tokens."""
    from tests.backends.decoder_contract import REFERENCE_PROMPTS, chunk, encode, greedy_alone, step

    static = open_backend(exported_smollm2["openvino"], n_ctx=256, step_tokens=4, static_shapes=True)
    try:
        assert static.static == StaticShapes(past_tokens=256, prompt_tokens=4, decode_rows=4)
        prompts = [encode(decoder, p) for p in REFERENCE_PROMPTS]
        alone = [greedy_alone(decoder, ids, 6) for ids in prompts]
        assert [greedy_alone(static, ids, 6) for ids in prompts] == alone
        # All three at once: prefill pieces in one step, then decode rows together (one padding row).
        static.clear_slots([0, 1, 2])
        first = step(static, [chunk(i, i, ids, 0) for i, ids in enumerate(prompts)])
        out = {i: [first[i]] for i in range(3)}
        for n in range(5):
            nxt = step(static, [chunk(i, i, [out[i][-1]], len(prompts[i]) + n) for i in range(3)])
            for i in range(3):
                out[i].append(nxt[i])
        assert [out[i] for i in range(3)] == alone
    finally:
        static.close()
