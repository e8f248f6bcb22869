"""A request's options -> the engine's `SamplingParams` for each choice,
including the grammar that enforces a JSON output format."""

from __future__ import annotations

import asyncio
import dataclasses
from functools import lru_cache

from localserve.backends.base import GenerativeBackend
from localserve.engine.types import SamplingParams
from localserve.errors import InvalidRequestError
from localserve.serving.types import Options, OutputFormat


@lru_cache(maxsize=64)
def _schema_grammar(schema_json: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # heavy import, only when asked

    return json_schema_to_gbnf(schema_json)


def json_grammar() -> str:
    """GBNF for any JSON value."""
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def grammar_for(output: OutputFormat | None) -> str | None:
    """GBNF for `json_object` (any JSON object) or `json_schema`; None for text."""
    if output is None:
        return None
    if output.kind == "json_object" or output.schema is True or output.schema in ({}, None):
        return json_grammar()  # "anything" is any JSON value we can express
    try:
        return _schema_grammar(output.schema_key())
    except Exception as exc:  # the converter raises assorted errors (even AssertionError)
        raise InvalidRequestError(
            f"{output.schema_param} cannot be turned into a grammar: {exc}", param=output.schema_param
        ) from None


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
    llama.cpp does not compile, instead of failing inside a step."""
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
