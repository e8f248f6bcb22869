"""Sampling over rows of logits in numpy: per sequence for the backends
whose runtime returns logits (ONNX Runtime, OpenVINO), and a whole step's
rows in one call for llama.cpp (`sample_rows`).

Same order and meaning as llama.cpp's chain (llamacpp/sampling.py):
logit bias -> penalties -> top_k -> typical_p -> top_p -> min_p ->
temperature -> draw.
The cheap cuts come first, and no cut sorts or partitions the whole
vocabulary: the candidates are the tokens within a spread of the best
logit (one comparison pass), widened until they provably hold every token
the cuts keep (`_candidates`). The draw is one uniform number per token
from the sequence's own generator, so a seed gives the same tokens alone
or beside any other sequences.
"""

from __future__ import annotations

import math
import random
from collections import Counter, deque
from collections.abc import Collection, Sequence

import numpy as np

from localserve.backends.constraints import GrammarMatcher, ThinkBudget
from localserve.engine.types import SamplingParams, TokenLogprob
from localserve.errors import InvalidRequestError

#: The first spread (in logits) of the candidates around the best token,
#: doubled while too narrow (`_candidates`).
_SPREAD = 2.0
_SUBSAMPLE = 32  # top_k's first spread comes from every 32nd logit (_candidates)
#: `sample_rows` draws a top_k's rows together from this many; fewer sample
#: faster one by one (one row of SmolLM2: 43 us alone, 66 us through it).
_ROWS_TOGETHER = 4


class NumpySampler:
    """One sequence's sampler: its random generator, penalty history and
    grammar (backends/constraints.py: sample, check, and mask and sample
    again only when the grammar refuses the token)."""

    __slots__ = (
        "params",
        "_rng",
        "_history",
        "_bias",
        "_matcher",
        "_budget",
        "_eog",
        "_suppress_until",
        "_count",
        "ended",
    )

    def __init__(
        self,
        params: SamplingParams,
        matcher: GrammarMatcher | None = None,
        budget: ThinkBudget | None = None,
        eog_token_ids: Collection[int] = (),
    ) -> None:
        """`eog_token_ids`: end-of-generation tokens to mask under `ignore_eos`
        (always) and `min_tokens` (for the first tokens), as llama.cpp's
        server does; left empty, the output processor alone handles both."""
        self.params = params
        self._matcher = matcher
        self._budget = budget
        self.ended = False  # the grammar ended the sequence
        limit = (1 << 62) if params.ignore_eos else params.min_tokens
        self._eog = np.fromiter(sorted(eog_token_ids), dtype=np.int64) if limit and eog_token_ids else None
        self._suppress_until = limit if self._eog is not None else 0
        self._count = 0
        seed = params.seed if params.seed is not None else random.getrandbits(32)
        self._rng = np.random.default_rng(seed & 0xFFFFFFFF)
        last_n = params.penalty_last_n
        self._history: deque[int] = deque(maxlen=None if last_n < 0 else last_n)
        self._bias = None
        if params.logit_bias:
            ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)
            self._bias = (ids, np.array([b for _, b in params.logit_bias], dtype=np.float32))

    @property
    def _raw(self) -> bool:
        """Reads the raw logits: no logit bias, grammar, thinking budget or penalty."""
        p = self.params
        return (
            self._bias is None
            and self._matcher is None
            and self._budget is None
            and not (p.repeat_penalty != 1.0 or p.frequency_penalty or p.presence_penalty)
        )

    @property
    def plain_greedy(self) -> bool:
        """Greedy over the raw logits: an argmax the caller may take over
        many rows at once (`greedy_rows`), then hand to `take`."""
        return self.params.greedy and self._raw

    @property
    def plain_sampled(self) -> bool:
        """Sampling with temperature and top_k (top_p and min_p as they are)
        over the raw logits, end-of-generation tokens masked or not: what
        `sample_rows` draws for many rows at once, then hands to `took`."""
        p = self.params
        return not p.greedy and p.top_k > 0 and p.typical_p >= 1.0 and self._raw

    def took(self, token: int) -> None:
        """Remember `token`, drawn for this sampler by `sample_rows`."""
        self._count += 1
        if self._history.maxlen != 0:
            self._history.append(token)

    def take(self, token: int) -> bool:
        """Accept `token`, a plain greedy argmax of the raw row; False (and
        nothing accepted) when it is a masked end-of-generation token."""
        if self._count < self._suppress_until and self._eog is not None and token in self._eog:
            return False
        self.took(token)
        return True

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
            self._count += 1
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
        if self._count < self._suppress_until:
            row[self._eog] = -np.inf
        self._count += 1
        matcher = self._matcher
        if matcher is not None and matcher.done:
            self.ended = True
            return matcher.end_token
        if not np.isfinite(row.max()):
            raise InvalidRequestError("no token is allowed here (suppressed tokens exclude them all)")
        token = int(np.argmax(row)) if p.greedy else self._draw(row)
        if matcher is not None:
            if not matcher.allows(token):
                matcher.apply(row)
                if not np.isfinite(row.max()):
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
        if p.typical_p >= 1.0 and p.top_p >= 1.0 and p.min_p <= 0.0 and not 0 < p.top_k < row.shape[0]:
            # no cut: the whole row, in the order it comes (the draw needs none)
            weights = np.exp((row.astype(np.float64) - float(row.max())) / p.temperature)
            cumulative = np.cumsum(weights)
            return int(
                min(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right"), len(row) - 1)
            )
        if p.typical_p < 1.0:  # its entropy is over every token top_k keeps: no spread
            ids, logits, _ = _candidates(row, p.top_k, 1.0, 0.0)
            ids, logits = _typical(ids, logits, p.typical_p)
            top_p = p.top_p
        else:
            ids, logits, top_p = _candidates(row, p.top_k, p.top_p, p.min_p)
        keep = _keep(logits, top_p, p.min_p)
        weights = np.exp((logits[:keep].astype(np.float64) - float(logits[0])) / p.temperature)
        cumulative = np.cumsum(weights)
        index = int(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right"))
        return int(ids[min(index, keep - 1)])


def _candidates(row: np.ndarray, top_k: int, top_p: float, min_p: float) -> tuple[np.ndarray, np.ndarray, float]:
    """The tokens the cuts may keep, best first, with their logits and top_p
    as a share of their own mass: the `top_k` best when top_k is on, else
    every token that top_p and min_p can reach (all of them when neither
    cuts). Found among the tokens within a spread of the best logit (one
    comparison pass over the row), widened until provably enough:

    - top_k: at least top_k of them (top_p is then a share of their mass);
    - min_p alone decides the rest: it keeps only tokens within -log(min_p)
      of the best, so that window holds every token top_p and min_p keep
      (top_p keeping more than the window is cut back by min_p);
    - top_p alone: the window holds top_p of the whole vocabulary's mass.

    A real model's logits spread wide (a 49k vocabulary had 34k tokens within
    16 of the best): the first spread is small and doubles, so top_k 40 costs
    two or three passes, not a partition of the whole row."""
    num = row.shape[0]
    best = float(row.max())
    k = top_k if 0 < top_k < num else num
    if k == num and top_p >= 1.0 and min_p <= 0.0:
        ids = np.arange(num)
        ids = ids[np.argsort(-row, kind="stable")]
        return ids, row[ids], 1.0
    total = 0.0
    if k == num and top_p < 1.0:
        total = float(np.exp(row.astype(np.float64) - best).sum())
    # the min_p window, with a margin for float32 rounding (_keep cuts exactly)
    window = -math.log(min_p) + 1e-3 if min_p > 0.0 else 0.0
    spread = window if k == num and min_p > 0.0 else max(_SPREAD, window)
    if k < num and num >= _SUBSAMPLE * 4 * (k + _SUBSAMPLE):
        # Start from an estimate of the k-th best logit: a slightly lower rank
        # of every _SUBSAMPLE-th token, so one pass usually holds k (each extra
        # pass over the row costs as much as this estimate).
        sub = row[::_SUBSAMPLE]
        rank = k // _SUBSAMPLE + 8
        spread = max(spread, best - float(np.partition(sub, len(sub) - rank)[len(sub) - rank]))
    while True:
        ids = np.flatnonzero(row >= best - spread) if spread < math.inf else np.arange(num)
        if k < num:
            if len(ids) >= k:
                if len(ids) > k:
                    ids = ids[np.argpartition(-row[ids], k - 1)[:k]]
                break
        elif (
            min_p > 0.0
            or spread == math.inf
            or float(np.exp(row[ids].astype(np.float64) - best).sum()) >= top_p * total
        ):
            break
        spread = spread * 2 if spread < 256 else math.inf
    ids = ids[np.argsort(-row[ids], kind="stable")]
    logits = row[ids]
    if k == num and top_p < 1.0 and len(ids) < num:
        # top_p's mass is the whole vocabulary's: scale it to the candidates'
        top_p = top_p * total / float(np.exp(logits.astype(np.float64) - best).sum())
    return ids, logits, min(top_p, 1.0)


def _typical(ids: np.ndarray, logits: np.ndarray, typical_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Locally typical sampling (Meister et al., as llama.cpp's
    `llama_sampler_init_typical`): the tokens whose surprise is closest to
    the distribution's entropy, in that order, until their mass exceeds
    `typical_p`; returned best first again."""
    shifted = logits.astype(np.float64) - float(logits[0])
    log_probs = shifted - math.log(float(np.exp(shifted).sum()))
    probs = np.exp(log_probs)
    entropy = -float((probs * log_probs).sum())
    order = np.argsort(np.abs(-log_probs - entropy), kind="stable")
    mass = np.cumsum(probs[order])
    keep = min(len(order), int(np.searchsorted(mass, typical_p, side="right")) + 1)
    chosen = np.sort(order[:keep])  # positions in the best-first candidates: best first
    return ids[chosen], logits[chosen]


def _keep(sorted_logits: np.ndarray, top_p: float, min_p: float) -> int:
    """How many of the best-first candidates top_p (a share of their mass)
    and min_p (a share of the best token's probability) keep; at least one."""
    probs = np.exp(sorted_logits.astype(np.float64) - float(sorted_logits[0]))
    keep = len(probs)
    if top_p < 1.0:
        mass = np.cumsum(probs)
        keep = int(np.searchsorted(mass, top_p * mass[-1])) + 1
    if min_p > 0.0:
        keep = min(keep, int(np.count_nonzero(probs >= min_p)))
    return max(1, min(keep, len(probs)))


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


def greedy_rows(logits: np.ndarray, rows: Sequence[int], samplers: Sequence[NumpySampler]) -> list[int | None]:
    """The tokens of a step's plain greedy rows in one call: one argmax over
    all of them (`logits[rows[i]]` is `samplers[i]`'s row), each accepted by
    its sampler. None where a sampler refuses its argmax (a masked
    end-of-generation token): that row samples on its own."""
    if not rows:
        return []
    tokens = _block(logits, rows).argmax(axis=1).tolist()
    return [t if s.take(t) else None for s, t in zip(samplers, tokens, strict=True)]


def _block(logits: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    """`logits[rows]`: a view where the rows run consecutively (a step's
    usual case), else a copy."""
    first = rows[0]
    if rows[-1] - first == len(rows) - 1 and all(b - a == 1 for a, b in zip(rows, rows[1:], strict=False)):
        return logits[first : first + len(rows)]
    return logits[list(rows)]


def sample_rows(logits: np.ndarray, rows: Sequence[int], samplers: Sequence[NumpySampler]) -> list[int | None]:
    """The tokens of a step's `plain_sampled` rows (`logits[rows[i]]` is
    `samplers[i]`'s row), drawn as each sampler's own `sample` would draw
    them, with the same uniform number from its generator, so a seed gives
    the same tokens alone or beside any other rows. Each row's candidates
    are found row by row, in place (a row stays in the CPU's cache through
    its passes; all the rows at once were slower, 3 MB of logits for 16
    rows of SmolLM2 passing through memory once a pass), then top_p, min_p,
    the temperature and the draw run over all the rows' candidates at once:
    16 rows at the request defaults took 0.65 ms against 0.87 ms row by
    row. None where a row is left to its sampler's own path (every token
    masked, a subsample estimate holding fewer than top_k, a vocabulary too
    small for the estimate, fewer than `_ROWS_TOGETHER` rows of its top_k):
    call `sample` there. A row of `logits` may be
    changed while this runs; it is as it was when this returns."""
    out: list[int | None] = [None] * len(rows)
    if not rows:
        return out
    num = logits.shape[1]
    by_k: dict[int, list[int]] = {}
    for i, sampler in enumerate(samplers):  # a vocabulary too small for the estimate: row by row
        if sampler.params.top_k > 0 and num >= _SUBSAMPLE * 4 * (sampler.params.top_k + _SUBSAMPLE):
            by_k.setdefault(sampler.params.top_k, []).append(i)
    for k, members in by_k.items():
        if len(members) < _ROWS_TOGETHER:
            continue
        _sample_group(logits, [rows[i] for i in members], [samplers[i] for i in members], k, members, out)
    return out


def _sample_group(
    logits: np.ndarray,
    rows: list[int],
    samplers: list[NumpySampler],
    k: int,
    positions: list[int],
    out: list[int | None],
) -> None:
    """`sample_rows` for rows of one top_k. The candidates are the tokens at
    or above `_candidates`' estimate of the k-th best logit (a lower rank of
    every _SUBSAMPLE-th token), cut to the k best as `_candidates` cuts
    them: the same k tokens in the same order, whatever spread found them.
    A row where the estimate holds fewer than k goes back to its sampler."""
    num = logits.shape[1]
    block = _block(logits, rows)
    masked: list[tuple[int, np.ndarray, np.ndarray]] = []  # (row in block, token ids, their logits before)
    kept: list[int] = []
    ids: list[np.ndarray] = []
    cand: list[np.ndarray] = []
    try:
        for i, sampler in enumerate(samplers):
            eog = sampler._eog
            if sampler._count < sampler._suppress_until and eog is not None:
                masked.append((i, eog, block[i, eog].copy()))
                block[i, eog] = -np.inf
        kth = len(range(0, num, _SUBSAMPLE)) - (k // _SUBSAMPLE + 8)
        for i in range(len(rows)):  # row by row: one row stays in the CPU's cache through its passes
            row = block[i]
            threshold = np.partition(row[::_SUBSAMPLE], kth)[kth]
            found = np.flatnonzero(row >= threshold)
            if len(found) >= k and np.isfinite(threshold):
                if len(found) > k:
                    found = found[np.argpartition(-row[found], k - 1)[:k]]
                found = found[np.argsort(-row[found], kind="stable")]
                kept.append(i)
                ids.append(found)
                cand.append(row[found])
    finally:
        for i, eog, before in masked:
            block[i, eog] = before
    if kept:
        _draw_rows(np.array(ids), np.array(cand), [samplers[i] for i in kept], [positions[i] for i in kept], out)


def _draw_rows(
    ids: np.ndarray, cand: np.ndarray, samplers: list[NumpySampler], positions: list[int], out: list[int | None]
) -> None:
    """top_p, min_p, temperature and the draw over rows of k candidates
    each, best first (`ids`, `cand`): `_keep` and `NumpySampler._draw`,
    row by row the same arithmetic."""
    num_rows, k = cand.shape
    params = [s.params for s in samplers]
    shifted = cand.astype(np.float64) - cand[:, :1].astype(np.float64)
    probs = np.exp(shifted)
    keep = np.full(num_rows, k, dtype=np.int64)
    top_p = np.array([min(p.top_p, 1.0) for p in params], dtype=np.float64)
    if (top_p < 1.0).any():
        mass = np.cumsum(probs, axis=1)
        by_top_p = (mass < (top_p * mass[:, -1])[:, None]).sum(axis=1) + 1
        keep = np.where(top_p < 1.0, by_top_p, keep)
    min_p = np.array([p.min_p for p in params], dtype=np.float64)
    if (min_p > 0.0).any():
        keep = np.where(min_p > 0.0, np.minimum(keep, (probs >= min_p[:, None]).sum(axis=1)), keep)
    keep = np.clip(keep, 1, k)
    temperature = np.array([p.temperature for p in params], dtype=np.float64)
    weights = np.exp(shifted / temperature[:, None])
    outside = np.arange(k) >= keep[:, None]
    weights[outside] = 0.0
    cumulative = np.cumsum(weights, axis=1)
    total = cumulative[np.arange(num_rows), keep - 1]
    draws = np.array([s._rng.random() for s in samplers]) * total
    index = ((cumulative <= draws[:, None]) & ~outside).sum(axis=1)
    index = np.minimum(index, keep - 1)
    tokens = ids[np.arange(num_rows), index].tolist()
    for sampler, position, token in zip(samplers, positions, tokens, strict=True):
        sampler.took(token)
        out[position] = token
