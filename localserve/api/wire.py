"""OpenAI's wire objects, built from the engine's token events: completions,
chunks, usage and both log-probability formats (chat and legacy)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localserve import __version__
from localserve.backends.base import Tokenizer
from localserve.engine.types import FinishReason, TokenEvent, TokenLogprob

SYSTEM_FINGERPRINT = f"fp_localserve_{__version__}"

FINISH_REASONS: dict[FinishReason, str] = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",  # cancelled through /api/v1/requests/{id}/cancel
    FinishReason.ERROR: "error",
}

JsonDict = dict[str, Any]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass(frozen=True, slots=True)
class AnswerMeta:
    """What every object of one answer repeats."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def header(self, obj: str) -> JsonDict:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }


@dataclass(slots=True)
class ChoiceResult:
    """Everything one choice produced, gathered from its events."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: TokenEvent | None = None

    def add(self, event: TokenEvent) -> None:
        self.text += event.text
        self.token_ids.extend(event.token_ids)
        self.logprobs.extend(event.logprobs)
        if event.finished:
            self.final = event

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS[self.final.finish_reason] if self.final and self.final.finish_reason else None


def usage(finals: Sequence[TokenEvent | None], num_choices_per_prompt: int) -> JsonDict:
    """OpenAI usage: each prompt counted once however many choices it has;
    completion tokens summed over all choices."""
    prompt = cached = completion = 0
    for index, final in enumerate(finals):
        if final is None:
            continue
        completion += final.num_output_tokens
        if index % num_choices_per_prompt == 0:
            prompt += final.num_prompt_tokens
            cached += final.num_cached_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


# ---- log-probabilities -----------------------------------------------------------


def _token(tokenizer: Tokenizer, token_id: int, logprob: float) -> JsonDict:
    raw = tokenizer.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob]) -> JsonDict:
    """`choices[].logprobs` of chat completions."""
    content = []
    for lp in logprobs:
        entry = _token(tokenizer, lp.token_id, lp.logprob)
        entry["top_logprobs"] = [_token(tokenizer, t, v) for t, v in lp.top]
        content.append(entry)
    return {"content": content, "refusal": None}


def legacy_logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob], text_offset: int) -> tuple[JsonDict, int]:
    """`choices[].logprobs` of legacy completions, with character offsets
    starting at `text_offset`; also returns the offset after the last token."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = tokenizer.token_text(lp.token_id)
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        tops.append({tokenizer.token_text(t): v for t, v in lp.top})
        offsets.append(text_offset)
        text_offset += len(text)
    out = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": tops, "text_offset": offsets}
    return out, text_offset


# ---- whole answers -----------------------------------------------------------------


def chat_completion(
    meta: AnswerMeta, results: Sequence[ChoiceResult], tokenizer: Tokenizer, *, with_logprobs: bool
) -> JsonDict:
    """A `chat.completion` object."""
    choices = [
        {
            "index": index,
            "message": {"role": "assistant", "content": result.text, "refusal": None},
            "logprobs": chat_logprobs(tokenizer, result.logprobs) if with_logprobs else None,
            "finish_reason": result.finish_reason,
        }
        for index, result in enumerate(results)
    ]
    body = meta.header("chat.completion")
    body["choices"] = choices
    body["usage"] = usage([r.final for r in results], len(results))
    return body


def text_completion(
    meta: AnswerMeta,
    results: Sequence[ChoiceResult],
    tokenizer: Tokenizer,
    *,
    echoes: Sequence[str],
    num_choices_per_prompt: int,
    with_logprobs: bool,
) -> JsonDict:
    """A `text_completion` object; `echoes[i]` is prepended to choice i."""
    choices = []
    for index, result in enumerate(results):
        logprobs = None
        if with_logprobs:
            logprobs, _ = legacy_logprobs(tokenizer, result.logprobs, len(echoes[index]))
        choices.append(
            {
                "text": echoes[index] + result.text,
                "index": index,
                "logprobs": logprobs,
                "finish_reason": result.finish_reason,
            }
        )
    body = meta.header("text_completion")
    body["choices"] = choices
    body["usage"] = usage([r.final for r in results], num_choices_per_prompt)
    return body
