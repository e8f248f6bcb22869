"""llama-server's `logit_bias` on `/completion` and `/infill`.

Two shapes: pairs, `[[token, bias], ...]`, or an object, `{token: bias}`
(OpenAI's, whose keys JSON makes strings). A token is an id, or a text
whose every token gets the bias; a key of digits is an id. A bias is a
number, or `false` for never (-inf); `true` leaves the token alone.
The answer's `generation_settings.logit_bias` lists them back as
`{token, bias}`, -inf as null, with the end-of-generation tokens that
`ignore_eos` bans."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from localserve.engine.backend import Tokenizer
from localserve.errors import InvalidRequestError

LogitBias = list[list[Any]] | dict[str, Any]


def logit_bias_pairs(value: LogitBias | None, tokenizer: Tokenizer) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs, one per token id (the last bias named wins)."""
    if not value:
        return ()
    entries: Iterable[Any] = value.items() if isinstance(value, dict) else value
    out: dict[int, float] = {}
    for entry in entries:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise InvalidRequestError("logit_bias entries are [token, bias] pairs", param="logit_bias")
        token, raw = entry
        bias = _bias(raw)
        if bias is None:
            continue
        for token_id in _token_ids(token, tokenizer):
            out[token_id] = bias
    return tuple(sorted(out.items()))


def _bias(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None if raw else -math.inf
    if isinstance(raw, (int, float)):
        return float(raw)
    raise InvalidRequestError("a logit_bias value is a number or false", param="logit_bias")


def _token_ids(token: Any, tokenizer: Tokenizer) -> list[int]:
    if isinstance(token, int) and not isinstance(token, bool):
        ids = [token]
    elif isinstance(token, str) and token.isdigit():
        ids = [int(token)]
    elif isinstance(token, str):
        return tokenizer.encode(token, add_special=False, parse_special=False)
    else:
        raise InvalidRequestError("a logit_bias token is an id or a text", param="logit_bias")
    bad = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
    if bad:
        raise InvalidRequestError(f"logit_bias names token ids outside the vocabulary: {bad}", param="logit_bias")
    return ids


def reported(pairs: Sequence[tuple[int, float]], banned_ids: Iterable[int] = ()) -> list[dict[str, Any]]:
    """`generation_settings.logit_bias`: -inf as null, as llama-server writes it."""
    merged = {**dict.fromkeys(banned_ids, -math.inf), **dict(pairs)}
    return [{"token": t, "bias": None if math.isinf(b) else b} for t, b in sorted(merged.items())]
