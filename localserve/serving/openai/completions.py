"""OpenAI's legacy completion, whole: the `text_completion` object of an
answer (the endpoint without `stream`, and batch lines)."""

from __future__ import annotations

from typing import Any

from localserve.engine.backend import Tokenizer
from localserve.serving.answer import Answer
from localserve.serving.completions import start_completion
from localserve.serving.models import ModelHost
from localserve.serving.openai.answer import AnswerMeta, new_id, text_completion
from localserve.serving.openai.request import TextCompletionRequest, completion_request


async def start(host: ModelHost, body: TextCompletionRequest) -> tuple[AnswerMeta, Answer]:
    """Queue the answer to `body` (the endpoint and batch lines)."""
    answer_id = new_id("cmpl")
    answer = await start_completion(host, completion_request(body), answer_id=answer_id)
    return AnswerMeta(answer_id, answer.model_id), answer


async def whole(meta: AnswerMeta, answer: Answer, body: TextCompletionRequest) -> dict[str, Any]:
    """The `text_completion` object, once the answer is complete."""
    async with answer:
        results = await answer.collect()
    return text_completion(
        meta,
        results,
        answer.tokenizer,
        echoes=echoes(body, answer.tokenizer),
        num_choices_per_prompt=body.n,
        with_logprobs=body.logprobs is not None,
    )


def echoes(body: TextCompletionRequest, tokenizer: Tokenizer) -> list[str]:
    """The text each choice repeats before its own with `echo` (else "")."""
    if not body.echo:
        return [""] * (len(body.prompts) * body.n)
    texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in body.prompts]
    return [text for text in texts for _ in range(body.n)]
