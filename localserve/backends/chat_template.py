"""Render a model's own chat template (Jinja, as in Hugging Face tokenizer
configs and GGUF metadata) in jinja2's immutable sandbox.

A GGUF's template is untrusted input: the sandbox blocks attribute access to
internals, and bounds the work, memory and output of a render
(`template_sandbox`); whatever goes wrong in a template is the request's 400.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import jinja2

from localserve.backends.template_sandbox import LimitedSandbox, TemplateLimitError, limited_render
from localserve.errors import InvalidRequestError

MAX_RENDERED_CHARS = 4_000_000

#: Used when a model has no template of its own (ChatML, the most common one).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TemplateError(InvalidRequestError):
    """The template refused the conversation (e.g. roles out of order)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(f"the model's chat template refused these messages: {message}")


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _EmptyUndefined(jinja2.ChainableUndefined):
    """An undefined name, or any attribute of one, renders empty (as in
    llama.cpp's template engine); what the sandbox refused still fails."""

    __slots__ = ()

    def __str__(self) -> str:
        if self._undefined_exception is jinja2.exceptions.SecurityError:
            self._fail_with_undefined_error()
        return ""


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    # As llama.cpp's template engine: {% break %} / {% continue %} (Command R7B,
    # Command R+), and an undefined name or attribute renders empty (FireFunction
    # reads `functions` that no request sets) instead of failing the render.
    env = LimitedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        extensions=["jinja2.ext.loopcontrols"],
        undefined=_EmptyUndefined,
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class ChatTemplate:
    """A compiled chat template plus the special tokens it refers to."""

    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source or CHATML_TEMPLATE
        self.is_default = source is None
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _compile(self.source)
        except (jinja2.TemplateSyntaxError, RecursionError) as exc:  # deep nesting overflows the parser
            raise ValueError(f"the model's chat template does not parse: {exc!r}") from exc

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        try:
            text = limited_render(
                self._template,
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                tools=list(tools) if tools else None,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise InvalidRequestError(f"the model's chat template tried an unsafe operation: {exc}") from exc
        except TemplateLimitError as exc:
            raise InvalidRequestError(f"the model's chat template went over a limit: {exc}") from exc
        except Exception as exc:  # the template's own failure (RecursionError, ZeroDivisionError, ...): never a 500
            raise InvalidRequestError(f"the model's chat template failed on these messages: {exc!r}") from exc
        if len(text) > MAX_RENDERED_CHARS:
            raise InvalidRequestError("the rendered chat prompt is too large")
        return text
