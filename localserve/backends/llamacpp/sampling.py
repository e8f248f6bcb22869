"""Per-sequence llama.cpp sampler chains and log-probabilities.

The chain follows llama.cpp's own default order, cheapest cuts first:
logit bias -> (grammar, see SamplerChain) -> penalties -> top_k -> typical_p -> top_p -> min_p -> temperature
-> dist(seed). Samplers that would be no-ops (top_p = 1, min_p = 0, no
penalties) are left out: each one costs a pass over the candidates.
"""

from __future__ import annotations

import ctypes
import random
from collections.abc import Collection, Sequence

import llama_cpp
import numpy as np

from localserve.backends.constraints import GrammarMatcher, ThinkBudget
from localserve.engine.types import SamplingParams, TokenLogprob
from localserve.errors import InvalidRequestError


class SamplerChain:
    """One sequence's sampler chain; owns the native objects.

    Two paths. Without grammar or suppressed tokens, llama.cpp samples and
    accepts in one native call. With a grammar (backends/constraints.py):
    sample without it, ask the matcher whether the chosen token is allowed,
    and only when it is not, mask the candidates and sample again.
    End-of-generation tokens are masked while `min_tokens` are not yet out,
    and always under `ignore_eos` (the model then never emits them, as in
    llama.cpp's server), except where the grammar allows nothing but the
    end: the grammar wins, and `ended` says so.
    """

    __slots__ = (
        "_chain",
        "_matcher",
        "_budget",
        "_eog",
        "_suppress_until",
        "_count",
        "_n_vocab",
        "_cands",
        "_ids",
        "ended",
    )

    def __init__(
        self,
        params: SamplingParams,
        n_vocab: int,
        eog_token_ids: Collection[int] = (),
        matcher: GrammarMatcher | None = None,
        budget: ThinkBudget | None = None,
    ) -> None:
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        self._matcher = matcher
        self._budget = budget
        self._n_vocab = n_vocab
        self._count = 0
        self._cands: np.ndarray | None = None
        self._ids: np.ndarray | None = None
        self.ended = False  # the grammar ended the sequence (its last token is an end the grammar forced)
        # ignore_eos: a native logit-bias sampler masks end-of-generation for good;
        # min_tokens: the Python path masks it for the first tokens only.
        limit = 0 if params.ignore_eos else params.min_tokens
        self._eog = np.fromiter(sorted(eog_token_ids), dtype=np.int64) if limit and eog_token_ids else None
        self._suppress_until = limit if self._eog is not None else 0
        try:
            samplers = _samplers(params, n_vocab)
            if params.ignore_eos and eog_token_ids:
                samplers.insert(0, _logit_bias([(t, float("-inf")) for t in sorted(eog_token_ids)], n_vocab))
            for sampler in samplers:
                llama_cpp.llama_sampler_chain_add(self._chain, sampler)
        except BaseException:
            self.free()
            raise

    @property
    def matcher(self) -> GrammarMatcher | None:
        return self._matcher

    def sample(self, ctx: llama_cpp.llama_context_p, batch_index: int) -> int:
        """Sample (and accept) the next token from the logits at `batch_index`;
        the closing marker's tokens instead once a think budget is spent."""
        budget = self._budget
        if budget is None:
            return self._sample(ctx, batch_index)
        token = budget.forced()
        if token is None:
            token = self._sample(ctx, batch_index)
        else:
            self._count += 1
            if self._matcher is not None:
                self._matcher.consume(token)
            llama_cpp.llama_sampler_accept(self._chain, token)
        budget.note(token)
        return token

    def _sample(self, ctx: llama_cpp.llama_context_p, batch_index: int) -> int:
        suppress = self._count < self._suppress_until
        self._count += 1
        matcher = self._matcher
        if matcher is None and not suppress:
            return int(llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index))
        pointer = llama_cpp.llama_get_logits_ith(ctx, batch_index)
        logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(self._n_vocab,))
        if matcher is not None and matcher.done:
            return self._end(matcher)
        token = self._pick(logits, suppress, with_grammar=False)
        if matcher is not None and (token < 0 or not matcher.allows(token)):
            token = self._pick(logits, suppress, with_grammar=True)
            if token < 0 and matcher.accepting:  # only the end is allowed, and it is suppressed
                return self._end(matcher)
        if token < 0:
            raise InvalidRequestError("no token is allowed here (grammar and suppressed tokens exclude them all)")
        if matcher is not None:
            matcher.consume(token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _end(self, matcher: GrammarMatcher) -> int:
        self.ended = True
        return matcher.end_token

    def _pick(self, logits: np.ndarray, suppress: bool, *, with_grammar: bool) -> int:
        """The chain's choice over `logits` (masked by the grammar if asked),
        without accepting it; -1 when every token is excluded."""
        if self._cands is None:
            self._cands = np.empty(self._n_vocab, dtype=_TOKEN_DATA)
            self._ids = np.arange(self._n_vocab, dtype=np.int32)
        cands = self._cands
        cands["id"] = self._ids
        cands["logit"] = logits
        cands["p"] = 0.0
        if suppress:
            cands["logit"][self._eog] = -np.inf
        if with_grammar:
            assert self._matcher is not None
            self._matcher.apply(cands["logit"])
            if not np.isfinite(cands["logit"]).any():
                return -1
        array = llama_cpp.llama_token_data_array(
            data=cands.ctypes.data_as(llama_cpp.llama_token_data_p), size=self._n_vocab, selected=-1, sorted=False
        )
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        if array.selected < 0:
            return -1
        token = int(array.data[array.selected].id)
        return token if np.isfinite(array.data[array.selected].logit) else -1

    def free(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


def _logit_bias(pairs: Sequence[tuple[int, float]], n_vocab: int) -> llama_cpp.llama_sampler_p:
    """A native sampler adding `bias` to the logit of each `(token, bias)`; -inf bans the token."""
    biases = (llama_cpp.llama_logit_bias * len(pairs))()
    for i, (token, bias) in enumerate(pairs):
        biases[i].token, biases[i].bias = token, bias  # type: ignore[assignment]  # an int, as for llama_token_data
    return llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(pairs), biases)


_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def _samplers(params: SamplingParams, n_vocab: int) -> list[llama_cpp.llama_sampler_p]:
    """The chain's samplers."""
    out = []
    if params.logit_bias:
        out.append(_logit_bias(params.logit_bias, n_vocab))
    if params.repeat_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
        out.append(
            llama_cpp.llama_sampler_init_penalties(
                n_vocab,
                params.penalty_last_n,
                params.repeat_penalty,
                params.frequency_penalty,
                params.presence_penalty,
            )
        )
    if params.greedy:
        out.append(llama_cpp.llama_sampler_init_greedy())
        return out
    if params.top_k > 0:
        out.append(llama_cpp.llama_sampler_init_top_k(params.top_k))
    if params.typical_p < 1.0:
        out.append(llama_cpp.llama_sampler_init_typical(params.typical_p, 1))
    if params.top_p < 1.0:
        out.append(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        out.append(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
    out.append(llama_cpp.llama_sampler_init_temp(params.temperature))
    seed = params.seed if params.seed is not None else random.getrandbits(32)
    out.append(llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF))
    return out


def token_logprob(
    ctx: llama_cpp.llama_context_p, batch_index: int, n_vocab: int, token_id: int, num_top: int
) -> TokenLogprob:
    """Log-probability of `token_id` under the model's raw distribution at
    `batch_index`, with the `num_top` most likely alternatives."""
    pointer = llama_cpp.llama_get_logits_ith(ctx, batch_index)
    logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))
    shifted = logits.astype(np.float64) - float(logits.max())
    log_norm = float(np.log(np.exp(shifted).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if num_top > 0:
        best = np.argpartition(-shifted, num_top)[:num_top]
        best = best[np.argsort(-shifted[best])]
        top = tuple((int(t), float(shifted[t] - log_norm)) for t in best)
    return TokenLogprob(token_id=token_id, logprob=float(shifted[token_id] - log_norm), top=top)
