"""Legacy completions against the real SmolLM2 model, through the `openai` SDK."""

from __future__ import annotations

import openai
import pytest

from tests.api.harness import MODEL_ID, ServerThread

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


def test_string_prompt(client: openai.OpenAI, server: ServerThread) -> None:
    reply = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=0)
    assert reply.object == "text_completion"
    assert reply.id.startswith("cmpl-")
    assert reply.model == MODEL_ID
    assert "paris" in reply.choices[0].text.lower()
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens == len(server.tokenize(PROMPT))
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_default_max_tokens_is_sixteen(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL_ID, prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == 16
    assert reply.choices[0].finish_reason == "length"


def test_token_id_prompt_equals_text_prompt(client: openai.OpenAI, server: ServerThread) -> None:
    ids = server.tokenize(PROMPT)
    by_text = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.usage.prompt_tokens == len(ids) == by_text.usage.prompt_tokens
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_list_prompts_with_n(client: openai.OpenAI, server: ServerThread) -> None:
    prompts = ["The capital of France is", "1, 2, 3, 4,"]
    reply = client.completions.create(model=MODEL_ID, prompt=prompts, n=2, max_tokens=6, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    # Choice p * n + i belongs to prompt p; greedy, so both choices of a prompt agree.
    assert reply.choices[0].text == reply.choices[1].text
    assert reply.choices[2].text == reply.choices[3].text
    assert "paris" in reply.choices[0].text.lower()
    assert "5" in reply.choices[2].text
    # Each prompt is counted once in prompt_tokens.
    assert reply.usage.prompt_tokens == sum(len(server.tokenize(p)) for p in prompts)
    token_lists = [server.tokenize(p) for p in prompts]
    by_ids = client.completions.create(model=MODEL_ID, prompt=token_lists, max_tokens=6, temperature=0)
    assert [c.text for c in by_ids.choices] == [reply.choices[0].text, reply.choices[2].text]


def test_stream_with_usage(client: openai.OpenAI) -> None:
    # The prompt into the prefix cache first, so that both answers compared below read it alike
    # (a whole prompt and its last token alone round differently: README, Sampling defaults).
    client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=1, temperature=0)
    whole = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=8, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL_ID,
            prompt=PROMPT,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text


def test_echo(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL_ID, prompt=PROMPT, max_tokens=4, temperature=0)
    assert reply.choices[0].text == PROMPT + plain.choices[0].text


def test_stop(client: openai.OpenAI) -> None:
    free = client.completions.create(model=MODEL_ID, prompt="1, 2, 3,", max_tokens=12, temperature=0)
    text = free.choices[0].text
    assert len(text) >= 6, text
    stop = text[len(text) // 2 : len(text) // 2 + 2]  # cut the free answer in its middle
    cut = client.completions.create(model=MODEL_ID, prompt="1, 2, 3,", max_tokens=12, temperature=0, stop=[stop, "@@"])
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_legacy_logprobs_shape(client: openai.OpenAI) -> None:
    reply = client.completions.create(
        model=MODEL_ID, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    )
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 5
    assert "".join(logprobs.tokens) == reply.choices[0].text
    assert logprobs.text_offset[0] == 0
    for i in range(1, 5):
        assert logprobs.text_offset[i] == logprobs.text_offset[i - 1] + len(logprobs.tokens[i - 1])
    for token, value, top in zip(logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert value <= 0.0
        assert 1 <= len(top) <= 2
        assert max(top, key=top.get) == token  # greedy picks the most likely
