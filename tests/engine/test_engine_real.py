"""The whole engine (scheduler + step thread + llama.cpp) on real SmolLM2."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
from localserve.engine.engine import Engine, EngineConfig
from localserve.engine.step.faults import FaultInjectingBackend, WrappedBackend
from localserve.engine.types import FinishReason, GenerateRequest, SamplingParams, StepPlan, StepResult, TokenEvent

pytestmark = pytest.mark.slow
_ids = itertools.count()


@pytest.fixture(scope="module")
def backend(smollm2_path: Path):
    b = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=1024, num_slots=16, kv_size=8192, step_tokens=512))
    yield b
    b.close()


@pytest.fixture
async def engine(backend: LlamaCppBackend):
    """SmolLM2 through a `FaultInjectingBackend`, which computes every step until armed."""
    eng = Engine(EngineConfig())
    eng.add_model("smol", FaultInjectingBackend(backend))
    yield eng
    await eng.unload_model("smol", close_backend=False)


def request(tokens: list[int], **sampling) -> GenerateRequest:  # type: ignore[no-untyped-def]
    return GenerateRequest(f"t{next(_ids)}", tokens, SamplingParams(**sampling))


async def run(engine: Engine, req: GenerateRequest) -> tuple[list[int], str, TokenEvent]:
    tokens: list[int] = []
    text = ""
    last = None
    async for event in engine.submit("smol", req):
        tokens.extend(event.token_ids)
        text += event.text
        last = event
    assert last is not None and last.finished
    return tokens, text, last


def encode(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer("smol").encode(text, add_special=False)


async def test_capital_of_france_is_paris(engine: Engine) -> None:
    _, text, last = await run(
        engine, request(encode(engine, "The capital of France is"), max_tokens=6, temperature=0.0)
    )
    assert "Paris" in text
    assert last.finish_reason is FinishReason.LENGTH and last.num_output_tokens == 6


# llama.cpp's CPU kernels are not batch-invariant: a 1-token and a 16-token
# step round differently (logits differ by up to ~1), which flips near-ties.
# So these prompts have confident continuations; that the batch itself never
# mixes sequences is proven exactly, at the logit level, in the backend tests.
SIXTEEN_PROMPTS = [
    "1, 2, 3, 4, 5,",
    "Monday, Tuesday, Wednesday,",
    "January, February, March,",
    "a, b, c, d, e,",
    "10, 20, 30, 40,",
    "one, two, three, four,",
    "2, 4, 6, 8, 10,",
    "A B C D E F",
    "100, 200, 300, 400,",
    "Sunday, Monday, Tuesday,",
    "5, 10, 15, 20,",
    "alpha, beta, gamma, delta,",
    "first, second, third, fourth,",
    "1 2 3 4 5 6",
    "Mercury, Venus, Earth, Mars,",
    "3, 6, 9, 12,",
]


async def test_sixteen_concurrent_match_running_alone(engine: Engine) -> None:
    prompts = SIXTEEN_PROMPTS
    alone = [
        (await run(engine, request(encode(engine, p), max_tokens=16, temperature=0.0, ignore_eos=True)))[0]
        for p in prompts
    ]
    together = await asyncio.gather(
        *(run(engine, request(encode(engine, p), max_tokens=16, temperature=0.0, ignore_eos=True)) for p in prompts)
    )
    # Batched, a near-tie late in a sequence may round the other way (see above);
    # a batch that mixed sequences would change them from their first tokens.
    for (tokens, _text, _last), solo, prompt in zip(together, alone, prompts, strict=True):
        assert tokens[:8] == solo[:8], f"{prompt!r}: batched {tokens} != alone {solo}"
    assert sum(t[0] == solo for t, solo in zip(together, alone, strict=True)) >= 13
    sizes = engine.stats()["smol"].recent_batch_sizes
    assert max(sizes) >= 8, f"requests were not batched together: {sizes}"


async def test_seeded_sampling_is_reproducible(engine: Engine) -> None:
    prompt = encode(engine, "Once upon a time")
    params = dict(max_tokens=24, temperature=1.0, top_k=40, top_p=0.95, seed=1234, ignore_eos=True)
    # Once first, so both measured runs find the prompt in the prefix cache and
    # compute the same way (llama.cpp rounds a whole prompt and its last token
    # alone slightly differently, enough to flip a sample at temperature 1).
    await run(engine, request(prompt, **params))
    first, second = [await run(engine, request(prompt, **params)) for _ in range(2)]
    assert first[0] == second[0]
    others = [await run(engine, request(prompt, **{**params, "seed": s})) for s in (1, 2, 3)]
    assert any(o[0] != first[0] for o in others), "different seeds should give different samples"


async def test_stop_string_ends_the_text_before_it(engine: Engine) -> None:
    _, text, last = await run(
        engine, request(encode(engine, "Count: 1, 2, 3,"), max_tokens=30, temperature=0.0, stop=(" 6",))
    )
    assert last.finish_reason is FinishReason.STOP
    assert " 6" not in text and "5" in text


async def test_abort_frees_the_slot_at_the_next_step(backend: LlamaCppBackend, smollm2_path: Path) -> None:
    eng = Engine(EngineConfig())
    small = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=512, num_slots=1, step_tokens=256))
    eng.add_model("one", small)
    tok = small.tokenizer()
    long_req = GenerateRequest(
        "long",
        tok.encode("Tell me a story.", add_special=False),
        SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True),
    )
    stream = eng.submit("one", long_req)
    it = aiter(stream)
    await anext(it)  # running and holding the only slot
    waiting = GenerateRequest(
        "next", tok.encode("Hi", add_special=False), SamplingParams(max_tokens=2, temperature=0.0)
    )
    waiter = asyncio.create_task(_collect(eng.submit("one", waiting)))
    await asyncio.sleep(0.3)
    assert not waiter.done(), "the only slot is busy"
    assert eng.abort("long")
    events = [e async for e in it]
    assert events[-1].finish_reason is FinishReason.ABORT
    done = await asyncio.wait_for(waiter, timeout=10)
    assert done[-1].finish_reason is FinishReason.LENGTH
    await asyncio.sleep(0.2)
    assert eng.stats()["one"].in_flight == 0
    await eng.close()


async def _collect(stream) -> list[TokenEvent]:  # type: ignore[no-untyped-def]
    return [e async for e in stream]


async def test_shared_system_prompt_hits_the_prefix_cache(engine: Engine) -> None:
    system = "You are a helpful assistant for the city library. " * 12
    first = encode(engine, system + "User: opening hours? Assistant:")
    _, _, a = await run(engine, request(first, max_tokens=4, temperature=0.0))
    second = encode(engine, system + "User: where is the cafe? Assistant:")
    _, _, b = await run(engine, request(second, max_tokens=4, temperature=0.0))
    assert a.num_cached_tokens == 0 or a.num_cached_tokens < len(first) // 2
    assert b.num_cached_tokens >= len(encode(engine, system)) - 2
    assert engine.stats()["smol"].scheduler.num_cached_tokens > 0


async def test_a_step_failure_fails_only_that_step(engine: Engine) -> None:
    prompt = encode(engine, "The capital of France is")
    faults = engine.backend("smol")
    assert isinstance(faults, FaultInjectingBackend)
    faults.fail_steps(1)
    _, _, failed = await run(engine, request(prompt, max_tokens=4, temperature=0.0))
    assert failed.finish_reason is FinishReason.ERROR and "injected fault" in (failed.error or "")
    _, text, ok = await run(engine, request(prompt, max_tokens=6, temperature=0.0))  # the fault was spent
    assert ok.finish_reason is FinishReason.LENGTH and "Paris" in text


class RecordedBackend(WrappedBackend):
    """Calls `record(batch)` on the step thread before each step."""

    def __init__(self, inner: LlamaCppBackend, record: Callable[[StepPlan], None]) -> None:
        super().__init__(inner)
        self.record = record

    def execute(self, batch: StepPlan) -> StepResult:
        self.record(batch)
        return super().execute(batch)


async def test_batch_work_yields_to_an_interactive_request_within_its_targets(backend: LlamaCppBackend) -> None:
    """The batch policy on the real model, with the step-time model learned
    from this machine's measured steps: alone, batch work takes every slot
    (the reserved ones too); an interactive arrival takes a lent slot back at
    once and its prompt's step is computed alone; each step it then decodes
    in is predicted within 1.2x its step alone (the inter-token target)."""
    steps: list[tuple[tuple[tuple[int, int], ...], float, float | None, float]] = []

    def record(batch: StepPlan) -> None:
        model = scheduler.policy.model
        chunks = tuple((c.seq_id, len(c.token_ids)) for c in batch.chunks)
        limit = scheduler.policy.snapshot().step_limit_s
        steps.append((chunks, model.predict(batch.num_tokens, len(chunks)), limit, model.predict(1, 1)))

    engine = Engine(EngineConfig())
    engine.add_model("smol", RecordedBackend(backend, record))
    scheduler = engine._model("smol").worker.scheduler  # read on the step thread, in `record`
    num_lines = 16  # every slot of the backend; 2 of them reserved
    started = [asyncio.Event() for _ in range(num_lines)]

    async def batch_line(i: int) -> list[int]:
        params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
        tokens = []
        async for event in engine.submit(
            "smol", GenerateRequest(f"bg{next(_ids)}", encode(engine, SIXTEEN_PROMPTS[i]), params, 2.0)
        ):
            tokens.extend(event.token_ids)
            started[i].set()
        return tokens

    try:
        lines = [asyncio.create_task(batch_line(i)) for i in range(num_lines)]
        for event in started:
            await event.wait()
        mark = len(steps)  # every batch line has its first token: all are decoding
        prompt = encode(engine, "Write one sentence about the sea and the sky over the harbour tonight.")
        chat = GenerateRequest(
            f"chat{next(_ids)}", prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), 0.0
        )
        _, _, last = await run(engine, chat)
        outputs = await asyncio.gather(*lines)
        policy = engine.stats()["smol"].batch_policy
    finally:
        await engine.unload_model("smol", close_backend=False)
    assert last.num_output_tokens == 8 and all(len(tokens) == 48 for tokens in outputs)  # the preempted one too
    assert max(len(chunks) for chunks, *_ in steps[:mark]) == num_lines  # alone: every slot in one step
    assert policy.num_slots_returned >= 1
    batch_seqs = {seq_id for chunks, *_ in steps[:mark] for seq_id, _ in chunks}
    first = next(i for i in range(mark, len(steps)) if any(seq_id not in batch_seqs for seq_id, _ in steps[i][0]))
    chat_seq = steps[first][0][0][0]
    assert steps[first][0] == ((chat_seq, len(prompt)),)  # the chat prompt's step: alone
    with_chat = [step for step in steps[first + 1 :] if any(seq_id == chat_seq for seq_id, _ in step[0])]
    assert len(with_chat) == 7
    for chunks, predicted, limit, chat_alone in with_chat:
        assert limit is not None and predicted <= limit + 1e-9, (chunks, predicted, limit)
        assert limit <= 1.2 * chat_alone + 1e-9


async def test_adaptive_threads_switch_mid_stream_and_keep_greedy_output(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--threads auto on SmolLM2: a CPU reading that says a neighbour comes and
    goes switches the step's threads mid-stream (2 -> 1 -> 2 ...); the tokens
    are those of a fixed count, and the stats show the count and the reading."""
    from localserve.engine import threads as threads_module
    from localserve.engine.step import worker as worker_module

    class Flipping:
        """A neighbour that takes one of the two cores every other reading."""

        def __init__(self) -> None:
            self.calls = 0

        def busy_elsewhere(self) -> float:
            self.calls += 1
            return 1.0 if self.calls % 4 < 2 else 0.0

    flipping = Flipping()
    monkeypatch.setattr(worker_module, "shared_cpu_use", lambda: flipping)
    monkeypatch.setattr(threads_module, "TICK_S", 0.0)  # a window per MIN_STEPS steps ...
    monkeypatch.setattr(threads_module, "READ_S", 0.0)  # ... and a reading after every step
    monkeypatch.setattr(worker_module, "TRUSTED_AFTER_STEPS", 5)  # (the prompt and 4 decodes)
    monkeypatch.setattr(threads_module, "MARGIN", 100.0)  # keep every suggested switch: this is about the output
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    smol = LlamaCppBackend(LlamaCppConfig(str(smollm2_path), n_ctx=256, num_slots=2, step_tokens=128, n_threads=2))
    fixed = Engine(EngineConfig())
    fixed.add_model("smol", smol)
    prompt = smol.tokenizer().encode("The history of the printing press", add_special=False)
    want, _, _ = await run(fixed, request(prompt, max_tokens=48, temperature=0.0, ignore_eos=True))
    assert fixed.stats()["smol"].threads.adaptive is False
    await fixed.unload_model("smol", close_backend=False)

    adaptive = Engine(EngineConfig(adaptive_threads=True))
    adaptive.add_model("smol", smol)
    try:
        got, _, _ = await run(adaptive, request(prompt, max_tokens=48, temperature=0.0, ignore_eos=True))
        assert got == want
        state = adaptive.stats()["smol"].threads
        assert state.adaptive and state.max_threads == 2
        assert state.switches >= 4, state
        assert flipping.calls >= 8
    finally:
        await adaptive.unload_model("smol")


async def test_a_token_id_outside_the_vocabulary_is_refused_before_any_step(engine: Engine) -> None:
    """llama.cpp refuses a whole batch with one bad id: the engine refuses
    the request at submit (400), and its batchmates never notice."""
    from localserve.errors import InvalidRequestError

    vocab = engine.tokenizer("smol").vocab_size
    for bad in (-1, vocab):
        with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
            engine.submit("smol", request([1, 2, bad], max_tokens=2, temperature=0.0))
    _, text, _ = await run(engine, request(encode(engine, "The capital of France is"), max_tokens=6, temperature=0.0))
    assert "Paris" in text
