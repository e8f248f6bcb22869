"""From request to prompt token ids: chat messages through the model's own
template, plain prompts as text or ready token ids, a text prompt as a user
turn (Ollama's /api/generate, `localserve run`)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from localserve.backends.chat_template import ChatTemplate
from localserve.engine.backend import Tokenizer
from localserve.errors import InvalidRequestError
from localserve.serving.reasoning import ReasoningFormat


class TemplateCache:
    """One compiled chat template per loaded model; the tokenizer is kept
    to notice a reload (a new tokenizer object). `override` (the server's
    `--chat-template-file`) replaces every model's own template."""

    def __init__(self, override: str | None = None) -> None:
        self._templates: dict[str, tuple[Tokenizer, ChatTemplate]] = {}
        self.override = override

    def get(self, model_id: str, tokenizer: Tokenizer) -> ChatTemplate:
        """The model's own chat template, compiled once per loaded model."""
        cached = self._templates.get(model_id)
        if cached is not None and cached[0] is tokenizer:
            return cached[1]
        source = self.override or tokenizer.chat_template
        template = ChatTemplate(source, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
        self._templates[model_id] = (tokenizer, template)
        return template


def encode_text(tokenizer: Tokenizer, text: str) -> list[int]:
    """Tokenize a whole prompt, special tokens parsed. A BOS token is added
    unless the text starts with it already (templates that write the BOS
    token themselves must not get a second one)."""
    bos = tokenizer.bos_token
    add_special = not (bos and text.startswith(bos))
    return tokenizer.encode(text, add_special=add_special, parse_special=True)


def render_messages(
    template: ChatTemplate,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
    thinking: bool = True,
    reasoning: ReasoningFormat | None = None,
) -> str:
    """The prompt text of `messages` (and `tools`, for templates that take
    them). Templates get `enable_thinking` as llama-server gives it; without
    `thinking` the model's think section (`reasoning`, its format) is also
    closed after the generation prompt, for templates that do not close it.
    Llama 3's templates read today's date from `date_string` and
    FireFunction's from `datetime`, which llama-server gives them too (else
    they write a date of 2024, or fail); FireFunction's reads the tools as
    `functions`, a JSON text (empty without tools)."""
    today = datetime.date.today()
    text = template.render(
        messages,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        enable_thinking=thinking,
        date_string=today.strftime("%d %b %Y"),
        datetime=today.strftime("%b %d %Y"),
        functions=json.dumps(list(tools), indent=2) if tools else "",
    )
    if not thinking and reasoning is not None and add_generation_prompt:
        text = reasoning.closed_prompt(text)
    return text


def chat_text(
    template: ChatTemplate,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    thinking: bool = True,
    reasoning: ReasoningFormat | None = None,
    add_generation_prompt: bool = True,
    continuation: str | None = None,
) -> str:
    """The prompt text of a chat request: `render_messages`, then the text of
    the assistant message it continues, if any (llama-server's
    `continue_final_message`: the generation prompt, then that text)."""
    if continuation is None:
        return render_messages(
            template,
            messages,
            tools,
            add_generation_prompt=add_generation_prompt,
            thinking=thinking,
            reasoning=reasoning,
        )
    return render_messages(template, messages, tools, thinking=thinking, reasoning=reasoning) + continuation


def chat_prompt(
    template: ChatTemplate,
    tokenizer: Tokenizer,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
    *,
    param: str = "messages",
    thinking: bool = True,
    reasoning: ReasoningFormat | None = None,
    add_generation_prompt: bool = True,
    continuation: str | None = None,
) -> list[int]:
    """Render `messages` with the generation prompt (`render_messages`), and
    tokenize the result; `continuation` (the text of an assistant message
    to go on with) follows the generation prompt."""
    text = chat_text(
        template,
        messages,
        tools,
        thinking=thinking,
        reasoning=reasoning,
        add_generation_prompt=add_generation_prompt,
        continuation=continuation,
    )
    token_ids = encode_text(tokenizer, text)
    if not token_ids:
        raise InvalidRequestError("the messages render to an empty prompt", param=param)
    return token_ids


def completion_prompt(tokenizer: Tokenizer, prompt: str | Sequence[int], *, index: int, param: str) -> list[int]:
    """Token ids of one plain prompt: text is tokenized like llama.cpp's
    server does (special tokens added and parsed); ids are checked."""
    if isinstance(prompt, str):
        token_ids = tokenizer.encode(prompt, add_special=True, parse_special=True)
    else:
        vocab_size = tokenizer.vocab_size
        bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"token id {bad} in prompt {index} is outside the vocabulary (size {vocab_size})", param=param
            )
        token_ids = list(prompt)
    if not token_ids:
        raise InvalidRequestError(f"prompt {index} is empty", param=param)
    return token_ids


def text_prompt(
    template: ChatTemplate,
    tokenizer: Tokenizer,
    prompt: str,
    *,
    system: str | None = None,
    raw: bool = False,
    context: Sequence[int] | None = None,
) -> list[int]:
    """One text prompt as a user turn after `system`, or as is with `raw`;
    after `context` (the token ids of an earlier exchange) the conversation
    goes on, without a second BOS in the middle."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    if context:
        vocab_size = tokenizer.vocab_size
        bad = next((t for t in context if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                f"context has token id {bad}, outside the vocabulary (size {vocab_size})", param="context"
            )
        text = prompt if raw else render_messages(template, messages)
        return [*context, *tokenizer.encode(text, add_special=False, parse_special=True)]
    if raw:
        token_ids = encode_text(tokenizer, prompt)
        if not token_ids:
            raise InvalidRequestError("prompt 0 is empty", param="prompt")
        return token_ids
    return chat_prompt(template, tokenizer, messages)
