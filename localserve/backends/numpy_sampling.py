"""Per-sequence sampling over a row of logits, in numpy, for the backends
whose runtime returns logits (ONNX Runtime, OpenVINO).

Same order and meaning as the llama.cpp chain (llamacpp_sampling.py):
logit bias -> penalties -> top_k -> top_p -> min_p -> temperature -> draw.
The cheap cuts come first: top_p and min_p look at a few hundred candidates
picked with `argpartition`, never sort the whole vocabulary unless needed.
"""

from __future__ import annotations

import random
from collections import Counter, deque

import numpy as np

from localserve.backends.constraints import GrammarMatcher, ThinkBudget
from localserve.engine.types import SamplingParams, TokenLogprob
from localserve.errors import InvalidRequestError

#: Candidates looked at by top_p/min_p when top_k is off, before falling back
#: to the whole vocabulary (only when they do not hold the top_p mass).
_CANDIDATES = 512


class NumpySampler:
    """One sequence's sampler: its random generator, penalty history and
    grammar (backends/constraints.py: sample, check, and mask and sample
    again only when the grammar refuses the token)."""

    __slots__ = ("params", "_rng", "_history", "_bias", "_matcher", "_budget", "ended")

    def __init__(
        self, params: SamplingParams, matcher: GrammarMatcher | None = None, budget: ThinkBudget | None = None
    ) -> None:
        self.params = params
        self._matcher = matcher
        self._budget = budget
        self.ended = False  # the grammar ended the sequence
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        self._rng = np.random.default_rng(seed & 0xFFFFFFFF)
        last_n = params.penalty_last_n
        self._history: deque[int] = deque(maxlen=None if last_n < 0 else last_n)
        self._bias = None
        if params.logit_bias:
            ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)
            self._bias = (ids, np.array([b for _, b in params.logit_bias], dtype=np.float32))

    def sample(self, logits: np.ndarray) -> int:
        """Pick (and remember) the next token from one row of logits; the
        closing marker's tokens instead once a think budget is spent."""
        budget = self._budget
        if budget is None:
            return self._sample(logits)
        token = budget.forced()
        if token is None:
            token = self._sample(logits)
        else:
            if self._matcher is not None:
                self._matcher.consume(token)
            if self._history.maxlen != 0:
                self._history.append(token)
        budget.note(token)
        return token

    def _sample(self, logits: np.ndarray) -> int:
        p = self.params
        row = logits.astype(np.float32, copy=True)
        if self._bias is not None:
            ids, bias = self._bias
            valid = ids < row.shape[0]
            row[ids[valid]] += bias[valid]
        if self._history and (p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty):
            self._penalize(row)
        matcher = self._matcher
        if matcher is not None and matcher.done:
            self.ended = True
            return matcher.end_token
        token = int(np.argmax(row)) if p.greedy else self._draw(row)
        if matcher is not None:
            if not matcher.allows(token):
                matcher.apply(row)
                if not np.isfinite(row).any():
                    raise InvalidRequestError("no token is allowed here (the grammar excludes them all)")
                token = int(np.argmax(row)) if p.greedy else self._draw(row)
            matcher.consume(token)
        if self._history.maxlen != 0:
            self._history.append(token)
        return token

    def _penalize(self, row: np.ndarray) -> None:
        p = self.params
        counts = Counter(self._history)
        ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        num = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
        values = row[ids]
        if p.repeat_penalty != 1.0:
            values = np.where(values > 0, values / p.repeat_penalty, values * p.repeat_penalty)
        row[ids] = values - num * p.frequency_penalty - p.presence_penalty

    def _draw(self, row: np.ndarray) -> int:
        p = self.params
        num = row.shape[0]
        cuts = p.top_p < 1.0 or p.min_p > 0.0
        if 0 < p.top_k < num:
            ids, partial = np.argpartition(-row, p.top_k - 1)[: p.top_k], False
        elif cuts and num > _CANDIDATES:
            ids, partial = np.argpartition(-row, _CANDIDATES - 1)[:_CANDIDATES], True
        else:
            ids, partial = np.arange(num), False
        if cuts:
            ids = ids[np.argsort(-row[ids], kind="stable")]
            keep = self._keep(row[ids], float(np.exp(row.astype(np.float64) - row.max()).sum()) if partial else None)
            if partial and keep >= len(ids):  # the cut reaches past the candidates: take them all
                ids = np.argsort(-row, kind="stable")
                keep = self._keep(row[ids], None)
            ids = ids[:keep]
        logits = row[ids].astype(np.float64)
        weights = np.exp((logits - logits.max()) / p.temperature)
        return int(ids[self._rng.choice(len(ids), p=weights / weights.sum())])

    def _keep(self, sorted_logits: np.ndarray, total: float | None) -> int:
        """How many of the best-first candidates top_p and min_p keep (at
        least one). `total`: the whole vocabulary's mass relative to the best
        token, when the candidates are only part of it."""
        p = self.params
        probs = np.exp(sorted_logits.astype(np.float64) - float(sorted_logits[0]))
        keep = len(probs)
        if p.top_p < 1.0:
            mass = np.cumsum(probs) / (total if total is not None else probs.sum())
            keep = int(np.searchsorted(mass, p.top_p)) + 1
        if p.min_p > 0.0:
            keep = min(keep, int(np.count_nonzero(probs >= p.min_p)))
        return max(1, keep)


def token_logprob(logits: np.ndarray, token_id: int, num_top: int) -> TokenLogprob:
    """Log-probability of `token_id` under the model's raw distribution, with
    the `num_top` most likely alternatives (as llamacpp_sampling does)."""
    shifted = logits.astype(np.float64) - float(logits.max())
    log_norm = float(np.log(np.exp(shifted).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if num_top > 0:
        best = np.argpartition(-shifted, num_top)[:num_top]
        best = best[np.argsort(-shifted[best])]
        top = tuple((int(t), float(shifted[t] - log_norm)) for t in best)
    return TokenLogprob(token_id=token_id, logprob=float(shifted[token_id] - log_norm), top=top)
