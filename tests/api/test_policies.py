"""Fast checks of the pure parts of the API edge: error paths, Host and
Origin policies, request schemas (no model needed)."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from localserve.api.security import HostPolicy, OriginPolicy, host_name
from localserve.config import ServerSettings
from localserve.serving.openai.request import ChatCompletionRequest, TextCompletionRequest
from localserve.serving.validation import field_path, from_validation_error


@pytest.mark.parametrize(
    ("loc", "path"),
    [
        (("messages", 0, "content"), "messages[0].content"),
        (("messages", 1, "content", "str"), "messages[1].content"),
        (("response_format", "json_schema", "schema"), "response_format.json_schema.schema"),
        (("stop", "list[str]", 3), "stop[3]"),
        ((), None),
    ],
)
def test_field_path(loc: tuple[int | str, ...], path: str | None) -> None:
    assert field_path(loc) == path


def test_validation_error_names_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": 5}]})
    error = from_validation_error(caught.value)
    assert error.status == 400
    assert error.param == "messages[0].content"
    assert "messages[0].content" in error.message


@pytest.mark.parametrize(
    ("header", "name"),
    [("[::1]:8400", "::1"), ("[::1]", "::1"), ("LocalHost.:80", "localhost"), ("::1", "::1"), ("a.b", "a.b")],
)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


def test_host_policy_defaults() -> None:
    policy = HostPolicy(ServerSettings())
    for name in ("localhost", "127.0.0.1", "::1", "app.localhost", socket.gethostname().lower()):
        assert policy.allows(name), name
    for name in ("evil.example", "localhost.evil.example", "10.0.0.2", "127.0.0.2"):
        assert not policy.allows(name), name


def test_host_policymake_settings() -> None:
    assert HostPolicy(ServerSettings(allow_hosts=["llm.lan"])).allows("llm.lan")
    assert HostPolicy(ServerSettings(allow_hosts=["*"])).allows("anything.example")
    everywhere = HostPolicy(ServerSettings(host="0.0.0.0"))
    assert everywhere.allows("192.168.1.20")  # an IP literal cannot be a rebinding attack
    assert not everywhere.allows("evil.example")


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost:3000",
        "https://127.0.0.1",
        "http://[::1]:8080",
        "http://tauri.localhost",
        "vscode-webview://0a1b2c3d4e",
        "vscode-file://vscode-app",
        "app://obsidian.md",
    ],
)
def test_origin_policy_allows_local_and_editors(origin: str) -> None:
    assert OriginPolicy(ServerSettings()).allows(origin, "localhost:8400")


@pytest.mark.parametrize(
    "origin", ["https://evil.example", "http://localhost.evil.example", "null", "chrome-extension://abc", "file://"]
)
def test_origin_policy_refuses_foreign(origin: str) -> None:
    assert not OriginPolicy(ServerSettings()).allows(origin, "localhost:8400")


def test_origin_policy_same_origin_andmake_settings() -> None:
    policy = OriginPolicy(ServerSettings(cors_origins=["https://app.example/"]))
    assert policy.allows("https://app.example", None)
    assert policy.allows("http://mybox:8400", "mybox:8400")  # a page this server served itself
    assert not policy.allows("http://mybox:8400", "localhost:8400")
    assert OriginPolicy(ServerSettings(cors_origins=["*"])).allows("https://any.example", None)


@pytest.mark.parametrize(
    ("prompt", "prompts"),
    [("a", ["a"]), (["a", "b"], ["a", "b"]), ([1, 2], [[1, 2]]), ([[1], [2, 3]], [[1], [2, 3]])],
)
def test_completion_prompt_shapes(prompt: object, prompts: list[object]) -> None:
    assert TextCompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompts == prompts


@pytest.mark.parametrize("prompt", [[], 5, [1, "a"], [-1], [True], [["a"]], {"a": 1}])
def test_completion_prompt_refused(prompt: object) -> None:
    with pytest.raises(ValidationError) as caught:
        TextCompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert from_validation_error(caught.value).param == "prompt"


def test_extra_fields_ignored_and_developer_role() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]}],
        "tools_choice": "none",
        "parallel_tool_calls": False,
    }
    request = ChatCompletionRequest.model_validate(body)
    assert request.messages[0].for_template() == {"role": "system", "content": "Be brief."}
