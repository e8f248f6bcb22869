"""The step-time model, fed synthetic step costs: it must find a linear
cost, predict decode steps from decode-only data, follow a machine that slows
down, and never learn a negative cost."""

from __future__ import annotations

import math
import random

import pytest

from localserve.engine.step.step_model import StepTimeModel


def step_shapes(rng: random.Random, n: int) -> list[tuple[int, int]]:
    """What a server's steps look like: mostly decodes of 1-16 sequences, some
    with a prompt chunk of up to 512 tokens beside them."""
    shapes = []
    for _ in range(n):
        num_seqs = rng.randint(1, 16)
        num_tokens = num_seqs + (rng.randint(1, 512) if rng.random() < 0.3 else 0)
        shapes.append((num_tokens, num_seqs))
    return shapes


def test_converges_on_a_linear_cost_with_noise() -> None:
    rng = random.Random(7)
    true = (0.012, 0.0004, 0.0011)
    model = StepTimeModel(memory_steps=500)
    for num_tokens, num_seqs in step_shapes(rng, 400):
        cost = true[0] + true[1] * num_tokens + true[2] * num_seqs
        model.observe(num_tokens, num_seqs, cost * rng.uniform(0.97, 1.03))
    for got, want in zip(model.coefficients, true, strict=True):
        assert got == pytest.approx(want, rel=0.1)
    for num_tokens, num_seqs in [(1, 1), (8, 8), (64, 1), (512, 4)]:
        want = true[0] + true[1] * num_tokens + true[2] * num_seqs
        assert model.predict(num_tokens, num_seqs) == pytest.approx(want, rel=0.03)
    assert model.num_observations == 400
    assert 0.0 < model.mean_abs_error_s < 0.03 * 0.05  # a few percent of a typical step


def test_decode_only_steps_predict_decode_steps() -> None:
    # Tokens always equal sequences: the split between b and c is not in the
    # data, but a decode step of any width still is.
    model = StepTimeModel()
    for width in [1, 2, 4, 8, 16] * 20:
        model.observe(width, width, 0.010 + 0.002 * width)
    for width in (1, 3, 12):
        assert model.predict(width, width) == pytest.approx(0.010 + 0.002 * width, rel=1e-3)


def test_steps_of_one_sequence_put_what_they_cannot_split_into_the_fixed_cost() -> None:
    # Prompt steps and decodes of one sequence: a + c is known, not a and c
    # apart. The model takes an extra sequence to cost no more than the data
    # showed, so batch work gets tried beside it and the next step measures it.
    model = StepTimeModel()
    for num_tokens in [1, 1, 1, 64, 1, 1, 200] * 5:
        model.observe(num_tokens, 1, 0.020 + 0.0005 * num_tokens + 0.0015)
    a, b, c = model.coefficients
    assert a == pytest.approx(0.0215, rel=1e-3) and b == pytest.approx(0.0005, rel=1e-3) and c < 1e-5
    model.observe(2, 2, 0.020 + 0.0005 * 2 + 0.0015 * 2)  # one step of two sequences ...
    assert model.predict(3, 3) == pytest.approx(0.020 + 0.0005 * 3 + 0.0015 * 3, rel=1e-3)  # ... teaches c


def test_before_any_step_the_prior_grows_with_tokens() -> None:
    model = StepTimeModel()
    assert model.predict(64, 1) == pytest.approx(64 * model.predict(1, 1))
    assert model.predict(0, 0) == 0.0  # an empty step costs nothing


def test_follows_a_machine_that_slows_down() -> None:
    rng = random.Random(3)
    model = StepTimeModel(memory_steps=100)
    shapes = step_shapes(rng, 1000)
    for num_tokens, num_seqs in shapes[:500]:
        model.observe(num_tokens, num_seqs, 0.01 + 0.0004 * num_tokens + 0.001 * num_seqs)
    for num_tokens, num_seqs in shapes[500:]:  # another process now takes half the cores
        model.observe(num_tokens, num_seqs, 2 * (0.01 + 0.0004 * num_tokens + 0.001 * num_seqs))
    assert model.predict(8, 8) == pytest.approx(2 * (0.01 + 0.0004 * 8 + 0.001 * 8), rel=0.02)


def test_coefficients_are_never_negative() -> None:
    # Steps that get cheaper per sequence as they widen (weights read once for
    # all): a straight line through them would have a negative slope somewhere.
    model = StepTimeModel()
    for width in [1, 2, 4, 8, 16, 32] * 10:
        model.observe(width, width, 0.03 - 0.0005 * math.log2(width))
    assert all(v >= 0.0 for v in model.coefficients)
    assert model.predict(16, 16) == pytest.approx(0.03 - 0.002, rel=0.1)


def test_ignores_empty_and_unmeasured_steps() -> None:
    model = StepTimeModel()
    model.observe(0, 0, 0.5)
    model.observe(4, 4, math.nan)
    model.observe(4, 4, -1.0)
    model.observe(4, 4, math.inf)
    assert model.num_observations == 0
    assert model.predict(4, 4) == pytest.approx(4 * model.predict(1, 1))
