"""Chat templates render as llama.cpp's template engine renders them, inside
the sandbox (backends/template_sandbox.py)."""

from __future__ import annotations

import pytest

from localserve.backends.chat_template import ChatTemplate
from localserve.errors import InvalidRequestError

MESSAGES = [
    {"role": "user", "content": "one"},
    {"role": "assistant", "content": "two"},
    {"role": "user", "content": "3"},
]


def test_loop_controls_work_as_command_r_templates_use_them() -> None:
    source = "{% for m in messages %}{% if m.role == 'assistant' %}{% continue %}{% endif %}"
    source += "{{ m.content }};{% if loop.index >= 3 %}{% break %}{% endif %}{% endfor %}"
    assert ChatTemplate(source).render(MESSAGES) == "one;3;"


def test_an_undefined_name_or_attribute_renders_empty() -> None:
    """FireFunction reads `functions`, which no request sets: empty, not a failure."""
    source = "[{{ functions }}][{{ functions.name }}][{% for f in functions %}x{% endfor %}]{{ messages[0].content }}"
    assert ChatTemplate(source).render(MESSAGES) == "[][][]one"


def test_the_sandbox_still_refuses_internals() -> None:
    with pytest.raises(InvalidRequestError, match="unsafe"):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render(MESSAGES)
