"""`POST /v1/completions` (legacy text completions).

Each prompt gets `n` choices; choice `p * n + i` is choice i of prompt p, as
in OpenAI's API. With `suffix`, each prompt is the text before a gap and the
answer fills it: a fill-in-the-middle prompt from the model's FIM tokens
(see `api.infill_prompt`), or a 400 for a model without them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from localserve.api.generation import MergedStreams, collect, submit_all
from localserve.api.infill_prompt import fim_prompt, require_fim
from localserve.api.metrics import latency_observer, note_model
from localserve.api.middleware import parse_body
from localserve.api.prompts import completion_prompt, completion_prompts_async
from localserve.api.sampling import COMPLETIONS_DEFAULT_MAX_TOKENS, check_logit_bias, per_choice, sampling_params
from localserve.api.schemas import CompletionRequest
from localserve.api.sse import stream_answer
from localserve.api.state import engine_of, require_model
from localserve.api.wire import FINISH_REASONS, AnswerMeta, legacy_logprobs, new_id, text_completion, usage
from localserve.backends.base import Tokenizer
from localserve.engine.types import SamplingParams, TokenEvent, parse_priority


class CompletionChunkFormat:
    """`text_completion` chunks: the echoed prompt first (with `echo`), text
    deltas, a last chunk with the finish reason, then the usage chunk."""

    def __init__(
        self,
        meta: AnswerMeta,
        tokenizer: Tokenizer,
        *,
        echoes: Sequence[str],
        num_choices_per_prompt: int,
        include_usage: bool,
        with_logprobs: bool,
    ) -> None:
        self.meta = meta
        self.tokenizer = tokenizer
        self.echoes = echoes
        self.num_choices_per_prompt = num_choices_per_prompt
        self.include_usage = include_usage
        self.with_logprobs = with_logprobs
        self._offsets: dict[int, int] = {}  # text offset per choice, for logprobs
        self._finals: list[TokenEvent | None] = [None] * len(echoes)

    def chunks(self, index: int, event: TokenEvent) -> list[dict[str, Any]]:
        out = []
        if index not in self._offsets:
            self._offsets[index] = len(self.echoes[index])
            if self.echoes[index]:
                out.append(self._chunk(index, self.echoes[index]))
        if event.text or event.logprobs:
            logprobs = None
            if self.with_logprobs:
                logprobs, self._offsets[index] = legacy_logprobs(self.tokenizer, event.logprobs, self._offsets[index])
            out.append(self._chunk(index, event.text, logprobs=logprobs))
        if event.finish_reason is not None:
            self._finals[index] = event
            out.append(self._chunk(index, "", finish_reason=FINISH_REASONS[event.finish_reason]))
        return out

    def usage_chunk(self) -> dict[str, Any]:
        body = self.meta.header("text_completion")
        body["choices"] = []
        body["usage"] = usage(self._finals, self.num_choices_per_prompt)
        return body

    def _chunk(
        self, index: int, text: str, *, logprobs: dict[str, Any] | None = None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        body = self.meta.header("text_completion")
        body["choices"] = [{"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}]
        if self.include_usage:
            body["usage"] = None
        return body


def _choices(
    body: CompletionRequest, prompt_ids: list[list[int]], n_ctx: int
) -> list[tuple[list[int], SamplingParams]]:
    choices: list[tuple[list[int], SamplingParams]] = []
    max_tokens = body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS
    for ids in prompt_ids:
        params = sampling_params(
            body, num_prompt_tokens=len(ids), n_ctx=n_ctx, max_tokens=max_tokens, num_logprobs=body.logprobs
        )
        choices.extend((ids, per_choice(params, i)) for i in range(body.n))
    return choices


async def completions(request: web.Request) -> web.StreamResponse:
    """Legacy completion of one or many prompts (text or token ids)."""
    body = await parse_body(request, CompletionRequest)
    model_id = await require_model(request, body.model)
    note_model(request, model_id)
    engine = engine_of(request)
    tokenizer = engine.tokenizer(model_id)
    prompts = body.prompts
    n_ctx = engine.capacity(model_id).n_ctx
    if body.suffix:
        prompt_ids = await _fim_prompts(body, tokenizer, model_id, n_ctx)
    else:
        prompt_ids = await completion_prompts_async(tokenizer, prompts)
    check_logit_bias(body, tokenizer.vocab_size)
    choices = _choices(body, prompt_ids, n_ctx)
    echoes = [_echo(body, tokenizer, p) for p in prompts for _ in range(body.n)]
    meta = AnswerMeta(new_id("cmpl"), model_id)
    streams = submit_all(
        engine, model_id, meta.id, choices, priority=parse_priority(body.priority), prompt_param="prompt"
    )
    merged = MergedStreams(streams, observer=latency_observer(request, model_id))
    headers = {"X-Request-Id": meta.id}
    with_logprobs = body.logprobs is not None
    if body.stream:
        fmt = CompletionChunkFormat(
            meta,
            tokenizer,
            echoes=echoes,
            num_choices_per_prompt=body.n,
            include_usage=body.include_usage,
            with_logprobs=with_logprobs,
        )
        return await stream_answer(request, merged, fmt, include_usage=body.include_usage, headers=headers)
    results = await collect(merged)
    answer = text_completion(
        meta, results, tokenizer, echoes=echoes, num_choices_per_prompt=body.n, with_logprobs=with_logprobs
    )
    return web.json_response(answer, headers=headers)


async def _fim_prompts(body: CompletionRequest, tokenizer: Tokenizer, model_id: str, n_ctx: int) -> list[list[int]]:
    """Each prompt as the prefix of a fill-in-the-middle prompt before `suffix`."""
    fim = require_fim(tokenizer, model_id, param="suffix")
    assert body.suffix is not None
    suffix, max_tokens = body.suffix, body.max_tokens or COMPLETIONS_DEFAULT_MAX_TOKENS

    def build() -> list[list[int]]:
        out = []
        for index, prompt in enumerate(body.prompts):
            prefix = prompt if isinstance(prompt, str) else completion_prompt(tokenizer, prompt, index=index)
            out.append(
                fim_prompt(tokenizer, fim, prefix=prefix, suffix=suffix, n_ctx=n_ctx, max_tokens=max_tokens).token_ids
            )
        return out

    return await asyncio.to_thread(build)


def _echo(body: CompletionRequest, tokenizer: Tokenizer, prompt: str | list[int]) -> str:
    if not body.echo:
        return ""
    return prompt if isinstance(prompt, str) else tokenizer.decode(prompt)
