"""The llama.cpp backend, driven directly with hand-built step batches."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import llguidance
import pytest

from localserve.backends.chat_template import ChatTemplate
from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
from localserve.engine.types import KvOp, SamplingParams, SeqChunk, StepPlan
from localserve.errors import DeviceNotFoundError, InvalidRequestError
from localserve.serving.grammar import grammar_for
from localserve.serving.types import OutputFormat

GREEDY = SamplingParams(temperature=0.0)


def chunk(
    seq_id: int, slot: int, tokens: list[int], start: int, sample: bool = True, params: SamplingParams = GREEDY
) -> SeqChunk:
    return SeqChunk(seq_id, slot, tuple(tokens), start, sample, params)


def step(
    backend: LlamaCppBackend, chunks: list[SeqChunk], kv_ops: tuple[KvOp, ...] = (), step_id: int = 0
) -> dict[int, int]:
    result = backend.execute(StepPlan(step_id, kv_ops, tuple(chunks)))
    assert not result.failed
    return {seq_id: s.token_id for seq_id, s in result.sampled.items()}


def greedy_continue(backend: LlamaCppBackend, prompt: list[int], n: int, slot: int = 0, seq_id: int = 0) -> list[int]:
    backend.clear_slots([slot])
    out = []
    token = step(backend, [chunk(seq_id, slot, prompt, 0)])[seq_id]
    pos = len(prompt)
    for _ in range(n - 1):
        out.append(token)
        token = step(backend, [chunk(seq_id, slot, [token], pos)])[seq_id]
        pos += 1
    out.append(token)
    backend.release([seq_id])
    return out


@pytest.fixture(scope="module")
def tiny(tiny_gguf_path: Path):
    backend = LlamaCppBackend(LlamaCppConfig(str(tiny_gguf_path), n_ctx=512, num_slots=4, step_tokens=256, n_threads=2))
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def smol(smollm2_path: Path):
    backend = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=1024, num_slots=4, step_tokens=512))
    yield backend
    backend.close()


def test_tiny_model_loads_with_its_capacity_and_template(tiny: LlamaCppBackend) -> None:
    cap = tiny.capacity()
    assert cap.num_slots == 4 and cap.step_tokens == 256
    assert cap.n_ctx == 512 and cap.kv_size >= 512
    tok = tiny.tokenizer()
    assert "<|im_start|>" in (tok.chat_template or "")
    assert tok.eog_token_ids, "the GGUF declares <|im_end|> as EOS"
    info = tiny.info()
    assert info.backend == "llamacpp" and info.device == "CPU"


def test_tokenizer_round_trips_unicode(tiny: LlamaCppBackend) -> None:
    tok = tiny.tokenizer()
    text = "café naïve 日本語 🙂 def add(a, b):"
    ids = tok.encode(text, add_special=False)
    assert ids and tok.decode(ids) == text
    special = tok.encode("<|im_start|>user", add_special=False, parse_special=True)
    assert tok.encode("<|im_start|>", add_special=False, parse_special=True)[0] == special[0]
    assert tok.token_bytes(special[0]) == b"", "special tokens add no output text"


def test_one_batch_mixes_prompt_chunks_and_decodes_like_separate_runs(tiny: LlamaCppBackend) -> None:
    tok = tiny.tokenizer()
    a = tok.encode("The quick brown fox", add_special=False)
    b = tok.encode("Paris is the capital of", add_special=False)
    alone_a = greedy_continue(tiny, a, 6, slot=0, seq_id=100)
    alone_b = greedy_continue(tiny, b, 6, slot=1, seq_id=101)
    tiny.clear_slots([0, 1])
    # a: whole prompt at once; b: its prompt in two chunks, the second one
    # in the same batch as a's first decode token.
    first = step(tiny, [chunk(1, 0, a, 0), chunk(2, 1, b[:3], 0, sample=False)])
    out_a, out_b = [first[1]], []
    second = step(tiny, [chunk(1, 0, [out_a[-1]], len(a)), chunk(2, 1, b[3:], 3)])
    out_a.append(second[1])
    out_b.append(second[2])
    for i in range(4):
        nxt = step(tiny, [chunk(1, 0, [out_a[-1]], len(a) + 1 + i), chunk(2, 1, [out_b[-1]], len(b) + i)])
        out_a.append(nxt[1])
        out_b.append(nxt[2])
    nxt = step(tiny, [chunk(2, 1, [out_b[-1]], len(b) + 4)])
    out_b.append(nxt[2])
    tiny.release([1, 2])
    assert out_a == alone_a
    assert out_b == alone_b


def test_sequences_in_one_batch_never_see_each_other(tiny: LlamaCppBackend) -> None:
    """The logits of one sequence do not depend on what another sequence in
    the same batch holds: exactly equal, not merely close."""
    import ctypes

    import llama_cpp
    import numpy as np

    tok = tiny.tokenizer()
    a = tok.encode("The quick brown fox jumps", add_special=False)
    others = [tok.encode(t, add_special=False) for t in ("Paris is the capital", "def add(a, b): return")]
    seen = []
    for other in others:
        tiny.clear_slots([0, 1])
        n = min(len(a), len(other))
        tiny.execute(StepPlan(0, (), (chunk(1, 0, a[:n], 0), chunk(2, 1, other[:n], 0))))
        tiny.release([1, 2])
        pointer = llama_cpp.llama_get_logits_ith(tiny._ctx, n - 1)
        seen.append(
            np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(tok.vocab_size,)).copy()
        )
    assert np.array_equal(seen[0], seen[1])


def test_copy_kv_op_reuses_a_prefix(tiny: LlamaCppBackend) -> None:
    tok = tiny.tokenizer()
    prompt = tok.encode("Hello world, this is a tiny model for tests.", add_special=False)
    expected = greedy_continue(tiny, prompt, 4, slot=2, seq_id=200)
    tiny.clear_slots([0, 2])
    step(tiny, [chunk(300, 0, prompt[:-1], 0, sample=False)])
    # slot 2 gets slot 0's prefix, then computes only the last prompt token
    got = [step(tiny, [chunk(201, 2, prompt[-1:], len(prompt) - 1)], (KvOp("copy", 2, len(prompt) - 1, src=0),))[201]]
    for i in range(3):
        got.append(step(tiny, [chunk(201, 2, [got[-1]], len(prompt) + i)])[201])
    tiny.release([201, 300])
    assert got == expected


def test_bad_grammar_fails_only_its_sequence(tiny: LlamaCppBackend) -> None:
    tok = tiny.tokenizer()
    prompt = tok.encode("The quick", add_special=False)
    tiny.clear_slots([0, 1])
    bad = SamplingParams(temperature=0.0, grammar="start: (((")
    with pytest.raises(InvalidRequestError):
        tiny.validate(bad)
    result = tiny.execute(StepPlan(0, (), (chunk(1, 0, prompt, 0), chunk(2, 1, prompt, 0, params=bad))))
    assert 1 in result.sampled and 2 in result.failed
    tiny.release([1, 2])


def test_gpu_device_on_a_cpu_build_is_a_clear_error(tiny_gguf_path: Path) -> None:
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python build has GPU offload")
    with pytest.raises(DeviceNotFoundError, match="present: cpu"):
        LlamaCppBackend(LlamaCppConfig(str(tiny_gguf_path), device="gpu"))


@pytest.mark.slow
def test_smollm2_knows_the_capital_of_france(smol: LlamaCppBackend) -> None:
    tok = smol.tokenizer()
    prompt = tok.encode("The capital of France is", add_special=False)
    text = tok.decode(greedy_continue(smol, prompt, 5))
    assert "Paris" in text


@pytest.mark.slow
def test_smollm2_chat_template_and_grammar_give_valid_json(smol: LlamaCppBackend) -> None:
    tok = smol.tokenizer()
    template = ChatTemplate(tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token)
    assert not template.is_default, "SmolLM2's GGUF carries its own template"
    text = template.render([{"role": "user", "content": "Give me a person as JSON."}])
    assert text.endswith("<|im_start|>assistant\n")
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    params = SamplingParams(temperature=0.0, grammar=grammar_for(OutputFormat("json_schema", schema)))
    prompt = tok.encode(text, add_special=False)
    smol.clear_slots([0])
    out: list[int] = []
    token = step(smol, [chunk(7, 0, prompt, 0, params=params)])[7]
    pos = len(prompt)
    while token not in tok.eog_token_ids and len(out) < 60:
        out.append(token)
        token = step(smol, [chunk(7, 0, [token], pos, params=params)])[7]
        pos += 1
    smol.release([7])
    value = json.loads(tok.decode(out))
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


@pytest.mark.slow
def test_smollm2_logprobs_are_a_distribution(smol: LlamaCppBackend) -> None:
    import math

    tok = smol.tokenizer()
    prompt = tok.encode("The capital of France is", add_special=False)
    smol.clear_slots([0])
    params = SamplingParams(temperature=0.0, logprobs=5)
    result = smol.execute(StepPlan(0, (), (chunk(9, 0, prompt, 0, params=params),)))
    smol.release([9])
    sampled = result.sampled[9]
    lp = sampled.logprob
    assert lp is not None and len(lp.top) == 5
    assert lp.top[0][0] == sampled.token_id, "greedy picks the most likely token"
    assert lp.logprob == pytest.approx(lp.top[0][1])
    assert all(a[1] >= b[1] for a, b in zip(lp.top, lp.top[1:], strict=False))
    assert 0 < sum(math.exp(v) for _, v in lp.top) <= 1.0 + 1e-6


def sample_run(
    backend: LlamaCppBackend, prompt: list[int], params: SamplingParams, n: int, seq_id: int = 11
) -> list[int]:
    """Up to `n` sampled tokens, stopping after an end-of-generation token."""
    eog = backend.tokenizer().eog_token_ids
    backend.clear_slots([0])
    out = [step(backend, [chunk(seq_id, 0, prompt, 0, params=params)])[seq_id]]
    while out[-1] not in eog and len(out) < n:
        out.append(step(backend, [chunk(seq_id, 0, [out[-1]], len(prompt) + len(out) - 1, params=params)])[seq_id])
    backend.release([seq_id])
    return out


@pytest.mark.slow
def test_min_tokens_and_ignore_eos_mask_end_of_generation(smol: LlamaCppBackend) -> None:
    tok = smol.tokenizer()
    template = ChatTemplate(tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token)
    prompt = tok.encode(
        template.render([{"role": "user", "content": "Reply with one word: yes or no?"}]), add_special=False
    )
    free = sample_run(smol, prompt, GREEDY, 40)
    assert free[-1] in tok.eog_token_ids and len(free) < 12, "the model ends a one-word answer by itself"
    held = sample_run(smol, prompt, SamplingParams(temperature=0.0, min_tokens=15), 40)
    assert not set(held[:15]) & tok.eog_token_ids and len(held) >= 16
    assert held[: len(free) - 1] == free[:-1], "masking changes nothing before the end"
    endless = sample_run(smol, prompt, SamplingParams(temperature=0.0, ignore_eos=True), 30)
    assert len(endless) == 30 and not set(endless) & tok.eog_token_ids


@pytest.mark.slow
def test_logit_bias_bans_and_forces_tokens(smol: LlamaCppBackend) -> None:
    tok = smol.tokenizer()
    prompt = tok.encode("The capital of France is", add_special=False)
    free = sample_run(smol, prompt, GREEDY, 1)[0]
    banned = sample_run(smol, prompt, SamplingParams(temperature=0.0, logit_bias=((free, float("-inf")),)), 1)[0]
    assert banned != free
    forced = tok.encode(" London", add_special=False)[0]
    pushed = sample_run(smol, prompt, SamplingParams(temperature=0.0, logit_bias=((forced, 100.0),)), 1)[0]
    assert pushed == forced


@pytest.mark.slow
def test_grammar_resamples_when_the_free_choice_is_rejected(smol: LlamaCppBackend) -> None:
    tok = smol.tokenizer()
    prompt = tok.encode("The capital of France is", add_special=False)
    assert "Paris" in tok.decode(sample_run(smol, prompt, GREEDY, 3)), "unconstrained, it says Paris"
    params = SamplingParams(temperature=0.0, grammar=llguidance.grammar_from("gbnf", 'root ::= " yes" | " no"'))
    out = sample_run(smol, prompt, params, 6)
    assert out[-1] in tok.eog_token_ids, "the grammar ends, so only end-of-generation is allowed"
    assert tok.decode(out[:-1]) in (" yes", " no")
    seeded = SamplingParams(
        temperature=1.0, seed=3, grammar=llguidance.grammar_from("gbnf", "root ::= [0-9] [0-9] [0-9]")
    )
    digits = tok.decode(sample_run(smol, prompt, seeded, 8)[:-1])
    assert len(digits) == 3 and digits.isdigit()


@pytest.mark.slow
def test_a_complete_grammar_ends_the_sequence_even_under_ignore_eos(smol: LlamaCppBackend) -> None:
    """Once the grammar allows nothing but the end, the sequence ends there,
    whatever `ignore_eos` or `min_tokens` say (issue 31: forced tool calls)."""
    tok = smol.tokenizer()
    prompt = tok.encode("Answer yes or no:", add_special=False)
    grammar = llguidance.grammar_from("gbnf", 'root ::= " yes" | " no"')
    for params in (
        SamplingParams(temperature=0.0, grammar=grammar, ignore_eos=True),
        SamplingParams(temperature=0.0, grammar=grammar, min_tokens=10),
    ):
        smol.clear_slots([0])
        result = smol.execute(StepPlan(0, (), (chunk(5, 0, prompt, 0, params=params),)))
        tokens, pos = [result.sampled[5]], len(prompt)
        while not tokens[-1].ends and len(tokens) < 10:
            result = smol.execute(StepPlan(0, (), (chunk(5, 0, [tokens[-1].token_id], pos, params=params),)))
            assert not result.failed, result.failed
            tokens.append(result.sampled[5])
            pos += 1
        smol.release([5])
        assert tokens[-1].ends and tokens[-1].token_id in tok.eog_token_ids
        assert tok.decode([t.token_id for t in tokens[:-1]]) in (" yes", " no")


def test_warm_up_runs_on_the_step_thread_never_the_loading_one(
    tiny_gguf_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libgomp keeps an OpenMP pool per thread that ever computed; a decode
    on the loading thread left a second pool that throttled every barrier of
    the step thread's (issue 39: one stream at 0.63x). Loading decodes
    nothing; the engine warms the model up on its step thread."""
    import asyncio
    import threading

    from localserve.backends.llamacpp import backend as module
    from localserve.engine.engine import Engine

    threads: list[str] = []
    real = module.warm_up

    def recording(*args: object) -> None:
        threads.append(threading.current_thread().name)
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(module, "warm_up", recording)
    backend = LlamaCppBackend(LlamaCppConfig(str(tiny_gguf_path), n_ctx=256, num_slots=2, step_tokens=64, n_threads=2))
    assert threads == [], "loading the model decoded on the loading thread"

    async def serve() -> None:
        engine = Engine()
        engine.add_model("tiny", backend)
        await engine.warmed_up("tiny")
        assert threads == ["step-tiny"]
        await engine.close()

    asyncio.run(serve())


def lockstep(
    backend: LlamaCppBackend, prompts: list[list[int]], params: list[SamplingParams], n: int
) -> list[list[int]]:
    """`n` tokens of each sequence, all sequences in every step's one batch (slot i for sequence i)."""
    backend.clear_slots(range(len(prompts)))
    outs: list[list[int]] = [[] for _ in prompts]
    chunks = [chunk(100 + i, i, p, 0, params=pp) for i, (p, pp) in enumerate(zip(prompts, params, strict=True))]
    for _ in range(n):
        got = step(backend, chunks)
        for i, out in enumerate(outs):
            out.append(got[100 + i])
        chunks = [
            chunk(100 + i, i, [out[-1]], len(prompts[i]) + len(out) - 1, params=params[i]) for i, out in enumerate(outs)
        ]
    backend.release([100 + i for i in range(len(prompts))])
    return outs


@pytest.mark.slow
def test_a_seed_gives_the_same_tokens_alone_or_among_eight(smollm2_path: Path) -> None:
    """Each sequence draws from its own generator: its tokens depend on its
    seed, never on its batchmates; greedy rows taken in one argmax match
    greedy alone."""
    backend = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=128, num_slots=8, step_tokens=256))
    try:
        tok = backend.tokenizer()
        texts = ["Once upon a time", "The weather today", "def fib(n):", "My favourite food", "In 1969,"]
        prompts = [tok.encode(t, add_special=False) for t in texts]
        seeded = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, seed=1234, ignore_eos=True)
        greedy = SamplingParams(temperature=0.0, ignore_eos=True)
        alone = lockstep(backend, [prompts[0]], [seeded], 16)[0]
        assert alone == lockstep(backend, [prompts[0]], [seeded], 16)[0], "the same seed, the same tokens"
        other_seed = dataclasses.replace(seeded, seed=99)
        assert alone != lockstep(backend, [prompts[0]], [other_seed], 16)[0], "another seed, other tokens"
        mates = [prompts[(i % 4) + 1] for i in range(7)]
        mixed = [dataclasses.replace(seeded, seed=7 + i) if i % 2 else greedy for i in range(7)]
        among = lockstep(backend, [*mates[:3], prompts[0], *mates[3:]], [*mixed[:3], seeded, *mixed[3:]], 16)
        assert among[3] == alone, "a seeded sequence's tokens do not depend on its batchmates"
        for i in (0, 2):  # the greedy batchmates, against greedy alone
            assert among[i] == lockstep(backend, [mates[i]], [greedy], 16)[0]
    finally:
        backend.close()


def test_the_thread_count_changes_between_steps_with_the_same_greedy_tokens(smollm2_path: Path) -> None:
    """`set_cpu_threads` (engine/threads.py's choice) changes llama.cpp's
    threads from the next decode: greedy output is the same token for token
    whether a stream runs on 2 threads, on 1, or switches every few steps."""
    backend = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=256, num_slots=2, step_tokens=128, n_threads=2))
    try:
        assert backend.cpu_threads() == 2
        prompt = backend.tokenizer().encode("The history of the printing press", add_special=False)
        on_two = greedy_continue(backend, prompt, 40)
        backend.set_cpu_threads(1)
        on_one = greedy_continue(backend, prompt, 40)
        backend.set_cpu_threads(2)
        backend.clear_slots([0])
        switching = [step(backend, [chunk(0, 0, prompt, 0)])[0]]
        for i in range(39):
            backend.set_cpu_threads(1 if (i // 3) % 2 else 2)
            switching.append(step(backend, [chunk(0, 0, [switching[-1]], len(prompt) + i)])[0])
        backend.release([0])
        assert on_one == on_two
        assert switching == on_two
    finally:
        backend.close()
