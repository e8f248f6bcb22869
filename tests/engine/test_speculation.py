"""Speculative decoding: the n-gram drafter, the acceptance rule, and the
scheduler with drafts verified in the shared step (scripted backend; the KV
view is checked after every step, rejections included)."""

from __future__ import annotations

import numpy as np
import pytest

from localserve.engine.step.scheduler import SchedulerConfig
from localserve.engine.step.speculation import (
    LONG_MATCH,
    PAYOFF_MIN_STEPS,
    PAYOFF_RETRY_EVERY,
    SHARED_STEP_STRETCH,
    DraftPayoff,
    NgramDrafter,
    accept_drafts,
    draft_lengths,
    expected_tokens,
    match_acceptance,
)
from localserve.engine.step.step_model import StepTimeModel

from .scripted import Driver, hashed_next_token, linear_cost, make_capacity, prompt

SPEC = SchedulerConfig(speculative="ngram", draft_max=6)


def copying(source: list[int], *, diverge_every: int = 0):  # type: ignore[no-untyped-def]
    """A model that copies `source` after the prompt: the i-th output token is
    source[i]; every `diverge_every`-th output is a different (hashed) token
    instead, so drafts taken from the prompt are sometimes rejected."""
    num_prompt = len(source)

    def next_token(history: tuple[int, ...]) -> int:
        index = len(history) - num_prompt
        if diverge_every and index % diverge_every == diverge_every - 1:
            return 400 + hashed_next_token(history) % 50
        return source[index % len(source)]

    return next_token


def run(config: SchedulerConfig | None, prompts: dict[str, list[int]], next_token, **kwargs):  # type: ignore[no-untyped-def]
    capacity = kwargs.pop("capacity", make_capacity(num_slots=4, max_draft_tokens=16))
    driver = Driver(
        capacity,
        config=config,
        next_token=next_token,
        step_cost=kwargs.pop("step_cost", None),
        draft_token=kwargs.pop("draft_token", None),
    )
    for request_id, ids in prompts.items():
        driver.add(request_id, ids, **kwargs)
    driver.run()
    return driver


# ---- the drafter -------------------------------------------------------------------------------


def test_ngram_drafter_proposes_what_followed_the_last_occurrence():
    drafter = NgramDrafter()
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3]
    assert drafter.propose(tokens, 4) == [4, 5, 6, 7]
    tokens += [4, 9, 9]  # grows: the index follows incrementally
    assert drafter.propose(tokens, 3) == []  # (4, 9, 9) / (9, 9) occur nowhere before
    tokens += [1, 2]
    assert drafter.propose(tokens, 2) == [3, 4]  # the most recent (1, 2) was followed by 3, 4
    assert drafter.propose(tokens, 0) == []


def test_ngram_drafter_prefers_the_longest_match():
    drafter = NgramDrafter()
    # (7, 8) is followed by 1 at its first occurrence and by 2 after (6, 7, 8)
    tokens = [6, 7, 8, 2, 0, 5, 7, 8, 1, 0, 6, 7, 8]
    assert drafter.propose(tokens, 1) == [2]


def test_the_drafter_measures_how_long_the_tail_copies_a_passage():
    drafter = NgramDrafter()
    passage = list(range(100, 140))
    tokens = [*passage, 7, 7, *passage[:30]]
    assert drafter.propose(tokens, 5) == passage[30:35]
    assert drafter.match_len == 30  # the whole copied stretch, not only the 4-gram
    assert match_acceptance(30) == 31 / 32 and match_acceptance(LONG_MATCH - 1) == 0.0
    short = NgramDrafter()
    # the passage runs into the tail: it goes on as the loop it is
    assert short.propose([1, 2, 3, 9, 1, 2, 3], 5) == [9, 1, 2, 3, 9] and short.match_len == 3


def test_the_drafter_continues_a_loop_past_the_tail():
    """Output stuck in a loop of period p is drafted as that loop goes on,
    not only the p tokens that followed its last occurrence."""
    assert NgramDrafter().propose([8, 5, 5, 5, 5, 5], 4) == [5, 5, 5, 5]
    assert NgramDrafter().propose([3, 1, 2, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]


def test_a_long_copy_drafts_past_draft_max():
    """A sequence copying a long passage drafts up to the backend's limit
    (16 here), not `draft_max` (6), when a step's cost is mostly fixed."""
    source = prompt(10, 120)
    memory_bound = linear_cost(0.01, 0.0002, 0.0)
    capacity = make_capacity(num_slots=4, max_draft_tokens=16, n_ctx=512, kv_size=2048)
    driver = run(SPEC, {"a": source}, copying(source), max_tokens=100, step_cost=memory_bound, capacity=capacity)
    drafts = [c.num_draft for b in driver.batches for c in b.chunks]
    assert max(drafts) == 16 and driver.backend.num_accepted == driver.backend.num_drafted
    assert driver.records["a"].token_ids == source[:100]


# ---- the acceptance rule -------------------------------------------------------------------------


def test_the_acceptance_rule_keeps_the_target_distribution():
    """Stochastic proposer: accept x with min(1, p/q), else sample the residual.
    The first token out must be distributed as p, whatever q is."""
    rng = np.random.default_rng(7)
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    q = np.array([0.1, 0.1, 0.2, 0.3, 0.3])  # a poor proposer
    counts = np.zeros(5)
    num = 40_000
    for _ in range(num):
        draft = int(rng.choice(5, p=q))
        tokens, _ = accept_drafts(np.stack([p, p]), q[None, :], [draft], rng)
        counts[tokens[0]] += 1
    expected = p * num
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.0, (counts, expected)  # 4 degrees of freedom: p < 0.001 at 18.5


def test_sample_and_compare_is_the_rule_for_a_certain_draft():
    """q = one-hot (prompt lookup, a greedy draft model): the rule accepts x
    with probability p(x), as sampling from p and comparing does, and both
    give the target distribution for the first token and the right
    acceptance rate."""
    rng = np.random.default_rng(11)
    p = np.array([0.3, 0.4, 0.2, 0.1])
    q = np.zeros(4)
    q[1] = 1.0
    num = 30_000
    rule = np.zeros(4)
    compare = np.zeros(4)
    rule_accepts = compare_accepts = 0
    for _ in range(num):
        tokens, n = accept_drafts(np.stack([p, p]), q[None, :], [1], rng)
        rule[tokens[0]] += 1
        rule_accepts += n
        sampled = int(rng.choice(4, p=p))
        compare[sampled] += 1
        compare_accepts += sampled == 1
    for counts in (rule, compare):
        assert np.allclose(counts / num, p, atol=0.015)
    assert abs(rule_accepts / num - 0.4) < 0.015 and abs(compare_accepts / num - 0.4) < 0.015


def test_expected_tokens_and_the_draft_length_rule():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    # Fixed-cost steps (a memory-bound GPU): drafts are nearly free, take them all.
    assert draft_lengths([(0.8, 8)], num_tokens=1, num_seqs=1, coefficients=(0.01, 1e-5, 0.0), max_draft=8) == 8
    # Compute-bound (every token costs what a step costs): drafting never pays.
    assert draft_lengths([(0.8, 8)], num_tokens=16, num_seqs=16, coefficients=(0.0, 0.01, 0.0), max_draft=8) == 0
    # Low acceptance: none.
    assert draft_lengths([(0.05, 8)], num_tokens=1, num_seqs=1, coefficients=(0.01, 0.003, 0.0), max_draft=8) == 0


def test_draft_lengths_price_a_pass_per_drafting_sequence_where_drafts_take_their_own():
    # The step-time model of a run that drafted its way into slow steps: a large fixed cost makes drafts look cheap.
    spiral = {"num_tokens": 16, "num_seqs": 16, "coefficients": (0.5, 0.0017, 0.0), "max_draft": 8}
    proposals = [(0.7, 8)] * 3
    assert draft_lengths(proposals, **spiral) >= 6
    # But with a KV stream per slot each drafting sequence is a pass of its own, which costs a: none pays.
    assert draft_lengths(proposals, **spiral, own_pass=True) == 0
    # Alone, a sequence's drafts share its pass: the same rule as without.
    alone = {"num_tokens": 1, "num_seqs": 1, "coefficients": (0.01, 1e-4, 0.0), "max_draft": 8}
    assert draft_lengths([(0.8, 8)], **alone, own_pass=True) == draft_lengths([(0.8, 8)], **alone) == 8
    # A sequence that copies (acceptance near 1) still pays for its pass beside a few others.
    few = {"num_tokens": 2, "num_seqs": 2, "coefficients": (0.01, 0.001, 0.0), "max_draft": 8}
    assert draft_lengths([(0.98, 8)], **few, own_pass=True) == 8


# ---- the scheduler with drafts -------------------------------------------------------------------


@pytest.mark.parametrize("diverge_every", [0, 5, 3])
def test_outputs_equal_decoding_without_speculation(diverge_every):
    source = prompt(10, 40)
    prompts = {"a": source, "b": source[:30] + [7, 8], "c": [3, 4, *source[5:25]]}
    model = copying(source, diverge_every=diverge_every)
    plain = run(None, prompts, model, max_tokens=60, temperature=0)
    spec = run(SPEC, prompts, model, max_tokens=60, temperature=0)
    for request_id in prompts:
        assert spec.records[request_id].token_ids == plain.records[request_id].token_ids
        assert spec.records[request_id].text == plain.records[request_id].text
    assert spec.backend.num_drafted > 0
    if diverge_every:
        assert spec.backend.num_accepted < spec.backend.num_drafted  # rejections happened, and were undone
    else:  # "a" copies its prompt exactly; "b" and "c" start elsewhere, and their first drafts miss
        assert spec.backend.num_accepted > 0.8 * spec.backend.num_drafted
    assert len(spec.batches) <= len(plain.batches)  # never more steps for the same tokens
    if diverge_every != 3:
        assert len(spec.batches) < len(plain.batches)
    counters = spec.scheduler.counters
    assert (counters.num_draft_tokens, counters.num_accepted_tokens) == (
        spec.backend.num_drafted,
        spec.backend.num_accepted,
    )
    last = spec.records["a"].last
    assert last.num_draft_tokens > 0 and last.num_accepted_tokens <= last.num_draft_tokens


def test_drafts_never_pass_max_tokens_or_the_context():
    source = prompt(10, 40)
    driver = run(SPEC, {"a": source}, copying(source), max_tokens=13)
    assert len(driver.records["a"].token_ids) == 13
    assert driver.records["a"].last.finish_reason == "length"
    small = make_capacity(num_slots=1, n_ctx=50, kv_size=50, max_draft_tokens=16)
    driver = run(SPEC, {"a": source}, copying(source), max_tokens=100, capacity=small)
    assert len(driver.records["a"].token_ids) == 10  # 40 + 10 = n_ctx
    assert driver.records["a"].last.finish_reason == "length"


def test_a_stop_string_inside_accepted_drafts_ends_the_answer_there():
    source = prompt(10, 40)
    stop = ("t15 t16",)
    plain = run(None, {"a": source}, copying(source), max_tokens=30, stop=stop)
    spec = run(SPEC, {"a": source}, copying(source), max_tokens=30, stop=stop)
    assert spec.records["a"].text == plain.records["a"].text == "t10 t11 t12 t13 t14 "
    assert spec.records["a"].last.finish_reason == "stop"


def test_speculation_under_kv_pressure_and_preemption_keeps_every_answer():
    """Small KV: drafts take only free room, sequences are preempted and resumed;
    every answer equals its run without speculation."""
    source = prompt(10, 30)
    capacity = make_capacity(num_slots=3, kv_size=140, n_ctx=100, max_draft_tokens=16)
    prompts = {f"r{i}": source[i:] for i in range(5)}
    model = copying(source, diverge_every=4)
    plain = run(None, prompts, model, max_tokens=40, capacity=capacity)
    spec = run(SPEC, prompts, model, max_tokens=40, capacity=capacity)
    for request_id in prompts:
        assert spec.records[request_id].token_ids == plain.records[request_id].token_ids
    assert spec.scheduler.counters.num_preemptions > 0 or plain.scheduler.counters.num_preemptions > 0


def test_a_request_can_turn_it_off_and_the_backend_must_support_it():
    source = prompt(10, 40)
    off = run(SPEC, {"a": source}, copying(source), max_tokens=20, speculative=False)
    assert off.backend.num_drafted == 0
    no_support = run(SPEC, {"a": source}, copying(source), max_tokens=20, capacity=make_capacity())
    assert no_support.backend.num_drafted == 0
    with pytest.raises(ValueError, match="speculative"):
        Driver(make_capacity(), config=SchedulerConfig(speculative="magic"))


def test_compute_bound_steps_draft_nothing():
    """When each token costs as much as the step (every extra token is paid
    in full), the step-time model learns it and no drafts are verified."""
    source = prompt(10, 40)
    compute_bound = linear_cost(0.0, 0.01, 0.0)
    prompts = {"a": source, "b": source[1:]}
    driver = run(SPEC, prompts, copying(source, diverge_every=2), max_tokens=60, step_cost=compute_bound)
    late = driver.batches[len(driver.batches) // 2 :]
    assert sum(c.num_draft for b in late for c in b.chunks) == 0


def test_fixed_cost_steps_draft_and_follow_the_acceptance_rate():
    """A step's cost is fixed (a memory-bound GPU, one small sequence): drafts
    pay while they are accepted; a sequence whose drafts keep failing stops."""
    source = prompt(10, 40)
    memory_bound = linear_cost(0.01, 0.0002, 0.0)
    good = run(SPEC, {"a": source}, copying(source), max_tokens=60, step_cost=memory_bound)
    assert good.backend.num_accepted == good.backend.num_drafted > 30
    bad = run(SPEC, {"a": source}, copying(source, diverge_every=1), max_tokens=60, step_cost=memory_bound)
    assert bad.backend.num_accepted == 0
    assert bad.backend.num_drafted < good.backend.num_drafted / 2


# ---- a draft model ---------------------------------------------------------------------------------

DRAFT = SchedulerConfig(speculative="draft", draft_max=5)
WITH_DRAFT_MODEL = make_capacity(num_slots=4, max_draft_tokens=16, has_draft_model=True)


def test_a_draft_model_that_is_the_model_has_every_draft_accepted():
    prompts = {"a": prompt(10, 20), "b": prompt(40, 7), "c": prompt(3, 30)}
    plain = run(None, prompts, hashed_next_token, max_tokens=40)
    spec = run(
        DRAFT, prompts, hashed_next_token, max_tokens=40, capacity=WITH_DRAFT_MODEL, draft_token=hashed_next_token
    )
    for request_id in prompts:
        assert spec.records[request_id].token_ids == plain.records[request_id].token_ids
    assert spec.backend.num_drafted > 60 and spec.backend.num_accepted == spec.backend.num_drafted
    assert spec.scheduler.counters.num_draft_tokens == spec.backend.num_drafted
    assert len(spec.batches) < len(plain.batches) / 3


def test_a_draft_model_that_is_often_wrong_changes_no_output():
    def noisy(history: tuple[int, ...]) -> int:
        token = hashed_next_token(history)
        return token if len(history) % 3 else (token + 1) % 500

    prompts = {"a": prompt(10, 20), "b": prompt(40, 7)}
    capacity = make_capacity(num_slots=2, kv_size=120, n_ctx=100, max_draft_tokens=16, has_draft_model=True)
    plain = run(None, prompts, hashed_next_token, max_tokens=60, capacity=capacity)
    spec = run(DRAFT, prompts, hashed_next_token, max_tokens=60, capacity=capacity, draft_token=noisy)
    for request_id in prompts:
        assert spec.records[request_id].token_ids == plain.records[request_id].token_ids
    assert 0 < spec.backend.num_accepted < spec.backend.num_drafted


def test_draft_mode_needs_a_draft_model():
    with pytest.raises(ValueError, match="--draft-model"):
        Driver(make_capacity(max_draft_tokens=16), config=DRAFT)


def small_steps_cost_more(num_tokens: int, num_seqs: int) -> float:
    """A CPU's shape: up to two tokens a sequence cost 8 ms each, tokens
    beyond (long prompt chunks) 0.5 ms; a line through such steps prices a
    drafted token near the cheap end."""
    small = min(num_tokens, 2 * num_seqs)
    return 0.002 + 0.008 * small + 0.0005 * (num_tokens - small)


def test_a_drafted_token_is_priced_as_a_decoding_token():
    """Eight streams whose drafts are accepted two times in three: priced as
    a prompt token (the step-time model's b, about 1 ms here) they look worth
    drafting; priced as a decoding sequence's token (b + c, 8 ms, against
    66 ms for a step of eight) they are not."""
    source = prompt(10, 48)
    capacity = make_capacity(num_slots=8, max_draft_tokens=16)
    prompts = {f"s{i}": source[i:] for i in range(8)}
    driver = run(
        SPEC,
        prompts,
        copying(source, diverge_every=3),
        max_tokens=60,
        step_cost=small_steps_cost_more,
        capacity=capacity,
    )
    late = driver.batches[len(driver.batches) // 2 :]
    assert sum(c.num_draft for b in late for c in b.chunks) == 0


# ---- whether drafting pays, measured ---------------------------------------------------------------


def test_draft_payoff_stops_a_bucket_whose_drafted_steps_yield_less_and_retries_it():
    payoff = DraftPayoff()
    assert payoff.allows(8)  # nothing measured yet: the step-time model decides
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.observe(8, 8, 0.045, drafted=False)  # 0.18 tokens per ms
        payoff.observe(8, 16, 0.100, drafted=True)  # 0.16: drafts accepted, and still a loss
    assert not payoff.allows(8) and payoff.stopped(9)  # 8-15 sequences compare together
    # one sequence is another bucket: there the same drafts win
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.observe(1, 1, 0.0085, drafted=False)
        payoff.observe(1, 2, 0.015, drafted=True)
    assert payoff.allows(1) and not payoff.allows(8)
    # after PAYOFF_RETRY_EVERY plain steps the stopped bucket is measured afresh ...
    for _ in range(PAYOFF_RETRY_EVERY - 1):
        payoff.observe(8, 8, 0.045, drafted=False)
    assert not payoff.allows(8)
    payoff.observe(8, 8, 0.045, drafted=False)
    assert payoff.allows(8)
    # ... and this time drafting pays (say the text turned to copying): it stays on
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.observe(8, 40, 0.150, drafted=True)
    assert payoff.allows(8)
    for _ in range(2 * PAYOFF_RETRY_EVERY):
        payoff.observe(8, 8, 0.045, drafted=False)
    assert payoff.allows(8)


def test_draft_payoff_measures_plain_steps_when_every_step_drafted():
    # Steps that all drafted (a step-time model misled by their slowness keeps pricing drafts as cheap):
    # once they are measured, the bucket's steps run plain until those are measured too, then compare.
    payoff = DraftPayoff()
    for _ in range(PAYOFF_MIN_STEPS):
        assert payoff.allows(16)
        payoff.observe(16, 24, 0.300, drafted=True)  # 0.08 tokens per ms
    assert not payoff.allows(16) and payoff.allows(1)
    for _ in range(PAYOFF_MIN_STEPS - 1):
        payoff.observe(16, 16, 0.080, drafted=False)  # 0.2 tokens per ms
        assert not payoff.allows(16)
    payoff.observe(16, 16, 0.080, drafted=False)
    assert payoff.stopped(16)
    # where the drafted steps had won, drafting resumes once the plain ones are measured
    payoff = DraftPayoff()
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.observe(1, 3, 0.012, drafted=True)
    assert not payoff.allows(1)
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.observe(1, 1, 0.009, drafted=False)
    assert payoff.allows(1)


def test_draft_payoff_ignores_unmeasured_steps():
    payoff = DraftPayoff()
    for _ in range(PAYOFF_MIN_STEPS):
        payoff.observe(4, 4, 0.01, drafted=False)
        payoff.observe(4, 8, float("nan"), drafted=True)  # no clock reading: not a drafted step
        payoff.observe(0, 0, 0.01, drafted=True)
    assert payoff.allows(4)


class _FooledModel(StepTimeModel):
    """A step-time model stuck where the real one went wrong on a CPU: a
    large fixed cost and cheap tokens, so drafts look nearly free."""

    @property
    def coefficients(self) -> tuple[float, float, float]:
        return (0.040, 0.001, 0.0)


def test_the_scheduler_stops_drafting_where_verifying_costs_more_than_the_model_says():
    """Four copying sequences whose drafted tokens cost 20 ms each, under a
    step-time model that prices them at 1 ms: drafting stops after a few
    measured steps, and the output is unchanged. One sequence, whose drafts
    cost 1 ms, keeps drafting; and without the measurement the four would
    have drafted all along (the case is one the model gets wrong)."""
    source = prompt(10, 400)

    def cost(num_tokens: int, num_seqs: int) -> float:
        return 0.030 + 0.002 * num_seqs + (0.020 if num_seqs >= 4 else 0.001) * (num_tokens - num_seqs)

    def go(num_seqs: int) -> tuple[Driver, int]:  # the driver, and how many decode steps drafted
        capacity = make_capacity(num_slots=4, max_draft_tokens=16, n_ctx=1024, kv_size=4096)
        driver = Driver(capacity, config=SPEC, next_token=copying(source, diverge_every=8), step_cost=cost)
        driver.scheduler.policy.model = _FooledModel()
        for i in range(num_seqs):
            driver.add(f"r{i}", source, max_tokens=300)
        driver.run()
        decodes = [b for b in driver.batches if all(len(c.token_ids) == 1 + c.num_draft for c in b.chunks)]
        drafted = sum(1 for b in decodes if any(c.num_draft for c in b.chunks))
        expected = copying(source, diverge_every=8)
        for i in range(num_seqs):
            history = tuple(source)
            for token in driver.records[f"r{i}"].token_ids:
                assert token == expected(history)
                history += (token,)
        return driver, drafted

    four, drafted = go(4)
    assert 0 < drafted <= 2 * PAYOFF_MIN_STEPS
    one, drafted_alone = go(1)
    assert drafted_alone > 4 * PAYOFF_MIN_STEPS
    always = DraftPayoff.allows
    try:
        DraftPayoff.allows = lambda self, num_seqs: True  # type: ignore[method-assign]
        unmeasured, drafted_unmeasured = go(4)
    finally:
        DraftPayoff.allows = always  # type: ignore[method-assign]
    assert drafted_unmeasured > 4 * drafted
    # A shared step's drafts stretch it by at most SHARED_STEP_STRETCH by the
    # model: 4 decodes are 0.044 s to it, so at most 22 drafted tokens of 1 ms.
    shared = [sum(c.num_draft for c in b.chunks) for b in unmeasured.batches if len(b.chunks) > 1]
    assert max(shared) == int((SHARED_STEP_STRETCH - 1.0) * 0.044 / 0.001)
    assert max(sum(c.num_draft for c in b.chunks) for b in one.batches) == SPEC.draft_max  # alone: no stretch cap
