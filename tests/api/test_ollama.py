"""Ollama's dialect, with the official `ollama` Python client and raw NDJSON,
against the real SmolLM2 (the shared session server) and the real
all-MiniLM-L6-v2 (a server of this module) for embeddings. The editor
payloads are the shapes Continue, Zed and Open WebUI send (see
docs/editors.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import ollama
import pytest

from localserve.engine.types import FinishReason, TokenEvent
from localserve.serving.answer import ChoiceStream
from localserve.serving.ollama.answer import ChatLines
from localserve.serving.ollama.request import OllamaOptions, ollama_options
from localserve.serving.sampling import sampling_for
from localserve.serving.tools_parse import parse_reply
from localserve.serving.types import ChoiceResult
from tests.api.harness import API_KEY, MODEL_ID, ServerThread, make_settings

EMBED_MODEL = "all-minilm-l6-v2"
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
GREEDY = {"temperature": 0, "num_predict": 16}
TIMINGS = (
    "total_duration",
    "load_duration",
    "prompt_eval_count",
    "prompt_eval_duration",
    "eval_count",
    "eval_duration",
)


@pytest.fixture(scope="module")
def ol(server: ServerThread) -> ollama.Client:
    return ollama.Client(host=server.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120)


def ndjson(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.headers["content-type"].startswith("application/x-ndjson")
    lines = response.text.split("\n")
    assert lines[-1] == ""  # every line ends with a newline
    return [json.loads(line) for line in lines[:-1]]


def check_final(line: dict[str, Any]) -> None:
    assert line["done"] is True and line["done_reason"] in ("stop", "length")
    for key in TIMINGS:
        assert isinstance(line[key], int) and line[key] >= 0, key
    assert line["prompt_eval_count"] > 0 and line["eval_count"] > 0
    assert line["total_duration"] >= line["prompt_eval_duration"] + line["eval_duration"]


# ---- models ---------------------------------------------------------------------------------------


def test_root_and_version(http: httpx.Client) -> None:
    assert http.get("/").text == "Ollama is running"
    assert http.get("/api/version").json()["version"].count(".") == 2


def test_list_ps_show(ol: ollama.Client) -> None:
    models = {m.model: m for m in ol.list().models}
    assert MODEL_ID in models
    listed = models[MODEL_ID]
    assert listed.size > 50_000_000 and len(listed.digest) == 64
    assert listed.details.format == "gguf" and listed.details.family == "llama"
    assert listed.details.quantization_level == "Q4_1" and listed.details.parameter_size == "135M"
    running = {m.model: m for m in ol.ps().models}
    assert running[MODEL_ID].context_length == 2048
    shown = ol.show(MODEL_ID + ":latest")  # Ollama clients add the tag
    assert shown.modelinfo["llama.context_length"] == 2048
    assert "<|im_start|>" in shown.template
    assert set(shown.capabilities) == {"completion", "tools"}  # no FIM tokens: no "insert"


def test_errors_are_ollama_shaped(server: ServerThread, http: httpx.Client, ol: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        ol.chat(model="no-such-model", messages=QUESTION)
    assert caught.value.status_code == 404 and "no-such-model" in caught.value.error
    missing_key = httpx.get(f"{server.base_url}/api/tags")
    assert missing_key.status_code == 401 and isinstance(missing_key.json()["error"], str)
    bad = http.post(
        "/api/chat", json={"model": MODEL_ID, "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}
    )
    assert bad.status_code == 400 and "images" in bad.json()["error"]
    assert http.post("/api/pull", json={"model": "x"}).status_code == 404
    # /api/v1 is this server's own API: the OpenAI envelope stays.
    assert isinstance(http.get("/api/v1/models/nope").json()["error"], dict)


@pytest.mark.slow
def test_embed_on_a_chat_model_is_a_clear_400(ol: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as caught:
        ol.embed(model=MODEL_ID, input="hello")
    assert caught.value.status_code == 400 and "chat model" in caught.value.error


def test_options_map_to_sampling() -> None:
    def sampling(options: OllamaOptions | None) -> Any:
        return sampling_for(ollama_options(options, priority=1.0), num_prompt_tokens=100, n_ctx=2048)

    defaults = sampling(None)
    assert (defaults.temperature, defaults.top_k, defaults.top_p, defaults.repeat_penalty) == (0.8, 40, 0.9, 1.1)
    assert defaults.max_tokens == 1948 and defaults.seed is None and defaults.penalty_last_n == 64
    options = OllamaOptions.model_validate(
        {"num_ctx": 512, "num_predict": -1, "seed": -1, "stop": "END", "repeat_last_n": -1, "mirostat": 2}
    )
    capped = sampling(options)
    assert capped.max_tokens == 412 and capped.penalty_last_n == 512 and capped.stop == ("END",)
    too_small = OllamaOptions.model_validate({"num_ctx": 50, "num_predict": 10, "seed": 3})
    kept = sampling(too_small)
    assert kept.max_tokens == 10 and kept.seed == 3  # a num_ctx under the prompt is not honoured


class _Answer:
    """What `ChatLines` reads of an answer."""

    def __init__(self, stream: ChoiceStream) -> None:
        self.stream = stream
        self.submitted_ns = 0

    def first_token_ns(self, index: int) -> int:
        return self.stream.first_token_ns

    def token_ids(self, index: int) -> list[int]:
        return self.stream.token_ids


def test_streamed_tool_call_lines() -> None:
    stream = ChoiceStream(0, tools=True)
    answer: Any = _Answer(stream)
    lines = ChatLines("m", 0)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    events = [TokenEvent("r", (1,), ch) for ch in text]
    events.append(TokenEvent("r", (), "", finish_reason=FinishReason.STOP, num_prompt_tokens=5, num_output_tokens=30))
    out = []
    for event in events:
        stream.note(event)
        out += [line for delta in stream.deltas(event) for line in lines.add(delta, answer)]
    calls = [line["message"]["tool_calls"] for line in out if "tool_calls" in line["message"]]
    assert calls == [[{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]]
    assert not any(line["message"]["content"] for line in out)
    assert out[-1]["done"] is True and out[-1]["done_reason"] == "stop" and out[-1]["eval_count"] == 30
    reply = parse_reply(text)
    result = ChoiceResult(0, text, finish_reason="stop", tool_calls=reply.calls, content=reply.content)
    whole = ChatLines("m", 0).whole(result, answer)
    assert whole["message"]["tool_calls"] == calls[0] and whole["message"]["content"] == ""


# ---- chat and generate ------------------------------------------------------------------------


@pytest.mark.slow
def test_chat_stream_and_whole(ol: ollama.Client) -> None:
    whole = ol.chat(model=MODEL_ID, messages=QUESTION, options=GREEDY, stream=False)
    assert whole.message.role == "assistant" and "paris" in whole.message.content.lower()
    assert whole.done and whole.eval_count <= 16 and whole.prompt_eval_count > 10
    parts = list(ol.chat(model=MODEL_ID, messages=QUESTION, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count


@pytest.mark.slow
def test_generate_with_system_and_context(ol: ollama.Client) -> None:
    first = ol.generate(model=MODEL_ID, prompt="Name a color.", system="Answer in one word.", options=GREEDY)
    assert first.response and first.done and first.context
    num_tokens = first.prompt_eval_count + first.eval_count
    assert num_tokens - 1 <= len(first.context) <= num_tokens  # an end-of-generation token is counted, not kept
    follow = ol.generate(model=MODEL_ID, prompt="And another one?", context=first.context, options=GREEDY)
    assert follow.prompt_eval_count > len(first.context)
    raw = ol.generate(
        model=MODEL_ID, prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 3}
    )
    assert raw.context is None and raw.eval_count <= 3


@pytest.mark.slow
def test_raw_ndjson_stream_is_the_default(http: httpx.Client) -> None:
    response = http.post(
        "/api/generate",
        json={"model": MODEL_ID, "prompt": "Count: one, two,", "options": {"temperature": 0, "num_predict": 6}},
    )
    lines = ndjson(response)
    assert len(lines) >= 2 and all(line["model"] == MODEL_ID for line in lines)
    assert all(line["done"] is False and "response" in line for line in lines[:-1])
    assert lines[-1]["response"] == "" and lines[-1]["created_at"].endswith("Z")
    check_final(lines[-1])
    assert lines[-1]["eval_count"] <= 6 and lines[-1]["done_reason"] in ("length", "stop")


@pytest.mark.slow
def test_options_predict_stop_seed(ol: ollama.Client) -> None:
    story = [{"role": "user", "content": "Tell me a short story about a robot."}]
    cut = ol.chat(model=MODEL_ID, messages=story, options={"num_predict": 2, "temperature": 0})
    assert cut.eval_count == 2 and cut.done_reason == "length"
    options = {"temperature": 0.9, "seed": 42, "num_predict": 12, "top_k": 50, "top_p": 0.95, "repeat_penalty": 1.0}
    assert ol.chat(model=MODEL_ID, messages=story, options=options).message.content == (
        ol.chat(model=MODEL_ID, messages=story, options=options).message.content
    )
    free = ol.chat(model=MODEL_ID, messages=story, options=GREEDY | {"num_predict": 24}).message.content
    stop = " " + free.split()[4]  # a word in the middle of the free answer
    stopped = ol.chat(model=MODEL_ID, messages=story, options=GREEDY | {"num_predict": 24, "stop": [stop]})
    assert stopped.message.content == free[: free.index(stop)] and stopped.done_reason == "stop"


@pytest.mark.slow
def test_format_json_and_schema(ol: ollama.Client) -> None:
    asked = [{"role": "user", "content": "Describe a cat as JSON with a name and an age."}]
    reply = ol.chat(model=MODEL_ID, messages=asked, format="json", options={"temperature": 0, "num_predict": 96})
    assert reply.message.content.lstrip().startswith("{")
    if reply.done_reason == "stop":  # not cut by num_predict: whole JSON
        assert isinstance(json.loads(reply.message.content), dict)
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    typed = ol.chat(model=MODEL_ID, messages=asked, format=schema, options={"temperature": 0, "num_predict": 96})
    assert typed.done_reason == "stop"
    answer = json.loads(typed.message.content)
    assert isinstance(answer["name"], str) and isinstance(answer["age"], int)


@pytest.mark.slow
def test_tools_through_ollama(ol: ollama.Client) -> None:
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city's name
        """
        return "sunny"

    replies = [
        ol.chat(model=MODEL_ID, messages=[{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
                tools=[get_weather], options={"temperature": 0.8, "seed": seed, "num_predict": 60})
        for seed in range(2)
    ]  # fmt: skip
    for reply in replies:
        for call in reply.message.tool_calls or []:
            assert call.function.name == "get_weather" and isinstance(call.function.arguments["city"], str)
        if not reply.message.tool_calls:
            assert reply.message.content


def test_empty_requests_only_load(http: httpx.Client) -> None:
    chat = http.post("/api/chat", json={"model": MODEL_ID, "messages": []}).json()
    assert chat["done"] is True and chat["done_reason"] == "load"
    generate = http.post("/api/generate", json={"model": MODEL_ID, "keep_alive": "5m"}).json()
    assert generate["done_reason"] == "load" and generate["response"] == ""


def test_generate_suffix_needs_fim_tokens(http: httpx.Client) -> None:
    response = http.post("/api/generate", json={"model": MODEL_ID, "prompt": "def f(", "suffix": ")", "stream": False})
    assert response.status_code == 400 and "fill in the middle" in response.json()["error"]


# ---- the editors' payloads ----------------------------------------------------------------------


@pytest.mark.slow
def test_continue_payloads(http: httpx.Client) -> None:
    """Continue's Ollama provider: /api/show {name} on start (it reads
    `parameters` lines and looks for `.Suffix` in the template), then
    /api/chat streaming with its options and keep_alive in seconds."""
    shown = http.post("/api/show", json={"name": MODEL_ID}).json()
    for line in shown["parameters"].split("\n"):
        key, value = line.split(" ", 1)
        assert key in ("num_ctx", "stop")
        if key == "stop":
            json.loads(value)  # Continue JSON-parses each stop value
    assert ".Suffix" not in shown["template"]  # no FIM tokens: Continue will not try FIM
    body = {
        "model": MODEL_ID,
        "messages": [{"role": "system", "content": "You are a coding assistant."}, *QUESTION],
        "options": {"temperature": 0, "num_predict": 8, "num_ctx": 4096, "stop": ["```"]},
        "keep_alive": 1800,
        "stream": True,
    }
    lines = ndjson(http.post("/api/chat", json=body))
    check_final(lines[-1])
    assert all(line["message"]["role"] == "assistant" for line in lines)


@pytest.mark.slow
def test_zed_payloads(http: httpx.Client) -> None:
    """Zed's Ollama provider: /api/tags, /api/show {model} for capabilities,
    /api/chat with nulls for unset options, keep_alive -1, tools, think."""
    listing = http.get("/api/tags").json()["models"]
    assert {"name", "modified_at", "size", "digest", "details"} <= set(listing[0])
    capabilities = http.post("/api/show", json={"model": MODEL_ID}).json()["capabilities"]
    assert "tools" in capabilities
    body = {
        "model": MODEL_ID,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}], "thinking": None},
            {"role": "tool", "tool_name": "weather", "content": "sunny"},
        ],
        "stream": False,
        "keep_alive": -1,
        "options": {"num_ctx": 2048, "num_predict": 12, "stop": None, "temperature": 0.0, "top_p": None},
        "tools": [{"type": "function", "function": {"name": "weather", "description": None, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "think": None,
    }  # fmt: skip
    reply = http.post("/api/chat", json=body)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    check_final(answer)
    assert answer["message"]["role"] == "assistant" and isinstance(answer["message"]["content"], str)


@pytest.mark.slow
def test_open_webui_payloads(http: httpx.Client) -> None:
    """Open WebUI's Ollama connection: /api/version, /api/tags, /api/ps, then
    /api/chat as its converter writes it (root `format`, options with
    `num_predict`, tool messages with `tool_call_id`, `metadata`)."""
    assert http.get("/api/version").status_code == 200
    assert http.get("/api/ps").json()["models"]
    body = {
        "model": MODEL_ID + ":latest",
        "messages": [
            *QUESTION,
            {"role": "assistant", "content": "", "tool_calls": [{"index": 0, "id": "c1", "function": {"name": "lookup", "arguments": {"q": "France"}}}]},
            {"role": "tool", "content": "Paris", "tool_call_id": "c1"},
        ],
        "stream": True,
        "options": {"temperature": 0, "num_predict": 8, "seed": 1},
        "format": {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 10}}, "required": ["answer"]},
        "keep_alive": "5m",
        "metadata": {"chat_id": "x"},
    }  # fmt: skip
    lines = ndjson(http.post("/api/chat", json=body))
    check_final(lines[-1])
    assert lines[0]["model"] == MODEL_ID + ":latest"


# ---- embeddings (their own server) --------------------------------------------------------------


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOCALSERVE_HOME", str(tmp_path_factory.mktemp("localserve-home")))
        srv = ServerThread(make_settings(models=[EMBED_MODEL], threads=2)).start()
        try:
            srv.wait_healthy(timeout=300)
            yield srv
        finally:
            srv.stop()


@pytest.mark.slow
def test_embed_with_the_client(embed_server: ServerThread) -> None:
    ol = ollama.Client(host=embed_server.base_url, timeout=120)
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "A monkey is playing drums."]
    food, bread, drums = np.array(ol.embed(model=EMBED_MODEL, input=texts).embeddings)
    assert food.shape == (384,) and abs(float(np.linalg.norm(food)) - 1.0) < 1e-3
    assert float(food @ bread) > float(food @ drums)
    single = ol.embed(model=EMBED_MODEL + ":latest", input=texts[0])
    assert single.prompt_eval_count > 0
    np.testing.assert_allclose(single.embeddings[0], food, atol=1e-5)
    legacy = ol.embeddings(model=EMBED_MODEL, prompt=texts[0])
    np.testing.assert_allclose(legacy.embedding, food, atol=1e-5)
    assert EMBED_MODEL in {m.model for m in ol.list().models}
    assert ol.show(EMBED_MODEL).capabilities == ["embedding"]
    long_text = "word " * 2000  # over the model's 512 tokens: truncated by default, as Ollama does
    assert len(ol.embed(model=EMBED_MODEL, input=long_text).embeddings[0]) == 384
    with pytest.raises(ollama.ResponseError) as caught:
        ol.embed(model=EMBED_MODEL, input=long_text, truncate=False)
    assert caught.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as refused:
        ol.chat(model=EMBED_MODEL, messages=QUESTION)
    assert refused.value.status_code == 400


@pytest.mark.slow
def test_open_webui_embed_payload_and_batcher_metrics(embed_server: ServerThread) -> None:
    with httpx.Client(base_url=embed_server.base_url, timeout=120) as http:
        body = {
            "model": EMBED_MODEL,
            "input": ["one", "two"],
            "prompt": "one\ntwo",
            "truncate": True,
            "keep_alive": "5m",
        }
        answer = http.post("/api/embed", json=body).json()
        assert len(answer["embeddings"]) == 2 and answer["model"] == EMBED_MODEL
        metrics = http.get("/metrics").text
    items = [line for line in metrics.splitlines() if line.startswith("localserve_oneshot_items_total{")]
    assert items and float(items[0].rsplit(" ", 1)[1]) >= 2
    assert "localserve_oneshot_padding_ratio{" in metrics
