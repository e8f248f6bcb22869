"""Completions of plain prompts: legacy completions (text or token ids,
optionally filling a gap before `suffix`), one text prompt as a user turn
or raw (Ollama's /api/generate, `localserve run`), and code infill."""

from __future__ import annotations

import asyncio

from localserve.serving.answer import Answer, submit
from localserve.serving.fim import fim_prompt, require_fim
from localserve.serving.grammar import grammar_for
from localserve.serving.models import ModelHost, held_chat_model
from localserve.serving.prompts import completion_prompt, text_prompt
from localserve.serving.types import CompletionRequest, InfillRequest, TextRequest


async def start_completion(host: ModelHost, request: CompletionRequest, *, answer_id: str) -> Answer:
    """Queue `num_choices` choices per prompt (choice `p * n + i` is choice
    i of prompt p). With `suffix`, each prompt is the prefix of a
    fill-in-the-middle prompt (a 400 for a model without FIM tokens)."""
    model = await held_chat_model(host, request.model)
    tokenizer, param = model.tokenizer, request.prompt_param
    fim = require_fim(tokenizer, model.model_id, param="suffix") if request.suffix else None

    def build() -> list[list[int]]:
        out = []
        for index, prompt in enumerate(request.prompts):
            if fim is None:
                out.append(completion_prompt(tokenizer, prompt, index=index, param=param))
                continue
            prefix = (
                prompt if isinstance(prompt, str) else completion_prompt(tokenizer, prompt, index=index, param=param)
            )
            built = fim_prompt(
                tokenizer,
                fim,
                prefix=prefix,
                suffix=request.suffix or "",
                n_ctx=model.n_ctx,
                max_tokens=request.options.max_tokens,
            )
            out.append(built.token_ids)
        return out

    prompt_ids = await asyncio.to_thread(build)
    output = request.output
    return await submit(
        model,
        answer_id,
        prompt_ids,
        request.options,
        grammar=grammar_for(output),
        grammar_param=output.param if output else "",
        prompt_param=param,
    )


async def start_text(host: ModelHost, request: TextRequest, *, answer_id: str) -> Answer:
    """Queue the answer to one text prompt (see `TextRequest`)."""
    model = await held_chat_model(host, request.model)
    tokenizer = model.tokenizer

    def build() -> list[int]:
        if request.suffix:
            fim = require_fim(tokenizer, model.model_id, param="suffix")
            return fim_prompt(
                tokenizer,
                fim,
                prefix=request.prompt,
                suffix=request.suffix,
                n_ctx=model.n_ctx,
                max_tokens=request.options.max_tokens,
            ).token_ids
        return text_prompt(
            model.template, tokenizer, request.prompt, system=request.system, raw=request.raw, context=request.context
        )

    prompt_ids = await asyncio.to_thread(build)
    output = request.output
    return await submit(
        model,
        answer_id,
        [prompt_ids],
        request.options,
        grammar=grammar_for(output),
        grammar_param=output.param if output else "",
        prompt_param=request.prompt_param,
    )


async def start_infill(host: ModelHost, request: InfillRequest, *, answer_id: str) -> Answer:
    """Queue a fill-in-the-middle answer; `Answer.truncated` says whether the
    prompt was cut to fit the context (prefix start, suffix end, extra first)."""
    model = await held_chat_model(host, request.model)
    fim = require_fim(model.tokenizer, model.model_id, param=request.model_param)
    built = await asyncio.to_thread(
        fim_prompt,
        model.tokenizer,
        fim,
        prefix=request.prefix,
        suffix=request.suffix,
        prompt=request.prompt,
        extra=request.extra,
        n_ctx=model.n_ctx,
        max_tokens=request.options.max_tokens,
    )
    return await submit(
        model,
        answer_id,
        [built.token_ids],
        request.options,
        prompt_param=request.prompt_param,
        truncated=built.truncated,
    )
