"""What a step costs on this model and device, learned from the steps it ran.

The scheduler decides how much `batch` work may share a step with
interactive work by predicting the step's time. The prediction is a linear
model fit online,

    step seconds ~= a + b * tokens + c * sequences

`a` is what every step costs (the weights are read once per step; on a GPU a
kernel launch per layer), `b` what each token adds (prompt tokens are most of
a step's tokens), `c` what each sequence adds beyond its token (its sampler,
its attention over its own context, a logits row). The fit is exponentially
weighted least squares over the last `memory_steps` steps, so it follows a
machine that gets busier or quieter; coefficients are kept non-negative.

Until it has data the model predicts with a prior of one millisecond per
token and nothing else: the scheduler's rules compare predictions as ratios,
so the prior's scale does not matter, only its shape (a step grows with its
tokens), which errs on the side of keeping batch work out. What the data
cannot tell apart (decode-only steps have as many tokens as sequences; steps
that all hold one sequence cannot split the fixed cost from the cost of a
sequence) is decided by a small ridge penalty toward the prior, far weaker on
the fixed cost: an extra token or sequence is taken to cost what the data has
shown, no more. That errs the other way, toward letting batch work in, and so
is how the model learns: a step with more sequences than it has seen is
measured, and the next prediction knows.
"""

from __future__ import annotations

import math

PRIOR = (0.0, 1e-3, 0.0)  # a, b, c: seconds, seconds per token, seconds per sequence
RIDGE = (1e-9, 1e-3, 1e-3)  # pull toward PRIOR of a, b, c: decides only what the data leaves open
ERROR_MEMORY_STEPS = 50  # steps the mean prediction error remembers


class StepTimeModel:
    """Predicts a step's seconds from its tokens and sequences; `observe`
    feeds it each measured step. Not thread-safe: the step thread owns it.

    `observe` runs after every step of every model, so it only folds the step
    into the weighted sums (plain floats: numpy's per-call cost on 3x3
    arrays was about 2% of a one-sequence decode step); the least-squares fit
    runs when a prediction or the coefficients are asked for after new data."""

    def __init__(self, memory_steps: int = 500) -> None:
        self._decay = 1.0 - 1.0 / max(1, memory_steps)
        self._xtx = [[0.0] * 3 for _ in range(3)]
        self._xty = [0.0] * 3
        self._coefficients: tuple[float, float, float] = PRIOR
        self._stale = False  # observed since the last fit
        self.num_observations = 0
        self.last_predicted_s = 0.0  # the prediction for the last observed step
        self.last_measured_s = 0.0
        self.mean_abs_error_s = 0.0  # recent mean |predicted - measured|

    @property
    def coefficients(self) -> tuple[float, float, float]:
        """(a, b, c): seconds per step, per token, per sequence."""
        if self._stale:
            self._coefficients = self._fit()
            self._stale = False
        return self._coefficients

    def predict(self, num_tokens: int, num_seqs: int) -> float:
        """Seconds of a step that computes `num_tokens` tokens of `num_seqs` sequences."""
        if num_seqs <= 0:
            return 0.0
        a, b, c = self.coefficients
        return a + b * num_tokens + c * num_seqs

    def observe(self, num_tokens: int, num_seqs: int, seconds: float) -> None:
        """One measured step."""
        if num_seqs <= 0 or not 0.0 <= seconds < math.inf:  # also refuses NaN
            return
        predicted = self.predict(num_tokens, num_seqs)
        weight = 1.0 / min(self.num_observations + 1, ERROR_MEMORY_STEPS)
        self.mean_abs_error_s += weight * (abs(predicted - seconds) - self.mean_abs_error_s)
        self.last_predicted_s, self.last_measured_s = predicted, seconds
        x = (1.0, float(num_tokens), float(num_seqs))
        decay = self._decay
        for i, row in enumerate(self._xtx):
            for j in range(3):
                row[j] = decay * row[j] + x[i] * x[j]
            self._xty[i] = decay * self._xty[i] + x[i] * seconds
        self.num_observations += 1
        self._stale = True

    def _fit(self) -> tuple[float, float, float]:
        """Ridge least squares toward PRIOR, with coefficients that come out
        negative fixed at zero and the rest refit (an active-set pass)."""
        lhs = [[v + (RIDGE[i] if i == j else 0.0) for j, v in enumerate(row)] for i, row in enumerate(self._xtx)]
        rhs = [v + RIDGE[i] * PRIOR[i] for i, v in enumerate(self._xty)]
        free = [0, 1, 2]
        theta = [0.0, 0.0, 0.0]
        while free:
            theta = [0.0, 0.0, 0.0]
            solved = _solve([[lhs[i][j] for j in free] for i in free], [rhs[i] for i in free])
            for i, value in zip(free, solved, strict=True):
                theta[i] = value
            negative = [i for i in free if theta[i] < 0.0]
            if not negative:
                break
            free.remove(min(negative, key=lambda i: theta[i]))
        a, b, c = theta
        return a, b, c


def _solve(lhs: list[list[float]], rhs: list[float]) -> list[float]:
    """x with lhs @ x = rhs, for the small symmetric positive definite
    systems of the fit (Gaussian elimination with partial pivoting)."""
    n = len(rhs)
    m = [[*row, value] for row, value in zip(lhs, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for k in range(col, n + 1):
                m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x
