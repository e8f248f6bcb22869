"""OpenAI's chat completion, whole: the `chat.completion` object of an
answer (the endpoint without `stream`, and batch lines)."""

from __future__ import annotations

from typing import Any

from localserve.serving.answer import Answer
from localserve.serving.chat import start_chat
from localserve.serving.models import ModelHost
from localserve.serving.openai.answer import AnswerMeta, chat_completion, new_id
from localserve.serving.openai.request import ChatCompletionRequest, chat_request
from localserve.serving.types import ChoiceResult


async def start(host: ModelHost, body: ChatCompletionRequest) -> tuple[AnswerMeta, Answer]:
    """Queue the answer to `body` (the endpoint and batch lines)."""
    answer_id = new_id("chatcmpl")
    answer = await start_chat(host, chat_request(body), answer_id=answer_id)
    return AnswerMeta(answer_id, answer.model_id), answer


async def whole(meta: AnswerMeta, answer: Answer, body: ChatCompletionRequest) -> dict[str, Any]:
    """The `chat.completion` object, once the answer is complete."""
    return (await whole_and_results(meta, answer, body))[0]


async def whole_and_results(
    meta: AnswerMeta, answer: Answer, body: ChatCompletionRequest
) -> tuple[dict[str, Any], list[ChoiceResult]]:
    """`whole`, and the results it was made of (for llama-server's `__verbose`)."""
    async with answer:
        results = await answer.collect()
    return chat_completion(meta, results, answer.tokenizer, with_logprobs=body.logprobs), results
