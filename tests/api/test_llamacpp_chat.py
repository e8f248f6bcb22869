"""llama-server's chat extensions and `/metrics` families on the real SmolLM2
(the shared server): `__verbose`, `timings_per_token`, `return_progress`,
`/chat/completions/input_tokens`, continuing a final assistant message, the
context-overflow error type, and the `llamacpp:*` metrics."""

from __future__ import annotations

import json
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.api.harness import API_KEY, ServerThread, make_settings

KEY = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def post(server: ServerThread, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers=KEY, timeout=120)


def stream(server: ServerThread, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{server.base_url}{path}", json=body, headers=KEY, timeout=120) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    return [json.loads(line) for line in lines if line != "[DONE]"]


def test_verbose_carries_the_prompt_only_when_asked(server: ServerThread) -> None:
    body = {"messages": MESSAGES, "max_tokens": 2, "temperature": 0}
    verbose = post(server, "/chat/completions", {**body, "verbose": True}).json()
    detail = verbose["__verbose"]
    assert detail["prompt"].endswith("<|im_start|>user\nWhat is the best book<|im_end|>\n<|im_start|>assistant\n")
    assert detail["tokens_evaluated"] == verbose["usage"]["prompt_tokens"]
    assert detail["content"] == verbose["choices"][0]["message"]["content"] and detail["stop_type"] == "limit"
    assert "__verbose" not in post(server, "/chat/completions", {**body, "verbose": False}).json()
    assert "__verbose" not in post(server, "/chat/completions", body).json()  # the server's --verbose is off


def test_timings_per_token_streamed_and_whole(server: ServerThread) -> None:
    body = {"messages": MESSAGES, "max_tokens": 6, "temperature": 0, "timings_per_token": True}
    chunks = stream(server, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    first, *rest = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None} and "timings" not in first
    assert rest and all("timings" in chunk for chunk in rest)
    last = rest[-1]["timings"]
    assert last["predicted_n"] == rest[-1]["usage"]["completion_tokens"] <= 6
    assert last["prompt_n"] + last["cache_n"] == rest[-1]["usage"]["prompt_tokens"]
    whole = post(server, "/v1/chat/completions", body).json()
    assert whole["timings"]["predicted_n"] == whole["usage"]["completion_tokens"]
    plain = stream(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3, "stream": True})
    assert not any("timings" in chunk for chunk in plain)  # nothing added unless asked


def test_return_progress_tells_the_cached_part_then_the_whole_prompt(server: ServerThread) -> None:
    body = {"messages": [{"role": "user", "content": "This is a test" * 10}], "max_tokens": 4, "stream": True}
    stream(server, "/chat/completions", body)  # the prefix cache now holds the prompt
    chunks = stream(server, "/chat/completions", {**body, "return_progress": True})
    progress = [chunk["prompt_progress"] for chunk in chunks if "prompt_progress" in chunk]
    assert len(progress) == 2
    start, done = progress
    assert start["processed"] == start["cache"] > 0 and start["time_ms"] == 0.0
    assert done["processed"] == done["total"] == start["total"] and done["cache"] == start["cache"]


def test_input_tokens_counts_the_prompt(server: ServerThread) -> None:
    reply = post(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1}).json()
    for path in ("/chat/completions/input_tokens", "/v1/chat/completions/input_tokens"):
        counted = post(server, path, {"messages": MESSAGES}).json()
        assert counted == {"input_tokens": reply["usage"]["prompt_tokens"]}


def test_a_final_assistant_message_is_continued(server: ServerThread) -> None:
    prefill = [*MESSAGES, {"role": "assistant", "content": "Whill"}]
    prompt = post(server, "/apply-template", {"messages": prefill}).json()["prompt"]
    assert prompt.endswith("What is the best book<|im_end|>\n<|im_start|>assistant\nWhill")
    parts = [
        *MESSAGES,
        {"role": "assistant", "content": [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]},
    ]
    assert post(server, "/apply-template", {"messages": parts}).json()["prompt"].endswith("assistant\nWh\n\nill")
    explicit = {"messages": prefill, "add_generation_prompt": False, "continue_final_message": True}
    assert post(server, "/apply-template", explicit).json()["prompt"] == prompt
    closed = post(server, "/apply-template", {"messages": prefill, "continue_final_message": False}).json()["prompt"]
    assert "Whill<|im_end|>" in closed and closed.endswith("<|im_start|>assistant\n")
    reply = post(server, "/v1/chat/completions", {"messages": prefill, "max_tokens": 2, "verbose": True}).json()
    assert reply["__verbose"]["prompt"].endswith("assistant\nWhill")
    both = post(server, "/v1/chat/completions", {**explicit, "add_generation_prompt": True, "max_tokens": 2})
    assert both.status_code == 400 and "add_generation_prompt" in both.json()["error"]["message"]
    twice = [*prefill, {"role": "assistant", "content": "again"}]
    assert post(server, "/v1/chat/completions", {"messages": twice, "max_tokens": 2}).status_code == 400


def test_context_overflow_is_llama_servers_error_type(server: ServerThread) -> None:
    long = [{"role": "user", "content": "word " * (server.settings.ctx_size + 10)}]
    response = post(server, "/chat/completions", {"messages": long, "max_tokens": 2})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "exceed_context_size_error" and error["code"] == "context_length_exceeded"
    assert error["n_ctx"] == server.settings.ctx_size < error["n_prompt_tokens"]


def llamacpp_metrics(server: ServerThread) -> tuple[httpx.Response, dict[str, tuple[str, float]]]:
    """llama-server's families as its test suite reads them: name -> (type, value)."""
    response = httpx.get(f"{server.base_url}/metrics", headers=KEY, timeout=30)
    assert response.status_code == 200
    types = {f.name: f.type for f in text_string_to_metric_families(response.text)}
    values = {}
    for line in response.text.splitlines():
        if line.startswith("llamacpp:"):
            name, number = line.split(" ", 1)
            assert f"# HELP {name} " in response.text and f"# TYPE {name} " in response.text
            family = name.removesuffix("_total") if types.get(name.removesuffix("_total")) else name
            values[name] = (types[family], float(number))
    return response, values


def test_llamacpp_metric_families(server: ServerThread) -> None:
    _, before = llamacpp_metrics(server)
    result = post(server, "/completion", {"prompt": "I believe", "n_predict": 8, "temperature": 0}).json()
    response, after = llamacpp_metrics(server)
    assert int(response.headers["Process-Start-Time-Unix"]) > 1_600_000_000
    assert after["llamacpp:tokens_predicted_total"][0] == "counter"
    assert after["llamacpp:requests_processing"] == ("gauge", 0.0)
    predicted = after["llamacpp:tokens_predicted_total"][1] - before["llamacpp:tokens_predicted_total"][1]
    assert predicted >= result["timings"]["predicted_n"]
    computed = after["llamacpp:prompt_tokens_total"][1] - before["llamacpp:prompt_tokens_total"][1]
    cached = after["llamacpp:prompt_tokens_cached_total"][1] - before["llamacpp:prompt_tokens_cached_total"][1]
    assert computed + cached >= result["tokens_evaluated"] and computed >= result["timings"]["prompt_n"]
    assert after["llamacpp:n_decode_total"][1] >= before["llamacpp:n_decode_total"][1] + result["tokens_predicted"]
    assert after["llamacpp:tokens_predicted_seconds_total"][1] > before["llamacpp:tokens_predicted_seconds_total"][1]


def test_completion_stream_progress_and_timings(server: ServerThread) -> None:
    body = {"prompt": "the quick brown fox " * 8, "n_predict": 4, "stream": True}
    events = stream(server, "/completion", {**body, "return_progress": True, "timings_per_token": True})
    progress = [e for e in events if "prompt_progress" in e]
    assert len(progress) == 2 and all("timings" in e for e in events)
    assert progress[0]["timings"]["prompt_n"] == 0 and progress[0]["timings"]["prompt_ms"] == 0.0
    assert progress[1]["timings"]["prompt_ms"] > 0 and progress[1]["prompt_progress"]["processed"] == len(
        server.tokenize(body["prompt"])
    )
    assert "cache_n" in events[-1]["timings"]


def test_no_metrics_answers_501() -> None:
    """`--no-metrics`: llama-server's answer without `--metrics`."""
    srv = ServerThread(make_settings(no_metrics=True, parallel=1, kv_size=1024, threads=1)).start()
    try:
        srv.wait_healthy()
        response = httpx.get(f"{srv.base_url}/metrics", timeout=30)
        assert response.status_code == 501 and response.json()["error"]["type"] == "not_supported_error"
    finally:
        srv.stop()


def test_templates_get_todays_date_as_llama_server_gives_it() -> None:
    """Llama 3's `date_string`, FireFunction's `datetime` and `functions` (the tools as JSON)."""
    import datetime

    from localserve.backends.chat_template import ChatTemplate
    from localserve.serving.prompts import render_messages

    today = datetime.date.today()
    template = ChatTemplate(
        "{{ date_string }}|{{ datetime }}|" + "{{ 'tools: ' + functions }}", bos_token="", eos_token=""
    )
    text = render_messages(template, [{"role": "user", "content": "Hi"}])
    assert text == f"{today.strftime('%d %b %Y')}|{today.strftime('%b %d %Y')}|tools: "
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert '"name": "f"' in render_messages(template, [{"role": "user", "content": "Hi"}], [tool])


def test_json_object_with_a_schema_follows_it(server: ServerThread) -> None:
    """llama-server's `{"type": "json_object", "schema": ...}`."""
    body = {
        "messages": MESSAGES,
        "max_tokens": 6,
        "response_format": {"type": "json_object", "schema": {"const": "42"}},
    }
    reply = post(server, "/v1/chat/completions", body)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == '"42"'
    bad = {**body, "response_format": {"type": "json_object", "schema": 123}}
    assert post(server, "/v1/chat/completions", bad).status_code == 400
