"""KV cache element types and flash attention: memory accounting and real loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from localserve.backends.kv_types import SCORES_CAP_BYTES, check_kv_types, kv_bytes_scale, resolve_flash_attn
from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
from localserve.config import ServerSettings
from localserve.errors import InvalidRequestError
from localserve.models.catalog import ModelOptions
from localserve.models.plan import plan_llamacpp
from tests.backends.test_llamacpp import greedy_continue


def test_quantized_types_scale_the_kv_bytes() -> None:
    assert kv_bytes_scale("f16", "f16") == 1.0
    assert kv_bytes_scale("q8_0", "q8_0") == pytest.approx(34 / 64)
    assert kv_bytes_scale("q4_0", "q4_0") == pytest.approx(18 / 64)
    assert kv_bytes_scale("q8_0", "f16") == pytest.approx((34 / 32 + 2) / 4)


def test_a_quantized_v_cache_without_flash_attention_is_refused() -> None:
    check_kv_types("q8_0", "q8_0", "auto")
    check_kv_types("q8_0", "f16", "off")
    with pytest.raises(ValueError, match="needs flash attention"):
        check_kv_types("f16", "q4_0", "off")
    with pytest.raises(ValueError, match="unknown KV cache type"):
        check_kv_types("q3_k", "f16", "auto")


def test_auto_flash_attention_is_off_on_the_cpu_where_it_can_be() -> None:
    small = 512 * 1024 * 9 * 4  # SmolLM2's scores for one micro-batch of 512 over 1024 cells
    cpu = {"on_cpu": True, "own_cells": True}
    assert resolve_flash_attn("auto", **cpu, type_v="f16", scores_bytes=small) == "off"
    assert resolve_flash_attn("auto", on_cpu=False, own_cells=True, type_v="f16", scores_bytes=small) == "auto"  # GPU
    assert resolve_flash_attn("auto", on_cpu=True, own_cells=False, type_v="f16", scores_bytes=small) == "auto"  # pool
    assert resolve_flash_attn("auto", **cpu, type_v="q8_0", scores_bytes=small) == "auto"  # needed
    assert resolve_flash_attn("auto", **cpu, type_v="f16", scores_bytes=SCORES_CAP_BYTES + 1) == "auto"
    for given in ("on", "off"):  # the user's word wins
        assert resolve_flash_attn(given, **cpu, type_v="f16", scores_bytes=small) == given
        assert resolve_flash_attn(given, on_cpu=False, own_cells=False, type_v="f16", scores_bytes=small) == given


@pytest.mark.parametrize(("mode", "kv_size", "resolved"), [("auto", 0, "off"), ("on", 0, "on"), ("auto", 256, "auto")])
def test_a_cpu_model_resolves_flash_attention_and_answers(
    smollm2_path: Path, mode: str, kv_size: int, resolved: str
) -> None:
    """The real load: on the CPU `auto` opens a context of a KV stream per
    slot without flash attention, one pool the slots share with llama.cpp's
    auto; the saved-KV identity names what was opened (a V cache laid out for
    one is not restored into the other), the capacity says whether each
    slot is a KV stream (what slot packing and draft pricing follow), and
    greedy text is right."""
    config = LlamaCppConfig(
        str(smollm2_path), n_ctx=256, num_slots=2, kv_size=kv_size, step_tokens=256, n_threads=2, flash_attn=mode
    )
    backend = LlamaCppBackend(config)
    try:
        assert backend._flash_attn == resolved
        assert backend.capacity().slot_streams == (kv_size == 0)  # 256 cells for 2 slots of 256: one pool
        assert f"|fa={resolved}|" in (backend.kv_state_identity() or "")
        tok = backend.tokenizer()
        text = tok.decode(greedy_continue(backend, tok.encode("The capital of France is", add_special=False), 5))
        assert "Paris" in text
    finally:
        backend.close()


def test_the_plan_accounts_for_the_cache_type(smollm2_path: Path) -> None:
    def kv_bytes(**options: str) -> int:
        settings = ServerSettings(ctx_size=1024, parallel=4)
        return plan_llamacpp("smollm2-135m-instruct", smollm2_path, settings, ModelOptions(**options)).fit.kv_bytes

    f16 = kv_bytes()
    assert kv_bytes(cache_type_k="q8_0", cache_type_v="q8_0") == pytest.approx(f16 * 34 / 64, rel=0.01)
    assert kv_bytes(cache_type_k="q4_0", cache_type_v="q4_0", flash_attn="on") == pytest.approx(f16 * 18 / 64, rel=0.01)
    with pytest.raises(InvalidRequestError, match="needs flash attention"):
        kv_bytes(cache_type_v="q4_0", flash_attn="off")


@pytest.mark.slow
@pytest.mark.parametrize("cache_type", ["q8_0", "q4_0"])
def test_smollm2_answers_with_a_quantized_kv_cache(smollm2_path: Path, cache_type: str) -> None:
    config = LlamaCppConfig(
        str(smollm2_path), n_ctx=256, num_slots=2, step_tokens=256, n_threads=2,
        cache_type_k=cache_type, cache_type_v=cache_type, flash_attn="on",
    )  # fmt: skip
    backend = LlamaCppBackend(config)
    try:
        tok = backend.tokenizer()
        text = tok.decode(greedy_continue(backend, tok.encode("The capital of France is", add_special=False), 5))
        assert "Paris" in text
    finally:
        backend.close()


def test_by_default_the_slots_share_one_context_of_kv_like_llama_server(smollm2_path: Path) -> None:
    def fit(**settings: int):  # type: ignore[no-untyped-def]
        return plan_llamacpp("smollm2-135m-instruct", smollm2_path, ServerSettings(**settings), ModelOptions()).fit

    default = fit()
    assert default.shared_pool and default.kv_size == default.n_ctx  # 8 slots share 8192 cells, not 8 x 8192
    streams = fit(ctx_size=1024, parallel=16)  # a context per slot asked for: a stream each
    assert not streams.shared_pool and streams.kv_size == 16 * 1024
    assert not fit(kv_size=0).shared_pool  # kv_size 0 asked for: ctx x parallel
