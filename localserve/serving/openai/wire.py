"""OpenAI's wire objects, built from the serving layer's results: whole
completions, usage and both log-probability formats (chat and legacy)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localserve import __version__
from localserve.engine.backend import Tokenizer
from localserve.engine.types import TokenLogprob
from localserve.serving.types import ChoiceResult, ToolCall, Usage

SYSTEM_FINGERPRINT = f"fp_localserve_{__version__}"

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


def usage(usages: Sequence[Usage | None], num_choices_per_prompt: int) -> JsonDict:
    """OpenAI usage: each prompt counted once however many choices it has;
    completion tokens summed over all choices. Drafts of speculative decoding
    go where OpenAI reports predicted-output tokens."""
    prompt = cached = completion = drafted = accepted = 0
    for index, counts in enumerate(usages):
        if counts is None:
            continue
        completion += counts.num_output_tokens
        drafted += counts.num_draft_tokens
        accepted += counts.num_accepted_tokens
        if index % num_choices_per_prompt == 0:
            prompt += counts.num_prompt_tokens
            cached += counts.num_cached_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        },
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
    """A `chat.completion` object; replies that are tool calls become
    `message.tool_calls` with finish reason `tool_calls`."""
    choices = []
    for result in results:
        message: JsonDict = {"role": "assistant", "content": result.content, "refusal": None}
        if result.reasoning is not None:
            message["reasoning_content"] = result.reasoning
        finish_reason = result.finish_reason
        if result.tool_calls:
            message["tool_calls"] = [tool_call(call) for call in result.tool_calls]
            finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
        choices.append(
            {
                "index": result.index,
                "message": message,
                "logprobs": chat_logprobs(tokenizer, result.logprobs) if with_logprobs else None,
                "finish_reason": finish_reason,
            }
        )
    body = meta.header("chat.completion")
    body["choices"] = choices
    body["usage"] = usage([r.usage for r in results], len(results))
    return body


def tool_call(call: ToolCall) -> JsonDict:
    """A tool call as `message.tool_calls` lists it."""
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


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
    body["usage"] = usage([r.usage for r in results], num_choices_per_prompt)
    return body
