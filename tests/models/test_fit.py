"""The GGUF header reader and the memory fit: on the real SmolLM2 file
(checked against llama.cpp itself), on generated GGUF headers, and on
made-up machines."""

from __future__ import annotations

import ctypes
import logging
import re
import time
from pathlib import Path

import gguf
import psutil
import pytest

from localserve.errors import InvalidRequestError
from localserve.models.fit import (
    ALL_LAYERS,
    GIB,
    MIB,
    MIN_CTX,
    FitRequest,
    Memory,
    fit_model,
    ggml_devices,
    probe_memory,
)
from localserve.models.gguf_shape import GgufShape, read_gguf_shape
from localserve.models.registry import resolve
from tests.fixtures.tiny_gguf import write_tiny_llama

SMOL_KV_BYTES_PER_CELL = 30 * 3 * (64 + 64) * 2  # layers x KV heads x (key + value dims) x f16


@pytest.fixture(scope="module")
def smol_path() -> Path:
    return resolve("smollm2-135m-instruct").path


@pytest.fixture(scope="module")
def smol(smol_path: Path) -> GgufShape:
    return read_gguf_shape(smol_path)


# ---- reading the header ----------------------------------------------------------------


def test_smollm2_shape_matches_its_metadata(smol: GgufShape, smol_path: Path) -> None:
    assert (smol.architecture, smol.n_ctx_train, smol.n_layers, smol.n_embd, smol.n_head) == ("llama", 8192, 30, 576, 9)
    assert smol.n_vocab == 49152
    assert smol.kv_bytes_per_cell == SMOL_KV_BYTES_PER_CELL == 23040
    assert len(set(smol.layer_bytes)) == 1 and smol.layer_bytes[0] > 0  # 30 equal blocks
    assert smol.file_bytes == smol_path.stat().st_size
    assert 0.95 * smol.file_bytes < smol.weight_bytes < smol.file_bytes


def test_smollm2_shape_matches_llama_cpp(smol: GgufShape, smol_path: Path) -> None:
    import llama_cpp

    from localserve.backends.llamacpp.devices import init_llama

    init_llama()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(smol_path).encode(), params)
    assert model
    try:
        assert smol.weight_bytes == llama_cpp.llama_model_size(model)
        assert smol.n_layers == llama_cpp.llama_model_n_layer(model)
        assert smol.n_ctx_train == llama_cpp.llama_model_n_ctx_train(model)
        assert smol.n_embd == llama_cpp.llama_model_n_embd(model)
    finally:
        llama_cpp.llama_model_free(model)


def test_kv_bytes_per_cell_is_what_llama_cpp_allocates(
    smol: GgufShape, smol_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig

    caplog.set_level(logging.DEBUG, logger="localserve.backends.llamacpp.devices")  # llama.cpp's log
    backend = LlamaCppBackend(LlamaCppConfig(str(smol_path), n_ctx=512, num_slots=2, n_threads=1, device="cpu"))
    backend.close()
    sizes = [float(m) for m in re.findall(r"KV buffer size =\s+([\d.]+) MiB", caplog.text)]
    assert sizes, "llama.cpp logged no KV buffer size"
    assert sum(sizes) * MIB == pytest.approx(smol.kv_bytes_per_cell * 512 * 2)


def test_the_header_is_read_without_the_vocabulary(smol_path: Path) -> None:
    started = time.monotonic()
    read_gguf_shape(smol_path)
    assert time.monotonic() - started < 1.0  # gguf.GGUFReader takes about 10 s on this file


def test_tiny_shape_matches_the_gguf_reader(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=1024)
    shape = read_gguf_shape(path)
    reader = gguf.GGUFReader(str(path))
    assert shape.weight_bytes == sum(int(t.n_bytes) for t in reader.tensors)
    blk = [sum(int(t.n_bytes) for t in reader.tensors if t.name.startswith(f"blk.{i}.")) for i in range(2)]
    assert list(shape.layer_bytes) == blk
    assert shape.n_vocab == len(reader.fields["tokenizer.ggml.tokens"].data)
    assert (shape.n_layers, shape.n_ctx_train) == (2, 1024)
    assert shape.kv_bytes_per_cell == 2 * 2 * (16 + 16) * 2  # layers x KV heads x (head dim x 2) x f16


def test_per_layer_head_counts_and_explicit_key_lengths(tmp_path: Path) -> None:
    """Hybrid models list KV heads per layer (0 = a layer without attention)."""
    path = tmp_path / "hybrid.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(512)
    writer.add_block_count(4)
    writer.add_head_count(8)
    writer.add_head_count_kv([2, 0, 4, 0])
    writer.add_key_length(128)
    writer.add_value_length(64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    shape = read_gguf_shape(path)
    assert shape.kv_bytes_per_layer == (2 * 192 * 2, 0, 4 * 192 * 2, 0)
    assert shape.weight_bytes == 0 and shape.n_ctx_train == 4096


def test_a_file_that_is_not_gguf_is_a_clear_400(tmp_path: Path) -> None:
    path = tmp_path / "x.gguf"
    path.write_bytes(b"not a gguf file at all" * 4)
    with pytest.raises(InvalidRequestError, match="not a readable GGUF") as exc:
        read_gguf_shape(path)
    assert exc.value.status == 400


# ---- the fit, on made-up machines ------------------------------------------------------


def shape(n_layers: int = 10, layer_mib: int = 100, kv_per_layer: int = 1000, n_ctx_train: int = 32768) -> GgufShape:
    return GgufShape(
        architecture="llama",
        n_ctx_train=n_ctx_train,
        n_layers=n_layers,
        n_embd=1024,
        n_head=16,
        n_vocab=32000,
        kv_bytes_per_layer=(kv_per_layer,) * n_layers,
        layer_bytes=(layer_mib * MIB,) * n_layers,
        weight_bytes=n_layers * layer_mib * MIB + 200 * MIB,
        file_bytes=n_layers * layer_mib * MIB + 201 * MIB,
    )


BIG_RAM = Memory(ram_available=200 * GIB, ram_total=256 * GIB)


def test_plenty_of_memory_keeps_the_asked_context_and_says_why_no_gpu() -> None:
    fit = fit_model(shape(), BIG_RAM, FitRequest(ctx_size=8192, num_slots=4))
    assert (fit.n_ctx, fit.num_slots, fit.n_gpu_layers, fit.kv_size) == (8192, 4, 0, 32768)
    assert fit.kv_bytes == 32768 * 10 * 1000 and fit.kv_bytes_gpu == 0
    assert any("auto: 0" in note and "no GPU" in note for note in fit.notes)


def test_zero_asks_for_the_training_context_and_more_is_capped() -> None:
    assert fit_model(shape(), BIG_RAM, FitRequest(ctx_size=0, num_slots=1)).n_ctx == 32768
    capped = fit_model(shape(n_ctx_train=4096), BIG_RAM, FitRequest(ctx_size=8192, num_slots=1))
    assert capped.n_ctx == 4096 and any("training context" in n for n in capped.notes)


def test_a_kv_size_below_ctx_times_parallel_is_one_shared_pool() -> None:
    fit = fit_model(shape(), BIG_RAM, FitRequest(ctx_size=8192, num_slots=4, kv_size=12288))
    assert (fit.n_ctx, fit.kv_size, fit.shared_pool) == (8192, 12288, True)
    assert fit.kv_bytes == 12288 * 10 * 1000
    at_least_a_slot = fit_model(shape(), BIG_RAM, FitRequest(ctx_size=8192, num_slots=4, kv_size=1000))
    assert (at_least_a_slot.n_ctx, at_least_a_slot.kv_size) == (8192, 8192)  # as llama.cpp gets it
    streams = fit_model(shape(), BIG_RAM, FitRequest(ctx_size=2048, num_slots=4, kv_size=8192))
    assert (streams.n_ctx, streams.kv_size, streams.shared_pool) == (2048, 8192, False)


def test_little_ram_shrinks_a_shared_pool_before_the_context() -> None:
    model = shape()  # 10 kB per cell
    memory = Memory(ram_available=int(3.5 * GIB), ram_total=8 * GIB)  # about 1.2 GiB left for the KV cache
    fit = fit_model(model, memory, FitRequest(ctx_size=32768, num_slots=8, kv_size=200_000))
    assert fit.shared_pool and fit.n_ctx == 32768 and 32768 <= fit.kv_size < 200_000
    assert any("shared KV pool 200000 ->" in note for note in fit.notes)


def test_little_ram_shortens_the_context_to_what_fits() -> None:
    model = shape()  # 10 layers x 1000 B per token: 10 kB per token
    memory = Memory(ram_available=4 * GIB, ram_total=8 * GIB)
    fit = fit_model(model, memory, FitRequest(ctx_size=32768, num_slots=8))
    assert MIN_CTX <= fit.n_ctx < 32768 and fit.n_ctx % 256 == 0
    headroom = 1 * GIB  # max(1 GiB, 10% of 8 GiB)
    budget = memory.ram_available - model.weight_bytes - headroom
    assert fit.kv_bytes <= budget  # the KV cache fits what is left
    assert (fit.n_ctx + 256) * 8 * model.kv_bytes_per_cell > budget - 200 * MIB  # and is not cut much more than needed
    assert any("must fit" in note for note in fit.notes)


def test_no_room_for_even_a_short_context_is_a_clear_error() -> None:
    memory = Memory(ram_available=int(1.5 * GIB), ram_total=2 * GIB)
    with pytest.raises(InvalidRequestError, match="not enough memory for the KV cache"):
        fit_model(shape(), memory, FitRequest(ctx_size=4096, num_slots=64))


def test_auto_offloads_the_layers_that_fit_in_free_gpu_memory() -> None:
    model = shape(kv_per_layer=1000)
    ctx, num_slots = 4096, 2
    per_layer = 100 * MIB + 1000 * ctx * num_slots  # weights + this layer's share of the KV cache
    reserve = 512 * MIB  # max(512 MiB, 5% of 8 GiB)
    memory = Memory(100 * GIB, 128 * GIB, gpu_free=reserve + 4 * per_layer + 150 * MIB, gpu_total=8 * GIB,
                    gpu_offload=True)  # fmt: skip
    fit = fit_model(model, memory, FitRequest(ctx_size=ctx, num_slots=num_slots))
    assert fit.n_gpu_layers == 4 and fit.num_gpu_layers == 4
    assert fit.kv_bytes_gpu == 4 * 1000 * ctx * num_slots
    assert fit.weight_bytes_ram == model.weight_bytes - 4 * 100 * MIB
    assert any("4 of 10 layers" in note for note in fit.notes)


def test_auto_offloads_everything_on_a_big_gpu() -> None:
    memory = Memory(100 * GIB, 128 * GIB, gpu_free=80 * GIB, gpu_total=80 * GIB, gpu_offload=True)
    fit = fit_model(shape(), memory, FitRequest(ctx_size=4096, num_slots=2))
    assert fit.n_gpu_layers == ALL_LAYERS and fit.num_gpu_layers == 10
    assert fit.kv_bytes_gpu == fit.kv_bytes and fit.weight_bytes_ram < 200 * MIB


def test_explicit_layers_and_device_cpu() -> None:
    memory = Memory(100 * GIB, 128 * GIB, gpu_free=80 * GIB, gpu_total=80 * GIB, gpu_offload=True)
    assert fit_model(shape(), memory, FitRequest(4096, 2, n_gpu_layers=3)).n_gpu_layers == 3
    assert fit_model(shape(), memory, FitRequest(4096, 2, n_gpu_layers=99)).n_gpu_layers == ALL_LAYERS
    assert fit_model(shape(), memory, FitRequest(4096, 2, n_gpu_layers=3, use_gpu=False)).n_gpu_layers == 0


def test_little_gpu_memory_shortens_the_context_of_offloaded_layers() -> None:
    memory = Memory(100 * GIB, 128 * GIB, gpu_free=2 * GIB, gpu_total=2 * GIB, gpu_offload=True)
    fit = fit_model(shape(kv_per_layer=10_000), memory, FitRequest(32768, 4, n_gpu_layers=-1))
    assert fit.n_gpu_layers == ALL_LAYERS
    assert fit.kv_bytes_gpu <= 2 * GIB - 10 * 100 * MIB - 512 * MIB and MIN_CTX <= fit.n_ctx < 32768
    assert any("GPU memory" in note for note in fit.notes)


# ---- this machine ----------------------------------------------------------------------


def test_probe_memory_reads_this_machine() -> None:
    import llama_cpp

    memory = probe_memory()
    assert 0 < memory.ram_available <= memory.ram_total == psutil.virtual_memory().total
    assert memory.gpu_offload == bool(llama_cpp.llama_supports_gpu_offload())
    if not memory.gpu_offload:
        assert (memory.gpu_free, memory.gpu_names) == (0, ())


def test_ggml_device_api_sees_the_cpu() -> None:
    devices = ggml_devices()
    cpu = [d for d in devices if d[1] == 0]  # GGML_BACKEND_DEVICE_TYPE_CPU
    assert cpu, devices
    _, _, free, total = cpu[0]
    assert total == pytest.approx(psutil.virtual_memory().total, rel=0.1) and 0 < free <= total
    assert ctypes.sizeof(ctypes.c_size_t) == 8
