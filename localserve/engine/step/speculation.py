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
decoding sequence's token, b + c, and where the backend computes a
sequence's drafts in a forward pass of their own (`Capacity.slot_streams`:
llama.cpp with a KV stream per slot), each drafting sequence of a shared
step adds that pass, a (`draft_lengths`). Each sequence's alpha follows its
own recent acceptance. Whether drafting paid is measured too (`DraftPayoff`),
and a step-time model that drafting itself misleads cannot keep it going.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from localserve.engine.types import Capacity, SchedulerConfig, SeqChunk, StepPlan, StepResult

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
                # The passage may run into the tail itself (a loop of period
                # len - start): it then goes on with the tokens drafted so far.
                draft = list(token_ids[start : start + max_tokens])
                period = len(token_ids) - start
                while len(draft) < max_tokens:
                    draft.append(draft[len(draft) - period])
                return draft
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
    own_pass: bool = False,
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
    cost them 16% of their throughput.

    `own_pass`: each drafting sequence's drafts are a forward pass of their
    own (`Capacity.slot_streams`, in a step of more than one sequence), which
    costs what a step costs, a, besides its tokens. llama.cpp with a KV
    stream per slot splits a step into micro-batches of equal tokens per
    sequence: 16 decoding sequences of which one drafts 8 tokens are two
    passes over the weights (SmolLM2, 2 threads: 137 ms against 78 ms)."""
    a, b, c = coefficients
    per_draft = b + c
    per_drafter = a if own_pass and num_seqs > 1 else 0.0
    best_k, best_rate = 0, 0.0
    base_time = a + b * num_tokens + c * num_seqs
    if base_time <= 0.0:
        return 0
    base_yield = float(num_seqs)
    best_rate = base_yield / base_time
    for k in range(1, max_draft + 1):
        extra_time = 0.0
        gain = 0.0
        for acceptance, available in proposals:
            n = min(k, available)
            extra_time += per_draft * n + (per_drafter if n else 0.0)
            gain += expected_tokens(acceptance, n) - 1.0
        rate = (base_yield + gain) / (base_time + extra_time)
        if rate > best_rate * (1.0 + 1e-9):
            best_k, best_rate = k, rate
    return best_k


#: Steps of each kind a payoff rate remembers (exponential decay).
PAYOFF_MEMORY_STEPS = 32
#: Drafted and plain steps a bucket must have seen before its drafting may be stopped.
PAYOFF_MIN_STEPS = 4
#: A bucket whose drafting did not pay drafts again for a few steps after this
#: many plain steps, so a change (of text, of load, of the machine) is noticed.
PAYOFF_RETRY_EVERY = 512
#: Where a step is shared, drafting must win by this much: the tokens it adds
#: go to the sequences that draft, the longer step to every one in it.
PAYOFF_SHARED_MARGIN = 1.1
#: A shared step's drafts may make it at most this much longer than it would
#: be without them (by the step-time model), so that one sequence's drafts
#: never stall the others it shares the step with.
SHARED_STEP_STRETCH = 1.5


def payoff_bucket(num_seqs: int) -> int:
    """Steps are compared among steps of about as many sequences: 1, 2-3, 4-7, 8-15, ..."""
    return max(1, num_seqs).bit_length()


@dataclass(slots=True)
class _Rate:
    """Tokens out per second of step time, over recent steps of one kind."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        decay = 1.0 - 1.0 / PAYOFF_MEMORY_STEPS
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds
        self.steps += 1

    @property
    def value(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0.0 else 0.0


@dataclass(slots=True)
class _Bucket:
    drafted: _Rate = field(default_factory=_Rate)
    plain: _Rate = field(default_factory=_Rate)
    retry_in: int = PAYOFF_RETRY_EVERY  # plain steps until a stopped bucket drafts again
    retry_left: int = 0  # drafting steps left of a retry


class DraftPayoff:
    """Whether drafting pays, measured: the tokens per second of decode steps
    that verified drafts against those that did not, among steps of about as
    many sequences (`payoff_bucket`).

    `draft_lengths` decides from a linear step-time model, and a CPU's steps
    are not linear in their tokens: on 2 cores (SmolLM2), 8 sequences with one
    draft each, accepted 98% of the time, took 100 ms a step against 45 ms
    without drafts (16 tokens for 8: 0.16 against 0.18 tokens per ms), while
    the model, fit mostly on prompt chunks, priced them as a gain; at one
    sequence the same drafts won 15%. So the model chooses how many drafts,
    and this measurement says whether to draft at all: a bucket whose drafted
    steps yield fewer tokens per second than its plain ones stops drafting,
    and after every `PAYOFF_RETRY_EVERY` plain steps measures drafting afresh
    for `PAYOFF_MIN_STEPS` steps."""

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}

    def allows(self, num_seqs: int) -> bool:
        """May a step of `num_seqs` sequences draft? Not while a bucket's
        drafted steps are measured and its plain ones are not: those steps
        run plain until they are (else a step-time model that drafting
        misleads, as its slow steps raise the fixed cost that makes drafts
        look cheap, could keep every step drafting, unmeasured)."""
        bucket = self._buckets.get(payoff_bucket(num_seqs))
        if bucket is None:
            return True
        if bucket.plain.steps < PAYOFF_MIN_STEPS:
            return bucket.drafted.steps < PAYOFF_MIN_STEPS
        if bucket.retry_left > 0 or not self._measured(bucket):
            return True
        return self._pays(num_seqs, bucket)

    def stopped(self, num_seqs: int) -> bool:
        """Drafting measured not to pay at this many sequences (for the stats)."""
        return not self.allows(num_seqs)

    def observe(self, num_seqs: int, num_tokens_out: int, seconds: float, drafted: bool) -> None:
        """A decode step (no prompt tokens) of `num_seqs` sequences ran in
        `seconds` and yielded `num_tokens_out` tokens; `drafted`: it verified drafts."""
        if num_seqs <= 0 or not 0.0 < seconds < math.inf:
            return
        bucket = self._buckets.setdefault(payoff_bucket(num_seqs), _Bucket())
        if drafted:
            bucket.drafted.add(num_tokens_out, seconds)
            bucket.retry_left = max(0, bucket.retry_left - 1)
            return
        bucket.plain.add(num_tokens_out, seconds)
        if self._measured(bucket) and not self._pays(num_seqs, bucket):
            bucket.retry_in -= 1
            if bucket.retry_in <= 0:  # the retry's drafted steps are measured afresh
                bucket.retry_in, bucket.retry_left = PAYOFF_RETRY_EVERY, PAYOFF_MIN_STEPS
                bucket.drafted = _Rate()

    @staticmethod
    def _pays(num_seqs: int, bucket: _Bucket) -> bool:
        margin = 1.0 if num_seqs <= 1 else PAYOFF_SHARED_MARGIN
        return bucket.drafted.value >= margin * bucket.plain.value

    @staticmethod
    def _measured(bucket: _Bucket) -> bool:
        return bucket.drafted.steps >= PAYOFF_MIN_STEPS and bucket.plain.steps >= PAYOFF_MIN_STEPS


class DraftPlanner:
    """The scheduler's speculation step: once a step is planned, its decoding
    sequences may add drafted tokens with the budget and KV room it leaves,
    never at another request's cost, as many as `draft_lengths` says pay."""

    def __init__(self, config: SchedulerConfig, capacity: Capacity) -> None:
        self.max_draft = min(config.draft_max, capacity.max_draft_tokens)
        self.max_copy_draft = max(self.max_draft, capacity.max_draft_tokens)  # a long match's drafts
        self.draft_model = config.speculative == "draft"
        self._n_ctx = capacity.n_ctx
        self._kv_size = capacity.kv_size
        self._slot_streams = capacity.slot_streams
        self.payoff = DraftPayoff()
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
        if not self.max_draft or not self.payoff.allows(plan.num_seqs):
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
        a, b, c = coefficients()
        k = draft_lengths(
            [(acceptance, len(d)) for _, d, acceptance in proposals],
            num_tokens=plan.num_tokens,
            num_seqs=plan.num_seqs,
            coefficients=(a, b, c),
            max_draft=max(len(d) for _, d, _ in proposals),
            own_pass=self._slot_streams,
        )
        room = plan.budget  # drafted tokens the step may still take
        if plan.num_seqs > 1 and b + c > 0.0:
            base_s = a + b * plan.num_tokens + c * plan.num_seqs
            room = min(room, int((SHARED_STEP_STRETCH - 1.0) * base_s / (b + c)))
        proposals.sort(key=lambda proposal: -proposal[2])  # the likeliest drafts first
        for seq, draft_ids, _ in proposals:
            take = min(k, len(draft_ids), room, plan.budget, self._kv_size - plan.kv_used)
            room -= max(take, 0)
            if take > 0 and self.draft_model:
                plan.add_model_drafts(seq, take)
            elif take > 0:
                plan.add_drafts(seq, draft_ids[:take])
            elif seq.spec is not None:
                seq.spec.rest()

    def observe(self, batch: StepPlan, result: StepResult) -> None:
        """Feed a measured decode step (every chunk one token, plus its drafts) to `payoff`."""
        if not self.max_draft or result.seconds is None:
            return
        num_drafts = 0
        for chunk in batch.chunks:
            if not chunk.sample or len(chunk.token_ids) != 1 + chunk.num_draft:
                return  # a prompt chunk: its cost says nothing of drafting
            num_drafts += chunk.num_draft + result.drafted.get(chunk.seq_id, 0)
        tokens_out = len(result.sampled) + sum(len(accepted) for accepted in result.accepted.values())
        self.payoff.observe(len(batch.chunks), tokens_out, result.seconds, num_drafts > 0)


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
