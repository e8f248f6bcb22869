"""`--chat-template NAME`: llama-server's built-in formats as Jinja."""

from __future__ import annotations

import pytest

from localserve.backends.chat_template import ChatTemplate
from localserve.serving.builtin_templates import BUILTIN_TEMPLATES, chat_template_source

MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Hi there"}]


def render(name: str) -> str:
    return ChatTemplate(BUILTIN_TEMPLATES[name], bos_token="", eos_token="").render(MESSAGES)


def test_command_r_as_llama_server_writes_it() -> None:
    assert render("command-r") == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
        "<|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    )


def test_llama3_chatml_and_gemma() -> None:
    assert render("llama3").endswith("Hi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert render("chatml") == (
        "<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render("gemma") == "<start_of_turn>user\nYou are a test.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"


def test_a_name_or_jinja_else_an_error() -> None:
    assert chat_template_source("phi3") == BUILTIN_TEMPLATES["phi3"]
    assert chat_template_source("{{ messages }}") == "{{ messages }}"
    with pytest.raises(ValueError, match="built-in name"):
        chat_template_source("no-such-format")
