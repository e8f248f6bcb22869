"""What a request that leaves sampling options out gets, per dialect (the
README's "Sampling defaults" table), and that its own values win."""

from __future__ import annotations

from localserve.serving.ollama.request import OllamaOptions, ollama_options
from localserve.serving.openai.request import ChatCompletionRequest, sampling


def chat(**fields: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **fields})


def test_openai_dialects_take_llama_servers_cuts_and_openais_temperature() -> None:
    p = sampling(chat())
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p, p.repeat_penalty) == (1.0, 40, 0.95, 0.05, 1.0, 1.0)


def test_a_requests_own_values_win_including_those_that_turn_a_cut_off() -> None:
    p = sampling(chat(temperature=0.3, top_k=0, top_p=1.0, min_p=0.0, typical_p=0.5))
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p) == (0.3, 0, 1.0, 0.0, 0.5)


def test_the_ollama_dialect_keeps_ollamas_defaults() -> None:
    p = ollama_options(OllamaOptions(), priority=0.0).sampling
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.typical_p, p.repeat_penalty) == (0.8, 40, 0.9, 0.0, 1.0, 1.1)
    assert ollama_options(OllamaOptions(typical_p=0.7), priority=0.0).sampling.typical_p == 0.7
