"""Tests every explicit-KV decoder backend (ONNX Runtime, OpenVINO) must
pass, on SmolLM2 exported from the shipped GGUF. A test module imports these
and defines the `decoder` fixture (a module-scoped backend, 4 slots) and
`decoder_folder` (the exported folder the server loads).

Slow: each needs the real model (the export itself is cached across runs).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from localserve.backends.kv_decoder import KvDecoderBackend
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.step.scheduler import SchedulerConfig
from localserve.engine.types import FinishReason, GenerateRequest, KvOp, SamplingParams, SeqChunk, StepPlan, TokenEvent
from localserve.errors import InvalidRequestError
from localserve.serving.grammar import grammar_for
from localserve.serving.types import OutputFormat

GREEDY = SamplingParams(temperature=0.0)
REFERENCE_PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
REFERENCE_TOKENS = 12
# Confident continuations: a batch of 8 may round differently from a batch
# of 1 (different kernel blocking), which would flip only near-ties.
CONCURRENT_PROMPTS = [
    "1, 2, 3, 4, 5,",
    "Monday, Tuesday, Wednesday,",
    "January, February, March,",
    "a, b, c, d, e,",
    "10, 20, 30, 40,",
    "one, two, three, four,",
    "2, 4, 6, 8, 10,",
    "Sunday, Monday, Tuesday,",
]
_ids = itertools.count()


def chunk(seq_id: int, slot: int, tokens: list[int], start: int, sample: bool = True, params=GREEDY) -> SeqChunk:  # type: ignore[no-untyped-def]
    return SeqChunk(seq_id, slot, tuple(tokens), start, sample, params)


def step(backend: KvDecoderBackend, chunks: list[SeqChunk], kv_ops: tuple[KvOp, ...] = ()) -> dict[int, int]:
    result = backend.execute(StepPlan(0, kv_ops, tuple(chunks)))
    assert not result.failed
    return {seq_id: s.token_id for seq_id, s in result.sampled.items()}


def greedy_alone(backend: KvDecoderBackend, prompt: list[int], n: int, slot: int = 0, seq_id: int = 0) -> list[int]:
    backend.clear_slots([slot])
    token = step(backend, [chunk(seq_id, slot, prompt, 0)])[seq_id]
    out, pos = [token], len(prompt)
    for _ in range(n - 1):
        token = step(backend, [chunk(seq_id, slot, [token], pos)])[seq_id]
        out.append(token)
        pos += 1
    backend.release([seq_id])
    return out


def encode(backend: KvDecoderBackend, text: str) -> list[int]:
    return backend.tokenizer().encode(text, add_special=False)


# ---- the backend, step by step ----------------------------------------------------


@pytest.mark.slow
def test_capital_of_france_is_paris(decoder: KvDecoderBackend) -> None:
    out = greedy_alone(decoder, encode(decoder, "The capital of France is"), 4)
    assert "Paris" in decoder.tokenizer().decode(out)


@pytest.mark.slow
def test_greedy_tokens_match_the_pytorch_reference(
    decoder: KvDecoderBackend, smollm2_path: Path, exported_smollm2: dict[str, Path]
) -> None:
    from tests.fixtures.export_smollm2 import reference_greedy

    expected = reference_greedy(smollm2_path, exported_smollm2["onnx"], REFERENCE_PROMPTS, REFERENCE_TOKENS)
    got = [greedy_alone(decoder, encode(decoder, p), REFERENCE_TOKENS) for p in REFERENCE_PROMPTS]
    assert got == expected


@pytest.mark.slow
def test_mixed_batch_equals_each_sequence_alone(decoder: KvDecoderBackend) -> None:
    """Two prompts of different lengths: one whole, one in two chunks, the
    second chunk in the same step as the first one's decode tokens; then
    batched decode with different past lengths (padded) in one call."""
    a, b = encode(decoder, "The quick brown fox jumps over"), encode(decoder, "Paris is the capital of")
    alone_a, alone_b = greedy_alone(decoder, a, 6, slot=0), greedy_alone(decoder, b, 6, slot=1)
    decoder.clear_slots([0, 1])
    first = step(decoder, [chunk(1, 0, a, 0), chunk(2, 1, b[:2], 0, sample=False)])
    out_a = [first[1]]
    second = step(decoder, [chunk(1, 0, out_a[-1:], len(a)), chunk(2, 1, b[2:], 2)])
    out_a.append(second[1])
    out_b = [second[2]]
    calls_before = decoder.num_calls
    for i in range(4):
        nxt = step(decoder, [chunk(1, 0, out_a[-1:], len(a) + 1 + i), chunk(2, 1, out_b[-1:], len(b) + i)])
        out_a.append(nxt[1])
        out_b.append(nxt[2])
    assert decoder.num_calls - calls_before == 4, "decode tokens of both sequences share one call per step"
    out_b.append(step(decoder, [chunk(2, 1, out_b[-1:], len(b) + 4)])[2])
    decoder.release([1, 2])
    assert out_a == alone_a
    assert out_b == alone_b


@pytest.mark.slow
def test_padding_does_not_change_a_sequence_logits(decoder: KvDecoderBackend) -> None:
    """A row's logits are (numerically) the same whatever other rows of its
    call hold and however far its past is padded."""
    a = encode(decoder, "The quick brown fox jumps over")
    seen = []
    for other in ("Hi", "A much longer prompt that forces padding of the past for the first row"):
        decoder.clear_slots([0, 1])
        other_ids = encode(decoder, other)
        decoder.execute(StepPlan(0, (), (chunk(1, 0, a[:-1], 0, sample=False),)))
        decoder.execute(StepPlan(0, (), (chunk(2, 1, other_ids, 0, sample=False),)))
        params = SamplingParams(temperature=0.0, logprobs=5)
        result = decoder.execute(
            StepPlan(0, (), (chunk(1, 0, a[-1:], len(a) - 1, params=params), chunk(2, 1, [13], len(other_ids))))
        )
        decoder.release([1, 2])
        seen.append(result.sampled[1].logprob)
    assert seen[0].token_id == seen[1].token_id
    np.testing.assert_allclose([v for _, v in seen[0].top], [v for _, v in seen[1].top], atol=1e-3)


@pytest.mark.slow
def test_copy_kv_op_reuses_a_prefix(decoder: KvDecoderBackend) -> None:
    prompt = encode(decoder, "Hello world, this is a small model running in a test.")
    expected = greedy_alone(decoder, prompt, 4, slot=2)
    decoder.clear_slots([0, 2])
    step(decoder, [chunk(300, 0, prompt[:-1], 0, sample=False)])
    copy = (KvOp("copy", 2, len(prompt) - 1, src=0),)
    got = [step(decoder, [chunk(201, 2, prompt[-1:], len(prompt) - 1)], copy)[201]]
    assert decoder.slot_num_tokens(2) == len(prompt)
    for i in range(3):
        got.append(step(decoder, [chunk(201, 2, got[-1:], len(prompt) + i)])[201])
    step(decoder, [], (KvOp("keep", 2, 3),))
    assert decoder.slot_num_tokens(2) == 3
    decoder.release([201, 300])
    assert got == expected


@pytest.mark.slow
def test_logprobs_are_a_distribution(decoder: KvDecoderBackend) -> None:
    prompt = encode(decoder, "The capital of France is")
    decoder.clear_slots([0])
    result = decoder.execute(
        StepPlan(0, (), (chunk(9, 0, prompt, 0, params=SamplingParams(temperature=0.0, logprobs=5)),))
    )
    decoder.release([9])
    sampled = result.sampled[9]
    lp = sampled.logprob
    assert lp is not None and len(lp.top) == 5 and lp.top[0][0] == sampled.token_id
    assert lp.logprob == pytest.approx(lp.top[0][1])
    assert 0 < sum(math.exp(v) for _, v in lp.top) <= 1.0 + 1e-6


@pytest.mark.slow
def test_grammar_constrains_the_output(decoder: KvDecoderBackend) -> None:
    """The same grammar engine as llama.cpp's (backends/constraints.py), in
    numpy: a JSON schema gives JSON that matches it; a bad grammar fails only
    its own sequence."""
    bad = SamplingParams(temperature=0.0, grammar="start: (((")
    with pytest.raises(InvalidRequestError):
        decoder.validate(bad)
    tok = decoder.tokenizer()
    prompt = encode(decoder, "<|im_start|>user\nGive me a person as JSON.<|im_end|>\n<|im_start|>assistant\n")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    params = SamplingParams(temperature=0.0, grammar=grammar_for(OutputFormat("json_schema", schema)))
    decoder.validate(params)
    decoder.clear_slots([0, 1])
    result = decoder.execute(
        StepPlan(0, (), (chunk(1, 0, prompt, 0, params=params), chunk(2, 1, prompt, 0, params=bad)))
    )
    assert 2 in result.failed and 1 in result.sampled
    out, pos = [result.sampled[1].token_id], len(prompt)
    while out[-1] not in tok.eog_token_ids and len(out) < 60:
        out.append(step(decoder, [chunk(1, 0, [out[-1]], pos, params=params)])[1])
        pos += 1
    decoder.release([1, 2])
    value = json.loads(tok.decode(out[:-1]))
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


@pytest.mark.slow
def test_exported_tokenizer_matches_llama_cpp(decoder: KvDecoderBackend, smollm2_path: Path) -> None:
    from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig

    llama = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=256, num_slots=1))
    try:
        ours, theirs = decoder.tokenizer(), llama.tokenizer()
        for text in ("café 日本語 🙂 x=12345;\n\tdef f(): pass", "<|im_start|>user\nHi<|im_end|>\n"):
            for special in (True, False):
                ids = ours.encode(text, add_special=True, parse_special=special)
                assert ids == theirs.encode(text, add_special=True, parse_special=special)
            assert ours.decode(ours.encode(text, parse_special=False)) == text
        assert ours.eog_token_ids <= theirs.eog_token_ids and theirs.eos_token_id in ours.eog_token_ids
        assert ours.chat_template == theirs.chat_template
    finally:
        llama.close()


# ---- through the real engine and scheduler ------------------------------------------


async def _run(engine: Engine, model: str, req: GenerateRequest) -> tuple[list[int], list[TokenEvent]]:
    events = [e async for e in engine.submit(model, req)]
    return [t for e in events for t in e.token_ids], events


def _request(tokens: list[int], priority: float = 1.0, **sampling) -> GenerateRequest:  # type: ignore[no-untyped-def]
    return GenerateRequest(f"kv{next(_ids)}", tokens, SamplingParams(**sampling), priority=priority)


@pytest.mark.slow
async def test_concurrent_requests_equal_their_run_alone_results(decoder: KvDecoderBackend) -> None:
    engine = Engine(EngineConfig())
    engine.add_model("m", decoder)
    try:
        prompts = [encode(decoder, p) for p in CONCURRENT_PROMPTS[:6]]  # 4 slots: 2 wait, then join
        params = dict(max_tokens=6, temperature=0.0, ignore_eos=True)
        alone = [(await _run(engine, "m", _request(p, **params)))[0] for p in prompts]
        together = await asyncio.gather(*(_run(engine, "m", _request(p, **params)) for p in prompts))
        assert [t[0] for t in together] == alone
        sizes = engine.stats()["m"].recent_batch_sizes
        assert max(sizes) >= decoder.capacity().num_slots, f"requests were not batched: {sizes}"
    finally:
        await engine.unload_model("m", close_backend=False)


@pytest.mark.slow
async def test_seeded_sampling_is_reproducible(decoder: KvDecoderBackend) -> None:
    engine = Engine(EngineConfig())
    engine.add_model("m", decoder)
    try:
        prompt = encode(decoder, "Once upon a time")
        params = dict(max_tokens=8, temperature=1.0, top_k=40, top_p=0.95, min_p=0.02, seed=1234, ignore_eos=True)
        first, second = [(await _run(engine, "m", _request(prompt, **params)))[0] for _ in range(2)]
        assert first == second
        others = [(await _run(engine, "m", _request(prompt, **{**params, "seed": s})))[0] for s in (1, 2)]
        assert any(o != first for o in others)
    finally:
        await engine.unload_model("m", close_backend=False)


@pytest.mark.slow
async def test_priority_preempts_and_the_preempted_request_resumes_unchanged(decoder: KvDecoderBackend) -> None:
    """Every slot held by a `batch` request; an `interactive` one preempts one
    of them, finishes first, and the preempted one resumes (recomputing its
    KV) with exactly the tokens it would have produced alone."""
    engine = Engine(EngineConfig(scheduler=SchedulerConfig(aging_s=30.0)))
    engine.add_model("p", decoder)
    try:
        params = dict(max_tokens=10, temperature=0.0, ignore_eos=True)
        slow = [encode(decoder, p) for p in CONCURRENT_PROMPTS[: decoder.capacity().num_slots]]
        alone = [(await _run(engine, "p", _request(p, priority=2.0, **params)))[0] for p in slow]
        order: list[str] = []

        async def tracked(name: str, req: GenerateRequest) -> list[int]:
            tokens, _ = await _run(engine, "p", req)
            order.append(name)
            return tokens

        batch = [
            asyncio.create_task(tracked(f"batch{i}", _request(p, priority=2.0, **params))) for i, p in enumerate(slow)
        ]
        while sum(engine.stats()["p"].scheduler.running_by_class.values()) < len(slow):
            await asyncio.sleep(0.005)
        urgent = _request(encode(decoder, "The capital of France is"), priority=0.0, max_tokens=3, temperature=0.0)
        urgent_tokens = await tracked("urgent", urgent)
        results = await asyncio.gather(*batch)
        assert order[0] == "urgent", order
        assert "Paris" in decoder.tokenizer().decode(urgent_tokens)
        assert engine.stats()["p"].scheduler.num_preemptions >= 1
        assert results == alone
    finally:
        await engine.unload_model("p", close_backend=False)


@pytest.mark.slow
async def test_abort_frees_a_slot_at_the_next_step(decoder: KvDecoderBackend) -> None:
    engine = Engine(EngineConfig())
    engine.add_model("a", decoder)
    try:
        params = dict(max_tokens=400, temperature=0.0, ignore_eos=True)
        longs = [_request(encode(decoder, f"Tell me story number {i}."), **params) for i in range(4)]
        streams = [aiter(engine.submit("a", r)) for r in longs]
        for it in streams:
            await anext(it)  # all slots busy
        waiter = asyncio.create_task(_run(engine, "a", _request(encode(decoder, "Hi"), max_tokens=2, temperature=0.0)))
        await asyncio.sleep(0.3)
        assert not waiter.done(), "every slot is busy"
        assert engine.abort(longs[0].request_id)
        events = [e async for e in streams[0]]
        assert events[-1].finish_reason is FinishReason.ABORT
        _, done = await asyncio.wait_for(waiter, timeout=60)
        assert done[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        for r in longs[1:]:
            engine.abort(r.request_id)
    finally:
        await engine.unload_model("a", close_backend=False)


@pytest.mark.slow
def test_http_chat_answers_paris(decoder_folder: Path) -> None:
    """Through the whole server: `--model ID=FOLDER` picks this backend."""
    import openai

    from tests.api.harness import ServerThread, make_settings

    server = ServerThread(make_settings(models=[f"smol={decoder_folder}"], parallel=2, ctx_size=512, kv_size=1024))
    server.start()
    try:
        server.wait_healthy(timeout=180)
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="smol",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16,
            temperature=0.0,
        )
        assert "Paris" in (reply.choices[0].message.content or "")
        assert reply.choices[0].finish_reason in ("stop", "length")
        models = client.models.list()
        assert [m.id for m in models.data] == ["smol"]
        _structured_output_and_tools(client)
    finally:
        server.stop()


def _structured_output_and_tools(client: Any) -> None:
    """The same surface as on llama.cpp (issue 31): a strict JSON schema,
    JSON mode, a forced tool call that ends when the call closes, and auto."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"],
    }
    ask = [{"role": "user", "content": "Name a city and its country."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}
    reply = client.chat.completions.create(
        model="smol", messages=ask, max_tokens=60, temperature=0.0, response_format=fmt
    )
    value = json.loads(reply.choices[0].message.content)
    assert set(value) == {"city", "country"} and reply.choices[0].finish_reason == "stop"
    example = [{"role": "user", "content": 'Reply with JSON like {"city": "Rome", "country": "Italy"} for France.'}]
    reply = client.chat.completions.create(
        model="smol", messages=example, max_tokens=100, temperature=0.0, response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    forced = {"type": "function", "function": {"name": "get_weather"}}
    reply = client.chat.completions.create(
        model="smol",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        max_tokens=80,
        temperature=0.0,
        tools=[weather],
        tool_choice=forced,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and reply.usage.completion_tokens < 80
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    _required_tool_is_never_repeated(client)


def _required_tool_is_never_repeated(client: Any) -> None:
    """Issue 44's repro: `required` with parallel calls allowed. SmolLM2 starts
    the same call again; the answer ends there with one call, whole and streamed."""
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            },
        },
    }
    body: dict[str, Any] = {
        "model": "smol",
        "messages": [{"role": "user", "content": "What is the weather in Paris? Use celsius."}],
        "max_tokens": 96,
        "temperature": 0.0,
        "tools": [tool],
        "tool_choice": "required",
    }
    reply = client.chat.completions.create(**body)
    assert reply.choices[0].finish_reason == "tool_calls"
    assert len(reply.choices[0].message.tool_calls) == 1
    chunks = list(client.chat.completions.create(stream=True, **body))
    indexes = {call.index for chunk in chunks if chunk.choices for call in chunk.choices[0].delta.tool_calls or ()}
    assert indexes == {0}
    reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert reasons == ["tool_calls"]
