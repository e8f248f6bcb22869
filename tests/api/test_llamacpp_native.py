"""llama-server's own endpoints on the real SmolLM2 (the shared server):
`/completion` (and `/completions`), `/tokenize`, `/detokenize`,
`/apply-template`, `/props`, `/slots`, the unprefixed OpenAI routes, the
model-name fallback and the context-overflow fields."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from localserve.serving.llamacpp.request import NativeCompletionRequest, with_server_defaults
from tests.api.harness import API_KEY, MODEL_ID, ServerThread, make_settings

KEY = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The capital of France is"


def post(server: ServerThread, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=KEY, timeout=120)


def complete(server: ServerThread, **body: Any) -> dict[str, Any]:
    response = post(server, "/completion", {"n_predict": 8, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_completion_answers_in_llama_servers_shape(server: ServerThread) -> None:
    result = complete(server, prompt=PROMPT, return_tokens=True)
    assert "Paris" in result["content"]
    assert result["stop"] is True and result["model"] == MODEL_ID
    assert result["stop_type"] in ("limit", "eos", "word")
    assert result["tokens_predicted"] == result["timings"]["predicted_n"] == len(result["tokens"]) <= 8
    assert result["tokens_evaluated"] == len(server.tokenize(PROMPT))
    assert result["generation_settings"]["n_predict"] == 8
    assert isinstance(result["has_new_line"], bool) and result["truncated"] is False
    # The unprefixed /completions is the same native endpoint, as in llama-server.
    again = post(server, "/completions", {"prompt": PROMPT, "n_predict": 8, "temperature": 0}).json()
    assert again["content"] == result["content"]


def test_completion_takes_token_ids_mixes_and_lists(server: ServerThread) -> None:
    tokens = post(server, "/tokenize", {"content": PROMPT}).json()["tokens"]
    text = complete(server, prompt=PROMPT)["content"]
    assert complete(server, prompt=tokens)["content"] == text
    both = post(server, "/completion", {"prompt": [tokens, PROMPT], "n_predict": 8, "temperature": 0}).json()
    assert isinstance(both, list) and [r["content"] for r in both] == [text, text]
    assert [r["index"] for r in both] == [0, 1]
    as_json = post(
        server, "/completion", {"prompt": [tokens, {"prompt_string": PROMPT}], "n_predict": 8, "temperature": 0}
    )
    assert [r["content"] for r in as_json.json()] == [text, text]
    head = server.tokenize("The capital of")
    ids = [*head, *server.tokenize(" France is")]
    mixed = complete(server, prompt=[*head, " France is"])  # ids and text in one prompt
    assert mixed["tokens_evaluated"] == len(ids)
    assert mixed["content"] == complete(server, prompt=ids)["content"]


def test_completion_stream_events(server: ServerThread) -> None:
    body = {"prompt": PROMPT, "n_predict": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/completion", json=body, headers=KEY, timeout=120) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    *pieces, last = events
    assert pieces and all(e["stop"] is False for e in pieces)
    assert last["stop"] is True and last["timings"]["predicted_n"] == len(pieces)
    assert "".join(e["content"] for e in pieces) == complete(server, prompt=PROMPT)["content"]


def test_cache_prompt_false_computes_the_whole_prompt(server: ServerThread) -> None:
    """llama-server's `cache_prompt: false`: no cached prefix reused, so the
    whole prompt is computed (`prompt_n`) and nothing counts as cached."""
    prompt = "A list of the planets of the solar system, in order from the Sun:"
    num_tokens = len(server.tokenize(prompt))
    complete(server, prompt=prompt)  # now cached in a slot
    cached = complete(server, prompt=prompt)["timings"]
    assert cached["cache_n"] == num_tokens - 1 and cached["prompt_n"] == 1
    whole = complete(server, prompt=prompt, cache_prompt=False)["timings"]
    assert whole["cache_n"] == 0 and whole["prompt_n"] == num_tokens
    props = httpx.get(f"{server.base_url}/props", headers=KEY, timeout=30).json()
    assert "cache_prompt" not in props["localserve"]["ignored_fields"]


def test_completion_n_probs(server: ServerThread) -> None:
    result = complete(server, prompt=PROMPT, n_probs=3, n_predict=4)
    probs = result["completion_probabilities"]
    assert len(probs) == result["tokens_predicted"]
    for entry in probs:
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][-1]["logprob"]
        assert entry["logprob"] <= 0 and isinstance(entry["token"], str) and isinstance(entry["bytes"], list)
    assert probs[0]["id"] == probs[0]["top_logprobs"][0]["id"]  # greedy: the best one


def test_tokenize_detokenize(server: ServerThread) -> None:
    text = "What is the capital of France? 媽 🤗"
    tokens = post(server, "/tokenize", {"content": text}).json()["tokens"]
    assert tokens == server.tokenize(text)  # SmolLM2 adds no BOS
    assert post(server, "/detokenize", {"tokens": tokens}).json() == {"content": text}
    pieces = post(server, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    assert all(isinstance(p["piece"], str | list) and p["piece"] for p in pieces)
    assert "".join(p["piece"] for p in pieces if isinstance(p["piece"], str)).startswith("What is")
    bad = post(server, "/detokenize", {"tokens": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_apply_template(server: ServerThread) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    prompt = post(server, "/apply-template", {"messages": messages}).json()["prompt"]
    assert "<|im_start|>user\nHi there<|im_end|>" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    bare = post(server, "/apply-template", {"messages": messages, "add_generation_prompt": False}).json()["prompt"]
    assert not bare.endswith("<|im_start|>assistant\n")


def test_props_and_slots(server: ServerThread) -> None:
    props = httpx.get(f"{server.base_url}/props", headers=KEY).json()
    assert props["total_slots"] == server.settings.parallel
    assert props["default_generation_settings"]["n_ctx"] == server.settings.ctx_size
    assert props["model_path"].endswith(".gguf") and "<|im_start|>" in props["chat_template"]
    slots = httpx.get(f"{server.base_url}/slots", headers=KEY).json()
    assert [s["id"] for s in slots] == list(range(server.settings.parallel))
    assert all(s["n_ctx"] == server.settings.ctx_size for s in slots)
    assert post(server, "/slots/0?action=erase", {}).json() == {"id_slot": 0, "n_erased": 0}
    save = post(server, "/slots/0?action=save", {"filename": "x.bin"})
    assert save.status_code == 501 and save.json()["error"]["type"] == "not_supported_error"


def test_unprefixed_openai_routes(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)  # no /v1
    assert [m.id for m in client.models.list()] == [MODEL_ID]
    reply = client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Say hi"}], max_tokens=4, temperature=0
    )
    assert reply.choices[0].message.content
    response = client.responses.create(model=MODEL_ID, input="Say hi", max_output_tokens=16, temperature=0)
    assert response.output_text


def test_a_missing_or_foreign_model_name_means_the_only_model(server: ServerThread) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    reply = client.chat.completions.create(
        model="gpt-3.5-turbo", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
    )
    assert reply.model == MODEL_ID  # the answer names the model that served it
    no_model = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert no_model.status_code == 200 and no_model.json()["model"] == MODEL_ID
    weird = post(server, "/v1/completions", {"model": "not a name!", "prompt": "Hi", "max_tokens": 2})
    assert weird.status_code == 200 and weird.json()["model"] == MODEL_ID


@pytest.fixture(scope="module")
def strict_server() -> Iterator[ServerThread]:
    srv = ServerThread(make_settings(strict_model_names=True, parallel=2, kv_size=4096, threads=1)).start()
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


def test_strict_model_names_keep_400_and_404(strict_server: ServerThread) -> None:
    url = f"{strict_server.base_url}/v1/chat/completions"
    messages = [{"role": "user", "content": "Hi"}]
    unknown = httpx.post(url, json={"model": "gpt-3.5-turbo", "messages": messages, "max_tokens": 2})
    assert unknown.status_code == 404
    missing = httpx.post(url, json={"messages": messages, "max_tokens": 2})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"


def test_context_overflow_carries_the_counts(server: ServerThread) -> None:
    prompt = "word " * (server.settings.ctx_size + 10)
    response = post(server, "/v1/completions", {"model": MODEL_ID, "prompt": prompt, "max_tokens": 2})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["n_ctx"] == server.settings.ctx_size
    assert error["n_prompt_tokens"] == len(server.tokenize(prompt)) > error["n_ctx"]
    native = post(server, "/completion", {"prompt": prompt, "n_predict": 2})
    assert native.status_code == 400 and native.json()["error"]["n_ctx"] == server.settings.ctx_size


def test_v1_models_entries_carry_the_picker_block(server: ServerThread) -> None:
    (entry,) = httpx.get(f"{server.base_url}/v1/models", headers=KEY).json()["data"]
    assert entry["owned_by"] == "localserve"
    assert entry["localserve"] == {"kind": "chat", "backend": "llamacpp", "loaded": True, "variant_of": None}
    one = httpx.get(f"{server.base_url}/v1/models/{MODEL_ID}", headers=KEY).json()
    assert one["localserve"] == entry["localserve"]
    listed = httpx.get(f"{server.base_url}/v1/models?all=true", headers=KEY).json()["data"]
    blocks = {item["id"]: item["localserve"] for item in listed}
    assert all(set(block) == {"kind", "backend", "loaded", "variant_of"} for block in blocks.values())
    assert sum(block["loaded"] for block in blocks.values()) == 1


def test_variant_of_names_the_model_a_variant_belongs_to() -> None:
    from localserve.models.catalog import variant_of

    assert variant_of("all-minilm-l6-v2-onnx-int8") == "all-minilm-l6-v2"
    assert variant_of("whisper-tiny.en-cpp") == "whisper-tiny.en"
    assert variant_of("smollm2-135m-instruct") is None
    assert variant_of("smollm2-360m-instruct") is None  # not a variant of the 135M one
    assert variant_of("mine-openvino", ["mine"]) == "mine"


def test_reasoning_off_closes_the_think_section(tmp_path: Path) -> None:
    """`--reasoning off` renders templates with `enable_thinking` false, as
    llama-server does, in `/apply-template` and in the chat path."""
    template = tmp_path / "think.jinja"
    template.write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
        "{% if not enable_thinking %}</think>{% endif %}{% endif %}"
    )
    settings = make_settings(reasoning="off", chat_template_file=str(template), parallel=1, kv_size=1024, threads=1)
    srv = ServerThread(settings).start()
    try:
        srv.wait_healthy()
        prompt = post(srv, "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}).json()["prompt"]
        assert prompt.endswith("<|im_start|>assistant\n<think>\n</think>")
        reply = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert reply.status_code == 200 and reply.json()["usage"]["prompt_tokens"] > 0
    finally:
        srv.stop()


def test_completion_logit_bias_in_both_shapes(server: ServerThread) -> None:
    """llama-server's `logit_bias`: pairs or an object, tokens as ids or text
    (every token of it), `false` = never; reported in `generation_settings`."""
    free = complete(server, prompt=PROMPT)["content"]
    first = post(server, "/tokenize", {"content": free}).json()["tokens"][0]
    as_ids = complete(server, prompt=PROMPT, logit_bias=[[first, False]])
    assert as_ids["content"] != free
    assert as_ids["generation_settings"]["logit_bias"] == [{"token": first, "bias": None}]
    piece = httpx.post(f"{server.base_url}/detokenize", json={"tokens": [first]}, headers=KEY).json()["content"]
    as_text = complete(server, prompt=PROMPT, logit_bias={piece: -100})
    assert as_text["content"] == as_ids["content"]
    as_key = complete(server, prompt=PROMPT, logit_bias={str(first): -100})
    assert as_key["content"] == as_ids["content"]
    assert complete(server, prompt=PROMPT)["generation_settings"]["logit_bias"] == []
    banned = complete(server, prompt=PROMPT, ignore_eos=True)["generation_settings"]["logit_bias"]
    assert banned and all(entry["bias"] is None for entry in banned)
    bad = post(server, "/completion", {"prompt": PROMPT, "logit_bias": [[10**9, -1]]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logit_bias"


def test_completion_post_sampling_probs_and_rates(server: ServerThread) -> None:
    body = complete(server, prompt=PROMPT, n_probs=5, n_predict=4, post_sampling_probs=True)
    for entry in body["completion_probabilities"]:
        assert 0.0 < entry["prob"] <= 1.0 and "logprob" not in entry
        assert entry["top_probs"] and all(0.0 < p["prob"] <= 1.0 for p in entry["top_probs"])
    timings = body["timings"]  # the first token costs no decode step of its own
    assert timings["predicted_per_second"] == pytest.approx(3 / timings["predicted_ms"] * 1000)
    one = complete(server, prompt=PROMPT, n_predict=1)["timings"]
    assert one["predicted_n"] == 1 and one["predicted_per_second"] == 0.0 and one["predicted_per_token_ms"] == 0.0


def test_server_temp_and_seed_fill_what_a_body_leaves_out() -> None:
    body = NativeCompletionRequest.model_validate({"prompt": "x"})
    filled = with_server_defaults(body, 0.0, 42)
    assert (filled.temperature, filled.seed) == (0.0, 42)
    own = with_server_defaults(NativeCompletionRequest.model_validate({"temperature": 1.0, "seed": 7}), 0.0, 42)
    assert (own.temperature, own.seed) == (1.0, 7)
    assert with_server_defaults(body, 0.8, -1).seed is None  # -1: random, as the body's default


def test_a_requests_n_predict_wins_over_the_servers() -> None:
    """llama-server's rule: `--n-predict` is the default, not a cap."""
    from localserve.serving.llamacpp.request import n_predict_of

    assert (n_predict_of(80, 64), n_predict_of(-1, 64), n_predict_of(-1, -1), n_predict_of(8, -1)) == (80, 64, -1, 8)
