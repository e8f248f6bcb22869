"""Reasoning in each dialect's own fields (issue 31), end to end with the
real SmolLM2 under a chat template that opens a think section (the way
DeepSeek-R1 distills do): what the model writes is its thinking until it
writes `</think>`, then the answer. No small reasoning model ships on PyPI,
so SmolLM2 never closes the section by itself; what is tested is the
parser and the wire formats, whole and streamed, and `think: false`
closing the section in the prompt."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.api.harness import ServerThread, make_settings

pytestmark = pytest.mark.slow

THINKING_TEMPLATE = (  # an earlier turn's reasoning is rendered, as Qwen3's template does in a tool-calling loop
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n{% endif %}"
    "{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}"
)
ASK = [{"role": "user", "content": "What is the capital of France?"}]
BUDGET = 12  # the server's --reasoning-budget: SmolLM2 never closes the section by itself


@pytest.fixture(scope="module")
def thinking_model(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 with the template above (a copy with new metadata)."""
    out = tmp_path_factory.mktemp("reasoning") / "smollm2-thinking.gguf"
    subprocess.run(
        [sys.executable, "-m", "gguf.scripts.gguf_new_metadata", str(smollm2_path), str(out), "--chat-template",
         THINKING_TEMPLATE, "--force"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def server(thinking_model: Path) -> Iterator[ServerThread]:
    settings = make_settings(models=[str(thinking_model)], parallel=2, kv_size=4096, reasoning_budget=BUDGET)
    srv = ServerThread(settings).start()
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def model_id(server: ServerThread) -> str:
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        return str(http.get("/v1/models").json()["data"][0]["id"])


def _openai(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0, timeout=120)


def test_chat_gives_reasoning_content_whole_and_streamed(server: ServerThread, model_id: str) -> None:
    client = _openai(server)
    # The prompt into the prefix cache first, so that both answers compared below read it alike
    # (a whole prompt and its last token alone round differently: README, Sampling defaults).
    client.chat.completions.create(model=model_id, messages=ASK, max_tokens=1, temperature=0)  # type: ignore[arg-type]
    whole = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    message = whole.choices[0].message.model_dump()
    assert message["reasoning_content"], "the output starts inside the opened section"
    assert "<think>" not in message["reasoning_content"] and "</think>" not in (message["content"] or "")
    stream = client.chat.completions.create(
        model=model_id,
        messages=ASK,
        max_tokens=24,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    pieces = [c.choices[0].delta.model_dump() for c in stream if c.choices]
    streamed = "".join(p.get("reasoning_content") or "" for p in pieces)
    assert streamed == message["reasoning_content"]
    assert "".join(p.get("content") or "" for p in pieces) == (message["content"] or "")


def test_reasoning_effort_none_closes_the_section(server: ServerThread, model_id: str) -> None:
    whole = _openai(server).chat.completions.create(
        model=model_id,
        messages=ASK,
        max_tokens=24,
        temperature=0,
        reasoning_effort="none",  # type: ignore[arg-type]
    )
    message = whole.choices[0].message.model_dump()
    assert message.get("reasoning_content") is None and message["content"]


def test_ollama_thinking_and_think_false(server: ServerThread, model_id: str) -> None:
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        body = {"model": model_id, "messages": ASK, "stream": False, "options": {"temperature": 0, "num_predict": 24}}
        thought = http.post("/api/chat", json=body).json()["message"]
        assert thought["thinking"] and "thinking" in thought
        plain = http.post("/api/chat", json=body | {"think": False}).json()["message"]
        assert "thinking" not in plain and plain["content"]
        lines = [json.loads(line) for line in http.post("/api/chat", json=body | {"stream": True}).text.splitlines()]
        assert "".join(line["message"].get("thinking", "") for line in lines) == thought["thinking"]


def test_anthropic_thinking_blocks(server: ServerThread, model_id: str) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    greedy = {"temperature": 0}
    message = client.messages.create(model=model_id, max_tokens=24, messages=ASK, extra_body=greedy)  # type: ignore[arg-type]
    assert message.content[0].type == "thinking" and message.content[0].thinking
    with client.messages.stream(model=model_id, max_tokens=24, messages=ASK, extra_body=greedy) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert final.content[0].type == "thinking" and final.content[0].thinking == message.content[0].thinking
    off = client.messages.create(
        model=model_id,
        max_tokens=24,
        messages=ASK,
        extra_body=greedy | {"thinking": {"type": "disabled"}},  # type: ignore[arg-type]
    )
    assert [block.type for block in off.content] == ["text"]


def test_responses_reasoning_items(server: ServerThread, model_id: str) -> None:
    client = _openai(server)
    response = client.responses.create(
        model=model_id, input="What is the capital of France?", max_output_tokens=24, temperature=0
    )
    assert response.output[0].type == "reasoning"
    text = response.output[0].model_dump()["content"][0]["text"]
    assert text
    events = list(
        client.responses.create(
            model=model_id, input="What is the capital of France?", max_output_tokens=24, temperature=0, stream=True
        )
    )
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == text
    assert events[-1].type in ("response.completed", "response.incomplete")


def test_earlier_thinking_reaches_the_template_in_every_dialect(server: ServerThread, model_id: str) -> None:
    """A client sends an earlier answer's thinking back (OpenAI's `reasoning_content` or `reasoning`,
    Anthropic's `thinking` blocks, Ollama's `thinking`): the template gets it as `reasoning_content`."""
    thought = "The user wants the capital; Paris it is."
    turns = [{"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]
    turns.append({"role": "user", "content": "And of Spain?"})
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        for field in ("reasoning_content", "reasoning"):
            told = [turns[0], turns[1] | {field: thought}, turns[2]]
            prompt = http.post("/apply-template", json={"model": model_id, "messages": told}).json()["prompt"]
            assert f"<think>\n{thought}\n</think>\n\nParis." in prompt, (field, prompt)

        def count(assistant_content: list[dict]) -> int:
            said = {"role": "assistant", "content": assistant_content}
            body = {"model": model_id, "messages": [turns[0], said, turns[2]]}
            return int(http.post("/v1/messages/count_tokens", json=body).json()["input_tokens"])

        text = {"type": "text", "text": "Paris."}
        thinking = {"type": "thinking", "thinking": thought, "signature": "x"}
        redacted = {"type": "redacted_thinking", "data": "opaque"}
        assert count([thinking, text]) > count([text]) == count([redacted, text])

        def prompt_tokens(assistant: dict) -> int:
            body = {"model": model_id, "messages": [turns[0], assistant, turns[2]], "stream": False}
            body["options"] = {"temperature": 0, "num_predict": 1}
            return int(http.post("/api/chat", json=body).json()["prompt_eval_count"])

        assert prompt_tokens(turns[1] | {"thinking": thought}) > prompt_tokens(turns[1])


def test_the_budget_closes_the_section_and_the_answer_follows(server: ServerThread, model_id: str) -> None:
    client = _openai(server)
    story = [{"role": "user", "content": "Write a long story about a cat who sails around the world."}]
    whole = client.chat.completions.create(model=model_id, messages=story, max_tokens=48, temperature=0)  # type: ignore[arg-type]
    message = whole.choices[0].message.model_dump()
    assert message["reasoning_content"] and message["content"], "after the budget, </think> is forced, then the answer"
    assert len(message["reasoning_content"].split()) <= BUDGET  # words: at most one per token
    anthropic_client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    short = anthropic_client.messages.create(
        model=model_id,
        max_tokens=48,
        messages=story,  # type: ignore[arg-type]
        extra_body={"temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 3}},
    )
    assert short.content[0].type == "thinking" and short.content[1].type == "text"
    assert len(short.content[0].thinking) < len(message["reasoning_content"])


def test_a_json_schema_constrains_the_answer_after_the_thinking(server: ServerThread, model_id: str) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    whole = _openai(server).chat.completions.create(
        model=model_id,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    message = whole.choices[0].message.model_dump()
    assert message["reasoning_content"]
    assert set(json.loads(message["content"])) == {"city"} and whole.choices[0].finish_reason == "stop"
