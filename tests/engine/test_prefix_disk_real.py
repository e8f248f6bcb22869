"""The disk tier on the real SmolLM2: llama.cpp's sequence state saved when a
slot is reused and at unload, restored after a restart, and the greedy answer
the same as computed from scratch."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.types import GenerateRequest, SamplingParams, TokenEvent

pytestmark = pytest.mark.slow
_ids = itertools.count()

DOCUMENT = " ".join(
    f"Section {i}: the lighthouse keeper wrote in his log that the sea was calm, the lamp was clean, "
    f"and ship number {i * 7} passed to the north at dawn."
    for i in range(30)
)


def open_backend(path: Path) -> LlamaCppBackend:
    return LlamaCppBackend(LlamaCppConfig(str(path), n_ctx=2048, num_slots=1, step_tokens=512))


async def answer(engine: Engine, ids: list[int]) -> tuple[list[int], TokenEvent]:
    request = GenerateRequest(f"d{next(_ids)}", ids, SamplingParams(max_tokens=12, temperature=0.0))
    events = [e async for e in engine.submit("smol", request)]
    return [t for e in events for t in e.token_ids], events[-1]


async def test_a_prefix_survives_slot_reuse_and_a_restart(smollm2_path: Path, tmp_path: Path) -> None:
    config = EngineConfig(prefix_disk=tmp_path / "prefix-cache", prefix_disk_bytes=1 << 30)
    backend = open_backend(smollm2_path)
    tok = backend.tokenizer()
    question = tok.encode(DOCUMENT + "\nQuestion: what did the keeper clean? Answer:", add_special=False)
    other = tok.encode("A different text entirely, about mountains and rivers. " * 40, add_special=False)
    second = tok.encode(DOCUMENT + "\nQuestion: who wrote the log? Answer:", add_special=False)
    shared = next(i for i, (a, b) in enumerate(zip(question, second, strict=False)) if a != b)
    assert len(question) > 600 and shared % 256 > 8  # the questions part mid-block

    plain = Engine(EngineConfig())
    plain.add_model("smol", backend)
    from_scratch, _ = await answer(plain, question)
    second_from_scratch, _ = await answer(plain, second)  # (the document from the slot: exact reuse)
    await plain.unload_model("smol", close_backend=False)
    backend.clear_slots([0])

    engine = Engine(config)
    engine.add_model("smol", backend)
    await answer(engine, question)
    await answer(engine, other)  # takes the one slot: the question's whole blocks go to disk
    again, last = await answer(engine, question)
    assert again == from_scratch
    assert last.num_cached_tokens == len(question) - 1  # all but the token that gives the logits
    disk = engine.stats()["smol"].scheduler.disk
    assert disk is not None and disk.num_hits == 1 and disk.bytes_written > 0
    await engine.unload_model("smol")  # unload: what the slot holds is saved too

    restarted = Engine(config)
    restarted.add_model("smol", open_backend(smollm2_path))
    after_restart, last = await answer(restarted, second)
    assert after_restart == second_from_scratch  # restored past the last whole block, then trimmed to the shared part
    assert last.num_cached_tokens == shared and restarted.stats()["smol"].scheduler.disk.num_hits == 1  # type: ignore[union-attr]
    await restarted.unload_model("smol")
