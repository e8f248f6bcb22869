"""Request parameters -> the engine's `SamplingParams`, including the grammar
that enforces `response_format`."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from functools import lru_cache
from typing import TypeVar

from localserve.api.schemas import ResponseFormat, SamplingFields
from localserve.backends.base import GenerativeBackend
from localserve.engine.types import SamplingParams
from localserve.errors import InvalidRequestError

T = TypeVar("T")

#: OpenAI's legacy completions endpoint defaults to 16 new tokens.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@lru_cache(maxsize=64)
def _schema_grammar(schema_json: str) -> str:
    from llama_cpp.llama_grammar import json_schema_to_gbnf  # heavy import, only when asked

    return json_schema_to_gbnf(schema_json)


def _json_grammar() -> str:
    from llama_cpp.llama_grammar import JSON_GBNF

    return JSON_GBNF


def grammar_for(response_format: ResponseFormat | None) -> str | None:
    """GBNF for `json_object` (any JSON object) or `json_schema`; None for text."""
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return _json_grammar()
    assert response_format.json_schema is not None  # checked by the schema
    schema = response_format.json_schema.schema_
    if schema is True or schema == {}:
        return _json_grammar()  # "anything" is any JSON value we can express
    try:
        return _schema_grammar(json.dumps(schema, sort_keys=True))
    except Exception as exc:  # the converter raises assorted errors (even AssertionError)
        raise InvalidRequestError(
            f"response_format.json_schema.schema cannot be turned into a grammar: {exc}",
            param="response_format.json_schema.schema",
        ) from None


def sampling_params(
    request: SamplingFields,
    *,
    num_prompt_tokens: int,
    n_ctx: int,
    max_tokens: int | None,
    num_logprobs: int | None,
    grammar: str | None = None,
) -> SamplingParams:
    """The engine's parameters for one choice of `request`.

    No `max_tokens` means "until the context is full", as with OpenAI; a
    larger one is cut to the room left in the context (the answer then ends
    with `finish_reason: "length"`).
    """
    room = max(1, n_ctx - num_prompt_tokens)
    defaults = SamplingParams()
    return SamplingParams(
        max_tokens=min(max_tokens, room) if max_tokens is not None else room,
        temperature=_or(request.temperature, defaults.temperature),
        top_k=_or(request.top_k, defaults.top_k),
        top_p=_or(request.top_p, defaults.top_p),
        min_p=_or(request.min_p, defaults.min_p),
        repeat_penalty=_or(request.repeat_penalty, defaults.repeat_penalty),
        presence_penalty=_or(request.presence_penalty, defaults.presence_penalty),
        frequency_penalty=_or(request.frequency_penalty, defaults.frequency_penalty),
        seed=request.seed,
        stop=request.stop_list,
        ignore_eos=request.ignore_eos,
        min_tokens=request.min_tokens,
        logprobs=num_logprobs,
        grammar=grammar,
        logit_bias=tuple(sorted((request.logit_bias or {}).items())),
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
    check = getattr(backend, "validate", None)
    if check is None or params.grammar is None:
        return
    try:
        await asyncio.to_thread(check, params)
    except InvalidRequestError as exc:
        exc.param = exc.param or param
        raise


def check_logit_bias(request: SamplingFields, vocab_size: int) -> None:
    """Token ids in `logit_bias` must exist."""
    bad = [t for t in (request.logit_bias or {}) if not 0 <= t < vocab_size]
    if bad:
        raise InvalidRequestError(f"logit_bias names token ids outside the vocabulary: {bad[:5]}", param="logit_bias")


def _or(value: T | None, default: T) -> T:
    return default if value is None else value
