"""Sampling over logits in numpy (the ONNX Runtime and OpenVINO backends)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np
import pytest

from localserve.backends import numpy_sampling
from localserve.backends.numpy_sampling import NumpySampler, greedy_rows, sample_rows, token_logprob
from localserve.engine.types import SamplingParams
from localserve.errors import InvalidRequestError

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


# ---- the distribution, exactly ----------------------------------------------


def reference(row: np.ndarray, p: SamplingParams) -> dict[int, float]:
    """The distribution the cuts define, by the book: sort everything, cut
    top_k, then typical_p, then top_p and min_p on the softmax of what is
    left, then apply the temperature (llama.cpp's order)."""
    order = np.argsort(-row, kind="stable")
    if 0 < p.top_k < len(row):
        order = order[: p.top_k]
    logits = row[order].astype(np.float64)
    if p.typical_p < 1.0:  # surprise closest to the entropy first, until the mass exceeds typical_p
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        surprise = -np.log(probs)
        entropy = float((probs * surprise).sum())
        by_typicality = sorted(range(len(order)), key=lambda i: (abs(surprise[i] - entropy), i))
        kept, mass = [], 0.0
        for i in by_typicality:
            kept.append(i)
            mass += probs[i]
            if mass > p.typical_p:
                break
        kept.sort()
        order, logits = order[kept], logits[kept]
    probs = np.exp(logits - logits[0])
    keep = len(order)
    if p.top_p < 1.0:
        cum = np.cumsum(probs) / probs.sum()
        keep = int(np.argmax(cum >= p.top_p)) + 1
    if p.min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= p.min_p)))
    weights = np.exp((logits[:keep] - logits[0]) / p.temperature)
    return dict(zip(order[:keep].tolist(), (weights / weights.sum()).tolist(), strict=True))


def assert_samples_follow(row: np.ndarray, params: SamplingParams, n: int = 20_000) -> None:
    """n draws against the reference: nothing outside its support, and a
    chi-square statistic within six standard deviations of its mean."""
    expected = reference(row, params)
    sampler = NumpySampler(params)
    counts = Counter(sampler.sample(row) for _ in range(n))
    assert set(counts) <= set(expected), f"drew tokens the cuts exclude: {set(counts) - set(expected)}"
    # tokens expected fewer than 5 times are pooled, as a chi-square test needs
    big = [t for t, q in expected.items() if q * n >= 5]
    small_q = sum(q for t, q in expected.items() if q * n < 5)
    chi2 = sum((counts.get(t, 0) - expected[t] * n) ** 2 / (expected[t] * n) for t in big)
    if small_q * n >= 5:
        small_count = sum(c for t, c in counts.items() if t not in big)
        chi2 += (small_count - small_q * n) ** 2 / (small_q * n)
    df = max(1, len(big) - (0 if small_q * n >= 5 else 1))
    assert chi2 < df + 6 * math.sqrt(2 * df), f"chi2 {chi2:.1f} with {df} degrees of freedom for {params}"


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=1),  # the request defaults
        SamplingParams(temperature=1.0, top_k=5, seed=2),
        SamplingParams(temperature=1.3, top_p=0.8, seed=3),
        SamplingParams(temperature=0.5, min_p=0.2, seed=4),
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=5),  # no cut at all
        SamplingParams(temperature=0.9, top_k=100, top_p=0.5, min_p=0.01, seed=6),
        SamplingParams(temperature=1.0, typical_p=0.5, seed=10),
        SamplingParams(temperature=0.8, top_k=40, typical_p=0.7, top_p=0.9, min_p=0.02, seed=11),
    ],
    ids=["defaults", "top_k", "top_p", "min_p", "none", "all", "typical", "typical-and-cuts"],
)
def test_each_cut_draws_exactly_the_reference_distribution(params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    row = (rng.normal(size=VOCAB) * 2.5).astype(np.float32)
    assert_samples_follow(row, params)


@pytest.mark.parametrize("layout", ["spread", "best-on-the-subsample"])
def test_top_k_on_a_real_sized_vocabulary_starts_from_a_subsample_estimate_and_stays_exact(layout: str) -> None:
    """A 49,152-token row (SmolLM2's vocabulary) takes top_k's first spread
    from every _SUBSAMPLE-th logit; when the best tokens all sit between the
    sampled positions the estimate is too high (fewer than top_k tokens
    reach it), the spread widens, and the draw is still exact."""
    rng = np.random.default_rng(12)
    row = (rng.normal(size=49_152) * 2.5).astype(np.float32)
    if layout == "best-on-the-subsample":
        row = rng.normal(size=49_152).astype(np.float32) - 8.0
        best = np.arange(60) * numpy_sampling._SUBSAMPLE
        row[best] = rng.normal(size=len(best)).astype(np.float32)
        sub = np.sort(row[:: numpy_sampling._SUBSAMPLE])[::-1]
        assert np.count_nonzero(row >= sub[40 // numpy_sampling._SUBSAMPLE + 7]) < 40  # the estimate falls short
    assert row.shape[0] >= numpy_sampling._SUBSAMPLE * 4 * (40 + numpy_sampling._SUBSAMPLE)  # the estimate runs
    assert_samples_follow(row, SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=13))
    assert_samples_follow(row, SamplingParams(temperature=1.0, top_k=40, seed=14))


def test_top_p_over_a_flat_tail_widens_past_the_first_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most of the mass lies beyond the first candidates (a long flat tail,
    beyond a spread narrowed for the test): the candidates widen until they
    hold top_p of the mass, and the draw is still exact."""
    monkeypatch.setattr(numpy_sampling, "_SPREAD", 0.5)
    row = np.full(VOCAB, -3.0, np.float32)
    row[:3] = [0.0, -0.2, -0.4]
    for params in (
        SamplingParams(temperature=1.0, top_p=0.9, seed=8),
        SamplingParams(temperature=0.8, top_p=0.5, min_p=0.01, seed=9),
    ):
        assert_samples_follow(row, params, n=15_000)
        assert len(reference(row, params)) > 500, "the tail carries the top_p mass"


def test_greedy_rows_is_one_argmax_and_keeps_the_end_masked() -> None:
    rng = np.random.default_rng(9)
    table = rng.normal(size=(6, VOCAB)).astype(np.float32)
    eog = 17
    table[4, eog] = 100.0  # row 4's argmax is the end-of-generation token
    plain = SamplingParams(temperature=0.0)
    masked = SamplingParams(temperature=0.0, ignore_eos=True)
    samplers = [NumpySampler(plain) for _ in range(3)] + [NumpySampler(masked, eog_token_ids=[eog])]
    rows = [1, 2, 3, 4]
    got = greedy_rows(table, rows, samplers)
    assert got[:3] == [int(np.argmax(table[r])) for r in rows[:3]]
    assert got[3] is None, "the masked end is refused: the row samples alone"
    assert samplers[3].sample(table[4]) == int(np.argsort(-table[4])[1])
    assert greedy_rows(table, [0, 5], [NumpySampler(plain), NumpySampler(plain)]) == [
        int(np.argmax(table[0])),
        int(np.argmax(table[5])),
    ], "rows that are not adjacent"


REAL_VOCAB = 49_152  # SmolLM2's: sample_rows estimates the candidates from a subsample


def real_sized_rows(num_rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(num_rows, REAL_VOCAB)) * 2.5).astype(np.float32)


def test_sample_rows_draws_exactly_the_reference_distribution() -> None:
    """The step's rows in one call (the llama.cpp backend's path for sampled
    rows): 8 rows of the same logits, each its own sampler, drawn together
    many times, against the distribution the cuts define."""
    row = real_sized_rows(1, 21)[0]
    table = np.repeat(row[None, :], 8, axis=0)
    for params in (
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.2, top_k=12, top_p=0.6),
        SamplingParams(temperature=0.5, top_k=200, min_p=0.1),
    ):
        expected = reference(row, params)
        samplers = [NumpySampler(dataclasses.replace(params, seed=100 + i)) for i in range(8)]
        assert all(s.plain_sampled for s in samplers)
        counts: Counter[int] = Counter()
        for _ in range(2_000):
            drawn = sample_rows(table, list(range(8)), samplers)
            assert None not in drawn
            counts.update(t for t in drawn if t is not None)
        n = sum(counts.values())
        assert set(counts) <= set(expected), f"drew tokens the cuts exclude: {set(counts) - set(expected)}"
        big = [t for t, q in expected.items() if q * n >= 5]
        chi2 = sum((counts.get(t, 0) - expected[t] * n) ** 2 / (expected[t] * n) for t in big)
        rest = 1.0 - sum(expected[t] for t in big)
        if rest * n >= 5:
            chi2 += (sum(c for t, c in counts.items() if t not in big) - rest * n) ** 2 / (rest * n)
        df = max(1, len(big) - (0 if rest * n >= 5 else 1))
        assert chi2 < df + 6 * math.sqrt(2 * df), f"chi2 {chi2:.1f} with {df} degrees of freedom for {params}"


def test_sample_rows_gives_what_each_sampler_alone_gives_whatever_its_batchmates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seed gives the same tokens from `sample_rows` as from the sampler's
    own `sample`, alone or among rows of other cuts, other top_k and a
    masked end-of-generation token, adjacent or not; the table is left as it was."""
    table = real_sized_rows(10, 22)
    eog = int(np.argmax(table[3]))  # row 3's best token is the end, masked under ignore_eos
    kinds = [
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05),
        SamplingParams(temperature=1.0, top_k=40),
        SamplingParams(temperature=0.8, top_k=64, top_p=0.9),
        SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, ignore_eos=True),
    ]
    rows = [0, 1, 2, 3, 5, 6, 9]
    params = [dataclasses.replace(kinds[i % len(kinds)], seed=50 + i) for i in range(len(rows))]
    params[3] = dataclasses.replace(kinds[3], seed=53)

    def fresh() -> list[NumpySampler]:
        return [NumpySampler(p, eog_token_ids=[eog]) for p in params]

    batched, alone, own = fresh(), fresh(), fresh()
    before = table.copy()
    for _ in range(6):
        together = sample_rows(table, rows, batched)
        assert None not in together[:2] and None not in together[3:4], "4 rows of top_k 40 together"
        assert together[2] is None and together[6] is None, "top_k 64 has 2 rows: they sample one by one"
        assert np.array_equal(table, before), "the rows are as they were"
        together = [t if t is not None else s.sample(table[r]) for t, r, s in zip(together, rows, batched, strict=True)]
        with monkeypatch.context() as patch:  # one row on its own through the batched path
            patch.setattr(numpy_sampling, "_ROWS_TOGETHER", 1)
            singly = [sample_rows(table, [r], [s])[0] for r, s in zip(rows, alone, strict=True)]
        reference_tokens = [s.sample(table[r]) for r, s in zip(rows, own, strict=True)]
        assert together == singly == reference_tokens
        assert together[3] != eog


def test_sample_rows_leaves_a_row_to_its_sampler_where_the_estimate_falls_short() -> None:
    """Rows whose best tokens all sit on the subsampled positions (the
    estimate of the k-th best is too high), or whose every token is masked,
    come back None: `sample` takes them (and says why when nothing is allowed)."""
    rng = np.random.default_rng(23)
    table = real_sized_rows(2, 24)
    table[1] = rng.normal(size=REAL_VOCAB).astype(np.float32) - 8.0
    best = np.arange(60) * numpy_sampling._SUBSAMPLE
    table[1, best] = rng.normal(size=len(best)).astype(np.float32)
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, seed=5)
    table = np.concatenate([table, table[:1], table[:1], np.full((1, REAL_VOCAB), -np.inf, np.float32)])
    samplers = [NumpySampler(params) for _ in range(5)]
    got = sample_rows(table, list(range(5)), samplers)
    assert None not in got[:1] + got[2:4] and got[1] is None and got[4] is None
    assert samplers[1].sample(table[1]) in set(best.tolist())
    lone = samplers[4]
    with pytest.raises(InvalidRequestError, match="no token is allowed"):
        lone.sample(table[4])


def test_what_sample_rows_leaves_to_each_sampler() -> None:
    """Penalties, logit bias, typical_p, greedy and no top_k sample row by row."""
    base = SamplingParams(temperature=0.7, top_k=40)
    assert NumpySampler(base).plain_sampled
    for params in (
        dataclasses.replace(base, repeat_penalty=1.1),
        dataclasses.replace(base, logit_bias=((3, 1.0),)),
        dataclasses.replace(base, typical_p=0.5),
        dataclasses.replace(base, temperature=0.0),
        dataclasses.replace(base, top_k=0),
    ):
        assert not NumpySampler(params).plain_sampled, params
    small = np.zeros((4, VOCAB), np.float32)  # too small a vocabulary for the estimate: row by row
    assert sample_rows(small, [0, 1, 2, 3], [NumpySampler(base) for _ in range(4)]) == [None] * 4
