"""Chat templates by name, as llama-server's `--chat-template NAME` picks
its built-in formats: the common ones, written as Jinja (each renders what
llama.cpp's own formatter writes for that name)."""

from __future__ import annotations

_GEN = "{% if add_generation_prompt %}"

BUILTIN_TEMPLATES = {
    "chatml": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    + _GEN
    + "<|im_start|>assistant\n{% endif %}",
    "llama3": "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content | trim }}<|eot_id|>{% endfor %}"
    + _GEN
    + "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
    "command-r": "{% set tokens = {'system': '<|SYSTEM_TOKEN|>', 'user': '<|USER_TOKEN|>', 'assistant': '<|CHATBOT_TOKEN|>'} %}"
    "{% for m in messages %}{% if m.role in tokens %}<|START_OF_TURN_TOKEN|>{{ tokens[m.role] }}"
    "{{ m.content | trim }}<|END_OF_TURN_TOKEN|>{% endif %}{% endfor %}"
    + _GEN
    + "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}",
    "phi3": "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
    + _GEN
    + "<|assistant|>\n{% endif %}",
    "zephyr": "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|endoftext|>\n{% endfor %}"
    + _GEN
    + "<|assistant|>\n{% endif %}",
    # Gemma has no system turn: the system text opens the next user turn.
    "gemma": "{% set ns = namespace(system='') %}{% for m in messages %}"
    "{% if m.role == 'system' %}{% set ns.system = ns.system + (m.content | trim) %}{% else %}"
    "{% set role = 'model' if m.role == 'assistant' else m.role %}<start_of_turn>{{ role }}\n"
    "{% if ns.system and role != 'model' %}{{ ns.system }}\n\n{% set ns.system = '' %}{% endif %}"
    "{{ m.content | trim }}<end_of_turn>\n{% endif %}{% endfor %}" + _GEN + "<start_of_turn>model\n{% endif %}",
}


def chat_template_source(value: str) -> str:
    """`--chat-template`'s value as Jinja: a built-in name, or a template itself."""
    if value in BUILTIN_TEMPLATES:
        return BUILTIN_TEMPLATES[value]
    if "{%" in value or "{{" in value:
        return value
    names = ", ".join(sorted(BUILTIN_TEMPLATES))
    raise ValueError(f"--chat-template {value!r} is neither a built-in name ({names}) nor a Jinja template")
