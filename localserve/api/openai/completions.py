"""`POST /v1/completions` (legacy text completions) over `serving.completions`.

Each prompt gets `n` choices; choice `p * n + i` is choice i of prompt p, as
in OpenAI's API. With `suffix`, each prompt is the text before a gap and the
answer fills it: a fill-in-the-middle prompt from the model's FIM tokens
(see `serving.fim`), or a 400 for a model without them. The whole answer is
`serving.openai.completions`'s, as for a batch line; the stream's chunks are
here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.sse import stream_answer
from localserve.engine.backend import Tokenizer
from localserve.serving.openai.completions import echoes, start, whole
from localserve.serving.openai.schemas import TextCompletionRequest
from localserve.serving.openai.wire import AnswerMeta, legacy_logprobs, usage
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


async def completions(request: web.Request) -> web.StreamResponse:
    """Legacy completion of one or many prompts (text or token ids)."""
    body = await parse_body(request, TextCompletionRequest)
    meta, answer = await start(RequestModels(request), body)
    headers = {"X-Request-Id": meta.id}
    if not body.stream:
        return web.json_response(await whole(meta, answer, body), headers=headers)
    fmt = CompletionChunkFormat(
        meta,
        answer.tokenizer,
        echoes=echoes(body, answer.tokenizer),
        num_choices_per_prompt=body.n,
        include_usage=body.include_usage,
        with_logprobs=body.logprobs is not None,
    )
    return await stream_answer(request, answer, fmt, include_usage=body.include_usage, headers=headers)
