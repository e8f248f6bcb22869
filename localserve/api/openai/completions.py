"""`POST /v1/completions` (legacy text completions) over `serving.completions`.

Each prompt gets `n` choices; choice `p * n + i` is choice i of prompt p, as
in OpenAI's API. With `suffix`, each prompt is the text before a gap and the
answer fills it: a fill-in-the-middle prompt from the model's FIM tokens
(see `serving.fim`), or a 400 for a model without them. The whole answer is
`serving.openai.completions`'s, as for a batch line; the stream's chunks are
`serving.openai.answer.CompletionChunkFormat`'s.
"""

from __future__ import annotations

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.sse import stream_answer
from localserve.serving.openai.answer import CompletionChunkFormat
from localserve.serving.openai.completions import echoes, start, whole
from localserve.serving.openai.request import TextCompletionRequest


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
