"""`POST /v1/completions` (legacy text completions) over `serving.completions`.

Each prompt gets `n` choices; choice `p * n + i` is choice i of prompt p, as
in OpenAI's API. With `suffix`, each prompt is the text before a gap and the
answer fills it: a fill-in-the-middle prompt from the model's FIM tokens
(see `serving.fim`), or a 400 for a model without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.openai.convert import completion_request
from localserve.api.openai.schemas import CompletionRequest
from localserve.api.openai.wire import AnswerMeta, legacy_logprobs, new_id, text_completion, usage
from localserve.api.sse import stream_answer
from localserve.backends.base import Tokenizer
from localserve.serving.answer import Answer
from localserve.serving.completions import start_completion
from localserve.serving.models import ModelHost
from localserve.serving.types import ChoiceEnd, Delta, TextDelta, Usage


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
        self._usages: list[Usage | None] = [None] * len(echoes)

    def chunks(self, delta: Delta) -> list[dict[str, Any]]:
        index = delta.index
        out = []
        if index not in self._offsets:
            self._offsets[index] = len(self.echoes[index])
            if self.echoes[index]:
                out.append(self._chunk(index, self.echoes[index]))
        if isinstance(delta, TextDelta):
            logprobs = None
            if self.with_logprobs:
                logprobs, self._offsets[index] = legacy_logprobs(self.tokenizer, delta.logprobs, self._offsets[index])
            out.append(self._chunk(index, delta.text, logprobs=logprobs))
        elif isinstance(delta, ChoiceEnd):
            self._usages[index] = delta.usage
            out.append(self._chunk(index, "", finish_reason=delta.finish_reason))
        return out

    def usage_chunk(self) -> dict[str, Any]:
        body = self.meta.header("text_completion")
        body["choices"] = []
        body["usage"] = usage(self._usages, self.num_choices_per_prompt)
        return body

    def _chunk(
        self, index: int, text: str, *, logprobs: dict[str, Any] | None = None, finish_reason: str | None = None
    ) -> dict[str, Any]:
        body = self.meta.header("text_completion")
        body["choices"] = [{"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}]
        if self.include_usage:
            body["usage"] = None
        return body


async def start(host: ModelHost, body: CompletionRequest) -> tuple[AnswerMeta, Answer]:
    """Queue the answer to `body` (the handler and the batch runner)."""
    answer_id = new_id("cmpl")
    answer = await start_completion(host, completion_request(body), answer_id=answer_id)
    return AnswerMeta(answer_id, answer.model_id), answer


async def whole(meta: AnswerMeta, answer: Answer, body: CompletionRequest) -> dict[str, Any]:
    """The `text_completion` object, once the answer is complete."""
    async with answer:
        results = await answer.collect()
    return text_completion(
        meta,
        results,
        answer.tokenizer,
        echoes=_echoes(body, answer.tokenizer),
        num_choices_per_prompt=body.n,
        with_logprobs=body.logprobs is not None,
    )


async def completions(request: web.Request) -> web.StreamResponse:
    """Legacy completion of one or many prompts (text or token ids)."""
    body = await parse_body(request, CompletionRequest)
    meta, answer = await start(RequestModels(request), body)
    headers = {"X-Request-Id": meta.id}
    if not body.stream:
        return web.json_response(await whole(meta, answer, body), headers=headers)
    fmt = CompletionChunkFormat(
        meta,
        answer.tokenizer,
        echoes=_echoes(body, answer.tokenizer),
        num_choices_per_prompt=body.n,
        include_usage=body.include_usage,
        with_logprobs=body.logprobs is not None,
    )
    return await stream_answer(request, answer, fmt, include_usage=body.include_usage, headers=headers)


def _echoes(body: CompletionRequest, tokenizer: Tokenizer) -> list[str]:
    """The text each choice repeats before its own with `echo` (else "")."""
    if not body.echo:
        return [""] * (len(body.prompts) * body.n)
    texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in body.prompts]
    return [text for text in texts for _ in range(body.n)]
