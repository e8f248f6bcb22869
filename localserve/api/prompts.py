"""From request to prompt token ids: chat messages through the model's own
template, legacy prompts as text or ready token ids."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from localserve.backends.base import Tokenizer
from localserve.backends.chat_template import ChatTemplate
from localserve.errors import InvalidRequestError


def chat_prompt(template: ChatTemplate, tokenizer: Tokenizer, messages: Sequence[dict[str, Any]]) -> list[int]:
    """Render `messages` with the generation prompt and tokenize the result."""
    text = template.render(messages, add_generation_prompt=True)
    # Templates that write the BOS token themselves must not get a second one.
    bos = tokenizer.bos_token
    add_special = not (bos and text.startswith(bos))
    token_ids = tokenizer.encode(text, add_special=add_special, parse_special=True)
    if not token_ids:
        raise InvalidRequestError("the messages render to an empty prompt", param="messages")
    return token_ids


def completion_prompt(tokenizer: Tokenizer, prompt: str | list[int], *, index: int) -> list[int]:
    """Token ids of one legacy prompt: text is tokenized like llama.cpp's
    server does (special tokens added and parsed); ids are checked."""
    if isinstance(prompt, str):
        token_ids = tokenizer.encode(prompt, add_special=True, parse_special=True)
    else:
        vocab_size = tokenizer.vocab_size
        bad = next((t for t in prompt if t >= vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} in prompt {index} is outside the vocabulary (size {vocab_size})", param="prompt"
            )
        token_ids = list(prompt)
    if not token_ids:
        raise InvalidRequestError(f"prompt {index} is empty", param="prompt")
    return token_ids


async def chat_prompt_async(
    template: ChatTemplate, tokenizer: Tokenizer, messages: Sequence[dict[str, Any]]
) -> list[int]:
    """`chat_prompt` off the event loop: a long conversation takes a while to
    render and tokenize, and the loop must keep streaming to others."""
    return await asyncio.to_thread(chat_prompt, template, tokenizer, messages)


async def completion_prompts_async(tokenizer: Tokenizer, prompts: Sequence[str | list[int]]) -> list[list[int]]:
    """Every legacy prompt's token ids, off the event loop."""

    def encode_all() -> list[list[int]]:
        return [completion_prompt(tokenizer, p, index=i) for i, p in enumerate(prompts)]

    return await asyncio.to_thread(encode_all)
