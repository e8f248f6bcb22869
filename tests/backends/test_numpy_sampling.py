"""Sampling over logits in numpy (the ONNX Runtime and OpenVINO backends)."""

from __future__ import annotations

import math

import numpy as np

from localserve.backends.numpy_sampling import NumpySampler, token_logprob
from localserve.engine.types import SamplingParams

VOCAB = 2000


def logits_with(best: dict[int, float]) -> np.ndarray:
    row = np.full(VOCAB, -10.0, np.float32)
    for token, value in best.items():
        row[token] = value
    return row


def draws(params: SamplingParams, row: np.ndarray, n: int = 300) -> set[int]:
    sampler = NumpySampler(params)
    return {sampler.sample(row) for _ in range(n)}


def test_greedy_takes_the_best_and_logit_bias_moves_it() -> None:
    row = logits_with({5: 3.0, 7: 2.0})
    assert NumpySampler(SamplingParams(temperature=0.0)).sample(row) == 5
    biased = SamplingParams(temperature=0.0, logit_bias=((7, 5.0), (VOCAB + 3, 1.0)))
    assert NumpySampler(biased).sample(row) == 7


def test_top_k_top_p_and_min_p_cut_the_candidates() -> None:
    row = logits_with({1: 5.0, 2: 4.9, 3: 4.8, 4: 0.0})
    assert draws(SamplingParams(temperature=1.0, top_k=2, seed=1), row) <= {1, 2}
    assert draws(SamplingParams(temperature=1.0, top_p=0.5, seed=2), row) <= {1, 2}
    assert draws(SamplingParams(temperature=1.0, min_p=0.5, seed=3), row) == {1, 2, 3}
    everything = draws(SamplingParams(temperature=1.0, seed=4), logits_with({}), n=200)
    assert len(everything) > 150, "no cut: the whole vocabulary is a candidate"


def test_top_p_beyond_the_first_candidates_uses_the_whole_vocabulary() -> None:
    flat = logits_with({})  # 2000 equally likely tokens: 0.9 of the mass needs 1800 of them
    got = draws(SamplingParams(temperature=1.0, top_p=0.9, seed=5), flat, n=400)
    assert len(got) > 300 and max(got) > 600


def test_the_same_seed_gives_the_same_tokens() -> None:
    rng = np.random.default_rng(0)
    rows = [rng.normal(size=VOCAB).astype(np.float32) for _ in range(20)]
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=42)
    a, b = NumpySampler(params), NumpySampler(params)
    assert [a.sample(r) for r in rows] == [b.sample(r) for r in rows]
    c = NumpySampler(SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=43))
    assert [c.sample(r) for r in rows] != [NumpySampler(params).sample(r) for r in rows]


def test_penalties_push_repeated_tokens_down() -> None:
    row = logits_with({1: 2.0, 2: 1.9})
    sampler = NumpySampler(SamplingParams(temperature=0.0, repeat_penalty=1.5))
    assert [sampler.sample(row) for _ in range(2)] == [1, 2]  # 2.0 / 1.5 < 1.9
    presence = NumpySampler(SamplingParams(temperature=0.0, presence_penalty=0.5, penalty_last_n=1))
    assert [presence.sample(row) for _ in range(3)] == [1, 2, 1], "only the last token is remembered"


def test_logprobs_come_from_the_raw_distribution() -> None:
    row = logits_with({1: 3.0, 2: 2.0})
    lp = token_logprob(row, 2, 2)
    assert [t for t, _ in lp.top] == [1, 2]
    norm = math.log(math.exp(3.0) + math.exp(2.0) + (VOCAB - 2) * math.exp(-10.0))
    assert math.isclose(lp.logprob, 2.0 - norm, rel_tol=1e-5)
