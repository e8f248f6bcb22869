"""A request's options -> the engine's `SamplingParams` for each choice
(with the grammar serving/grammar.py builds)."""

from __future__ import annotations

import asyncio
import dataclasses

from localserve.engine.backend import GenerativeBackend
from localserve.engine.types import SamplingParams
from localserve.errors import InvalidRequestError
from localserve.serving.types import Options

#: What a request gets for each cut it leaves out: llama-server's defaults
#: (top_k 40, top_p 0.95, min_p 0.05). Its own values win, including those
#: that turn a cut off (top_k 0, top_p 1, min_p 0). The OpenAI API names no
#: top_k or min_p and defaults top_p to 1; Ollama's own defaults (top_k 40,
#: top_p 0.9, min_p 0) apply to its dialect (serving/ollama/request.py). Besides
#: matching the server users compare us with, the cuts make sampling cheap:
#: without top_k, top_p sorts the whole vocabulary for every token.
REQUEST_DEFAULTS = SamplingParams(top_k=40, top_p=0.95, min_p=0.05)


def sampling_for(options: Options, *, num_prompt_tokens: int, n_ctx: int, grammar: str | None = None) -> SamplingParams:
    """The engine's parameters for one choice.

    No `max_tokens` means "until the context is full", as with OpenAI; a
    larger one is cut to the room left in the context (the answer then ends
    with finish reason "length"). `context_limit` (Ollama's `num_ctx`) is
    the context instead when it leaves room for an answer.
    """
    limit = options.context_limit
    ctx = min(n_ctx, limit) if limit and limit > num_prompt_tokens else n_ctx
    room = max(1, ctx - num_prompt_tokens)
    max_tokens = options.max_tokens
    sampling = options.sampling
    return dataclasses.replace(
        sampling,
        max_tokens=min(max_tokens, room) if max_tokens is not None else room,
        penalty_last_n=ctx if sampling.penalty_last_n == -1 else sampling.penalty_last_n,
        logprobs=options.num_logprobs,
        grammar=grammar,
    )


def per_choice(params: SamplingParams, index: int) -> SamplingParams:
    """Choice `index` of n: with a seed, seed + index, so the n choices differ
    yet the whole answer is reproducible."""
    if params.seed is None or index == 0:
        return params
    return dataclasses.replace(params, seed=params.seed + index)


async def validate(backend: GenerativeBackend, params: SamplingParams, *, param: str) -> None:
    """Refuse now (400) what the backend could not sample with, e.g. a grammar
    that does not compile against the model's vocabulary, instead of failing
    inside a step. The first grammar builds the vocabulary's constraint
    tokenizer (backends/constraints.py), here off the step thread."""
    if params.grammar is None:
        return
    try:
        await asyncio.to_thread(backend.validate, params)
    except InvalidRequestError as exc:
        exc.param = exc.param or param
        raise


def check_logit_bias(params: SamplingParams, vocab_size: int) -> None:
    """Token ids in `logit_bias` must exist."""
    bad = [t for t, _ in params.logit_bias if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"logit_bias names token ids outside the vocabulary: {bad[:5]}", param="logit_bias")
