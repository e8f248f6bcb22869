"""Per-sequence llama.cpp sampler chains and log-probabilities.

The chain follows llama.cpp's own default order, cheapest cuts first:
logit bias -> grammar -> penalties -> top_k -> top_p -> min_p -> temperature
-> dist(seed). Samplers that would be no-ops (top_p = 1, min_p = 0, no
penalties) are left out: each one costs a pass over the candidates.
"""

from __future__ import annotations

import ctypes
import random

import llama_cpp
import numpy as np

from localserve.engine.types import SamplingParams, TokenLogprob
from localserve.errors import InvalidRequestError


class SamplerChain:
    """One sequence's sampler chain; owns the native object."""

    __slots__ = ("_chain",)

    def __init__(self, params: SamplingParams, vocab: llama_cpp.llama_vocab_p, n_vocab: int) -> None:
        chain_params = llama_cpp.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(chain_params)
        try:
            for sampler in _samplers(params, vocab, n_vocab):
                llama_cpp.llama_sampler_chain_add(self._chain, sampler)
        except BaseException:
            self.free()
            raise

    def sample(self, ctx: llama_cpp.llama_context_p, batch_index: int) -> int:
        """Sample (and accept) the next token from the logits at `batch_index`."""
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index))

    def free(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None


def _samplers(params: SamplingParams, vocab: llama_cpp.llama_vocab_p, n_vocab: int) -> list[llama_cpp.llama_sampler_p]:
    out = []
    if params.logit_bias:
        biases = (llama_cpp.llama_logit_bias * len(params.logit_bias))()
        for i, (token, bias) in enumerate(params.logit_bias):
            biases[i].token = token
            biases[i].bias = bias
        out.append(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), biases))
    if params.grammar:
        grammar = llama_cpp.llama_sampler_init_grammar(vocab, params.grammar.encode("utf-8"), b"root")
        if not grammar:
            for sampler in out:
                llama_cpp.llama_sampler_free(sampler)
            raise InvalidRequestError("the grammar (from response_format or tools) could not be parsed")
        out.append(grammar)
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
