"""Speculative decoding: draft tokens for a sequence, and how many are worth verifying.

A decoding sequence may carry k drafted tokens into a step. The backend
feeds ``[last token, draft_1 .. draft_k]`` in the step's one forward pass,
with logits at each of those positions, and samples them in order with the
sequence's own sampler chain: while the sampled token equals the next draft
token, the next position's logits are valid and it samples again. Every
token it returns is a true sample of the model given the tokens before it,
so the output is what decoding one token a step would give: at
temperature 0 exactly (for the same batch composition), and with sampling
the same distribution. For a proposer whose draft is one token with
certainty (prompt lookup here; a greedy draft model), "sample and compare"
*is* the standard acceptance rule: accept draft x with probability
min(1, p(x)/q(x)) = p(x), and on a rejection sample from the residual
normalised (p with x removed), which is what the sample that differed was
drawn from. `accept_drafts` states the general rule (a stochastic q) and the
tests check both against each other. Because each sampler chain samples and
accepts its tokens in order, grammars, logit bias, penalties, `min_tokens`,
`logprobs` and seeded sampling all see the same token stream with or
without speculation.

The proposer here is prompt lookup (`NgramDrafter`): the longest recent
n-gram at the sequence's end that occurred before, in its prompt or its
output, proposes the tokens that followed it then. No second model; it wins
where output copies input (editing, rewriting, code, quoting) and proposes
nothing on ordinary chat. When the tail matches the earlier passage for
LONG_MATCH tokens or more, the sequence is copying: its drafts may run to
the backend's limit (32) rather than `--draft-max`, and its acceptance is
taken as at least what the match's length says (`match_acceptance`), as
llama-server's `ngram-mod` drafts 48-64 tokens behind a 24-token match.

How many to verify (`draft_lengths`): a step costs about
``a + b * tokens + c * sequences`` (`StepTimeModel`, learned from the steps
that ran), and a sequence whose drafts are accepted with probability alpha
each gains ``(1 - alpha**(k+1)) / (1 - alpha)`` tokens from k drafts. The
scheduler picks the one cap K on draft length for the step that gives the
most expected tokens per predicted second, K = 0 (no speculation) included,
so a compute-bound step drafts nothing. A drafted token is priced as a
decoding sequence's token, b + c (`draft_lengths`). Each sequence's alpha
follows its own recent acceptance.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from localserve.engine.types import Capacity, SchedulerConfig, SeqChunk, StepResult

if TYPE_CHECKING:  # sequence.py holds a SpecState per sequence
    from localserve.engine.step.kv_slots import StepDraft
    from localserve.engine.step.sequence import Sequence

NGRAM_SIZES = (4, 3, 2)  # longest first: a longer match predicts better
#: A tail that matches an earlier passage for at least this many tokens is
#: being copied: its drafts may run to the backend's limit, not `--draft-max`.
LONG_MATCH = 16
MATCH_LOOKBACK = 64  # how far back a match is measured
PRIOR_ACCEPTANCE = 0.7  # a new sequence's acceptance rate until it has drafted
ACCEPTANCE_MEMORY = 0.3  # weight of the newest step in a sequence's acceptance rate
RECOVERY = 0.02  # a step with drafts on offer but none verified moves the rate this much back toward the prior


@dataclass(slots=True)
class NgramDrafter:
    """Prompt lookup over one sequence's tokens, with an index kept up to date
    incrementally: for each n, the n-gram -> the position right after its most
    recent occurrence that ends before the sequence's last token."""

    indexes: dict[int, dict[tuple[int, ...], int]] = field(default_factory=lambda: {n: {} for n in NGRAM_SIZES})
    num_indexed: int = 0  # positions whose n-grams ending there are in the indexes
    match_len: int = 0  # how many tokens of the tail the last proposal's passage matched (<= MATCH_LOOKBACK)

    def propose(self, token_ids: Seq[int], max_tokens: int) -> list[int]:
        """Up to `max_tokens` tokens that followed the last occurrence of the
        sequence's longest matching tail n-gram; [] when none matches.
        `match_len` tells how long the match runs back."""
        self.match_len = 0
        if max_tokens <= 0:
            return []
        end = len(token_ids) - 1  # index n-grams ending before the last token only
        for i in range(max(self.num_indexed, 1), end):
            for n, index in self.indexes.items():
                if i + 1 >= n:
                    index[tuple(token_ids[i + 1 - n : i + 1])] = i + 1
        self.num_indexed = max(self.num_indexed, end)
        for n in NGRAM_SIZES:
            if len(token_ids) < n:
                continue
            start = self.indexes[n].get(tuple(token_ids[-n:]))
            if start is not None:
                length = n
                while (
                    length < MATCH_LOOKBACK
                    and start - length > 0
                    and token_ids[start - 1 - length] == token_ids[-1 - length]
                ):
                    length += 1
                self.match_len = length
                return list(token_ids[start : start + max_tokens])
        return []


@dataclass(slots=True)
class SpecState:
    """One sequence's speculation: its drafter and its recent acceptance rate."""

    drafter: NgramDrafter = field(default_factory=NgramDrafter)
    acceptance: float = PRIOR_ACCEPTANCE
    num_drafted: int = 0
    num_accepted: int = 0

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        """A step verified `num_drafted` drafts and kept `num_accepted`."""
        if num_drafted <= 0:
            return
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        rate = num_accepted / num_drafted
        self.acceptance += ACCEPTANCE_MEMORY * (rate - self.acceptance)

    def rest(self) -> None:
        """Drafts were on offer but the step verified none: the rate drifts
        back toward the prior, so a sequence whose drafts once failed is
        tried again now and then (the text it copies may have changed)."""
        self.acceptance += RECOVERY * (PRIOR_ACCEPTANCE - self.acceptance)


def match_acceptance(match_len: int) -> float:
    """What a match this long says of the next token's acceptance (the rule
    of succession: a passage copied for L tokens goes on with (L+1)/(L+2)),
    for a copy at least LONG_MATCH tokens long; 0 below."""
    return (match_len + 1) / (match_len + 2) if match_len >= LONG_MATCH else 0.0


def expected_tokens(acceptance: float, num_draft: int) -> float:
    """Tokens a step yields for a sequence verifying `num_draft` drafts, each
    accepted with probability `acceptance` given the ones before it were."""
    if num_draft <= 0:
        return 1.0
    if acceptance >= 1.0:
        return float(num_draft + 1)
    return (1.0 - acceptance ** (num_draft + 1)) / (1.0 - acceptance)


def draft_lengths(
    proposals: Seq[tuple[float, int]],
    *,
    num_tokens: int,
    num_seqs: int,
    coefficients: tuple[float, float, float],
    max_draft: int,
) -> int:
    """The cap K on draft length that gives the step the most expected tokens
    per predicted second. `proposals` are (acceptance, drafts available) of
    the sequences that could draft; the step already holds `num_tokens`
    tokens of `num_seqs` sequences (each of those yields one token, or its
    prompt chunk); `coefficients` are the step-time model's (a, b, c).

    A drafted token costs b + c, what a decoding sequence's token costs: it
    has its own logits row and sample, as a sequence does. Pricing it at b
    alone, the cost of a token in a long prompt chunk, was far too cheap on
    a CPU, where a token in a small step costs several times more (SmolLM2,
    2 threads: a step of 16 tokens is 8.2x a one-token step, one of 64
    tokens 24x, `bench/verify_cost.py`): 16 chat streams drafted where it
    cost them 16% of their throughput."""
    a, b, c = coefficients
    per_draft = b + c
    best_k, best_rate = 0, 0.0
    base_time = a + b * num_tokens + c * num_seqs
    if base_time <= 0.0:
        return 0
    base_yield = float(num_seqs)
    best_rate = base_yield / base_time
    for k in range(1, max_draft + 1):
        extra_tokens = 0
        gain = 0.0
        for acceptance, available in proposals:
            n = min(k, available)
            extra_tokens += n
            gain += expected_tokens(acceptance, n) - 1.0
        rate = (base_yield + gain) / (base_time + per_draft * extra_tokens)
        if rate > best_rate * (1.0 + 1e-9):
            best_k, best_rate = k, rate
    return best_k


class DraftPlanner:
    """The scheduler's speculation step: once a step is planned, its decoding
    sequences may add drafted tokens with the budget and KV room it leaves,
    never at another request's cost, as many as `draft_lengths` says pay."""

    def __init__(self, config: SchedulerConfig, capacity: Capacity) -> None:
        self.max_draft = min(config.draft_max, capacity.max_draft_tokens)
        self.max_copy_draft = max(self.max_draft, capacity.max_draft_tokens)  # a long match's drafts
        self.draft_model = config.speculative == "draft"
        self._n_ctx = capacity.n_ctx
        self._kv_tokens = capacity.kv_tokens
        if config.speculative == "off":
            self.max_draft = 0
        elif config.speculative not in ("ngram", "draft"):
            raise ValueError(f"unknown speculative mode {config.speculative!r} (off, ngram, draft)")
        elif self.draft_model and not capacity.has_draft_model:
            raise ValueError("speculative mode 'draft' needs a draft model (--draft-model PATH)")

    def add_drafts(
        self,
        plan: StepDraft,
        coefficients: Callable[[], tuple[float, float, float]],
        limited: Callable[[Sequence], bool],
    ) -> None:
        """Drafts for the step's decoding sequences (not for batch work that
        is `limited`), from the budget and KV room `plan` leaves, as many as
        pay under the step-time model's `coefficients()`."""
        if not self.max_draft:
            return
        proposals: list[tuple[Sequence, list[int], float]] = []
        for seq, num_new in plan.scheduled.items():
            if num_new != 1 or seq.num_computed_tokens != seq.num_tokens - 1 or seq.num_output_tokens == 0:
                continue  # a prompt chunk, or the prompt's last token: no output to draft after yet
            if not seq.sampling.speculative or limited(seq):
                continue
            if seq.spec is None:
                seq.spec = SpecState()
            # The last sampled token is free; positions stay inside the context.
            limit = min(seq.sampling.max_tokens - seq.num_output_tokens - 1, self._n_ctx - seq.num_tokens - 1)
            if self.draft_model:
                draft_ids, acceptance = [-1] * min(self.max_draft, limit), seq.spec.acceptance
            else:
                draft_ids = seq.spec.drafter.propose(seq.token_ids, min(self.max_copy_draft, limit))
                copying = match_acceptance(seq.spec.drafter.match_len)
                if not copying:
                    del draft_ids[self.max_draft :]
                acceptance = max(seq.spec.acceptance, copying)
            if draft_ids:
                proposals.append((seq, draft_ids, acceptance))
        if not proposals:
            return
        k = draft_lengths(
            [(acceptance, len(d)) for _, d, acceptance in proposals],
            num_tokens=plan.num_tokens,
            num_seqs=plan.num_seqs,
            coefficients=coefficients(),
            max_draft=max(len(d) for _, d, _ in proposals),
        )
        for seq, draft_ids, _ in proposals:
            take = min(k, len(draft_ids), plan.budget, self._kv_tokens - plan.kv_used)
            if take > 0 and self.draft_model:
                plan.add_model_drafts(seq, take)
            elif take > 0:
                plan.add_drafts(seq, draft_ids[:take])
            elif seq.spec is not None:
                seq.spec.rest()


def kept_cells(chunk: SeqChunk, result: StepResult) -> tuple[int, ...]:
    """The tokens whose cells the backend kept after `chunk`: the chunk's own
    tokens, then each accepted draft, which equals the token sampled before it
    (the first sampled, then all but the last accepted)."""
    kept = chunk.token_ids[: len(chunk.token_ids) - chunk.num_draft]
    accepted = result.accepted.get(chunk.seq_id, ())
    if accepted:
        kept += (result.sampled[chunk.seq_id].token_id, *(t.token_id for t in accepted[:-1]))
    return kept


def accept_drafts(
    target: np.ndarray, draft: np.ndarray, draft_ids: Seq[int], rng: np.random.Generator
) -> tuple[list[int], int]:
    """The standard speculative-sampling rule for a stochastic proposer
    (Leviathan et al. 2023; Chen et al. 2023). `target[i]` and `draft[i]` are
    the target's and the proposer's distributions at draft position i
    (`target` has one more row: the position after the last draft). Accept
    draft x with probability min(1, p(x)/q(x)); at the first rejection sample
    from the normalised residual max(0, p - q) and stop; if all are accepted,
    sample one more token from the last row. Returns the tokens and the
    number of drafts accepted. (The engine's proposers are deterministic, for
    which this is "sample from p and compare"; this states the rule they
    follow, and the tests hold the two to the same distribution.)"""
    out: list[int] = []
    for i, x in enumerate(draft_ids):
        p, q = target[i], draft[i]
        if q[x] <= 0.0 or rng.random() < min(1.0, p[x] / q[x]):
            out.append(int(x))
            continue
        residual = np.maximum(p - q, 0.0)
        total = residual.sum()
        residual = residual / total if total > 0 else p
        out.append(int(rng.choice(len(p), p=residual)))
        return out, i
    last = target[len(draft_ids)]
    out.append(int(rng.choice(len(last), p=last)))
    return out, len(draft_ids)
