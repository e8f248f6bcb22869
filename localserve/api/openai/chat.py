"""`POST /v1/chat/completions`: OpenAI's chat dialect over `serving.chat`
(tools and JSON formats included). The whole answer is the
`chat.completion` object a batch line gets too, the stream's chunks
`ChatChunkFormat`'s (both `serving.openai.answer`). llama-server's fields
come only when asked: `timings` (`timings_per_token`), `prompt_progress`
(`return_progress`) and `__verbose` (`verbose`, or the server's
`--verbose`). Also `/chat/completions/input_tokens`: the prompt's length."""

from __future__ import annotations

from aiohttp import web

from localserve.api.hosting import RequestModels
from localserve.api.middleware import parse_body
from localserve.api.sse import stream_answer
from localserve.api.state import SETTINGS
from localserve.serving.chat import count_chat_tokens, render_chat
from localserve.serving.openai.answer import ChatChunkFormat, LlamaDebug, verbose_result
from localserve.serving.openai.chat import start, whole_and_results
from localserve.serving.openai.request import ChatCompletionRequest, chat_request
from localserve.serving.timings import answer_timings


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Chat completion, streamed (SSE) or whole; n choices; JSON modes; tools."""
    body = await parse_body(request, ChatCompletionRequest)
    meta, answer = await start(RequestModels(request), body)
    headers = {"X-Request-Id": meta.id}
    if body.stream:
        debug = None
        if body.timings_per_token or body.return_progress:
            debug = LlamaDebug(answer, timings_per_token=body.timings_per_token, return_progress=body.return_progress)
        fmt = ChatChunkFormat(
            meta,
            answer.tokenizer,
            num_choices=answer.num_choices,
            include_usage=body.include_usage,
            with_logprobs=body.logprobs,
            tools=answer.plan is not None,
            debug=debug,
        )
        return await stream_answer(request, answer, fmt, include_usage=body.include_usage, headers=headers)
    verbose = body.verbose if body.verbose is not None else request.app[SETTINGS].verbose
    reply, results = await whole_and_results(meta, answer, body)
    if body.timings_per_token:
        reply["timings"] = answer_timings(answer)
    if verbose:  # the prompt's text: special tokens decode to nothing, so it is rendered again
        _, prompt = await render_chat(RequestModels(request), chat_request(body))
        reply["__verbose"] = verbose_result(answer, results[0], prompt)
    return web.json_response(reply, headers=headers)


async def chat_input_tokens(request: web.Request) -> web.Response:
    """llama-server's `/chat/completions/input_tokens`: the prompt's length, nothing generated."""
    body = await parse_body(request, ChatCompletionRequest)
    return web.json_response({"input_tokens": await count_chat_tokens(RequestModels(request), chat_request(body))})
