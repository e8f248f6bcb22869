"""Fuzzing the parsers that see untrusted bytes: chat templates (a GGUF's
template is whatever its author wrote), model ids, JSONL batch files and
multipart audio uploads. Hypothesis runs a bounded, derandomized number of
examples, so CI is repeatable."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localserve.backends import template_sandbox
from localserve.backends.chat_template import ChatTemplate, _raise_exception, _tojson
from localserve.errors import InvalidRequestError
from localserve.jobs.validate import Limits, read_bodies, validate_file
from localserve.models.gguf_shape import read_gguf_shape
from localserve.models.names import MODEL_NAME_RE as MODEL_ID_RE
from localserve.models.names import validate_model_id
from localserve.models.oneshot import gguf_architecture
from tests.api.harness import API_KEY, MODEL_ID, ServerThread
from tests.reliability.conftest import SPEECH_MODEL

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "What is 2+2?"},
]
HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(autouse=True)
def quick_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A one-second render budget: the hostile templates end sooner."""
    monkeypatch.setattr(template_sandbox, "MAX_SECONDS", 1.0)


def render(source: str) -> str:
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(MESSAGES)


# ---- chat templates ------------------------------------------------------------------

HOSTILE = {
    "class_attribute": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals_via_cycler": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "globals_via_raise": "{{ raise_exception.__globals__ }}",
    "context_internals": "{{ self._TemplateReference__context }}",
    "format_escape": "{{ '{0.__class__}'.format('') }}",
    "nested_loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loop_over_big_string": "{% for c in 'x' * 100000 %}{% for d in 'y' * 100000 %}{% endfor %}{% endfor %}",
    "macro_recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "recursive_loop": "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
    "huge_repeat": "{{ 'a' * 1000000000 }}",
    "huge_power": "{{ 10 ** 10000000 }}",
    "doubling_plus": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
    "doubling_tilde": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "nested_lists": "{% set ns = namespace(a='x' * 100) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}",
    "nested_lists_tojson": "{% set ns = namespace(a='x') %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a|tojson }}",
    "center_filter": "{{ 'a'|center(1000000000) }}",
    "indent_filter": "{{ ('a\\n' * 10000)|indent(100000) }}",
    "ljust_method": "{{ 'a'.ljust(1000000000) }}",
    "format_width": "{{ '{:>999999999}'.format(1) }}",
    "percent_width": "{{ '%999999999d' % 1 }}",
    "replace_bomb": "{{ ('x' * 100000)|replace('', 'y' * 100000) }}",
    "captured_output": "{% set x %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endset %}{{ x|length }}",
    "huge_output": "{% for i in range(100000) %}{{ 'z' * 1000 }}{% endfor %}",
    "division_by_zero": "{{ 1 / 0 }}",
    "include": "{% include 'secrets.txt' %}",
    "raise_exception": "{{ raise_exception('roles must alternate') }}",
    "reserved_name": "{{ __localserve_step__ }}",
}
HARMLESS_IF_EMPTY = frozenset({"context_internals", "format_escape", "globals_via_raise"})
UNPARSABLE = {
    "syntax": "{% for %}",
    "deep_nesting": "{{ " + "(" * 20000 + "1" + ")" * 20000 + " }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_templates_fail_cleanly(name: str) -> None:
    started = time.monotonic()
    try:
        render(HOSTILE[name])
    except InvalidRequestError as exc:
        assert exc.status == 400 and exc.message.startswith("the model's chat template"), exc.message
    except ValueError as exc:  # refused while compiling (ChatTemplate's documented error)
        assert "chat template" in str(exc)
    else:
        # Lookups the sandbox blocks may render as undefined (empty): harmless,
        # as long as nothing of the server's internals shows.
        assert name in HARMLESS_IF_EMPTY, f"{name} rendered"
        assert not re.search(r"Context|module|function|class|globals|__", render(HOSTILE[name]))
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("name", sorted(UNPARSABLE))
def test_unparsable_templates_are_a_value_error(name: str) -> None:
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate(UNPARSABLE[name])


LEGIT = {
    "smollm2": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
        "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
        "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "llama3_like": (
        "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}{% if m.role == 'system' %}"
        "{% set ns.system = m.content | trim %}{% endif %}{% endfor %}"
        "{% if ns.system %}{{ '<|start_header_id|>system<|end_header_id|>\n\n' ~ ns.system ~ '<|eot_id|>' }}{% endif %}"
        "{% for m in messages if m.role != 'system' %}{{ '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\n\n' }}"
        "{{ m.content | trim }}{{ '<|eot_id|>' }}{% if loop.last and add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}{% endfor %}"
    ),
    "mistral_like": (
        "{{ bos_token }}{% set turns = messages | rejectattr('role', 'equalto', 'system') | list %}"
        "{% for m in turns %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
        "{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
        "{% else %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"
    ),
    "macros_and_filters": (
        "{% macro line(role, text) %}{{ role|upper }}: {{ text|replace('\n', ' ')|truncate(50) }}{% endmacro %}"
        "{% for m in messages %}{{ line(m.role, m.content) }}\n{% endfor %}"
        "{{ messages|map(attribute='role')|join(',') }}|{{ messages|length }}|{{ '%s-%d' % ('n', 4) }}"
        "|{{ '{}/{}'.format(1, 2) }}|{{ messages[0]|tojson }}|{{ (messages|selectattr('role', 'eq', 'user')|list)|length }}"
        "|{{ 'abc'.center(9) }}|{{ 2 ** 10 }}|{{ [1, 2] * 2 }}|{{ range(3)|list }}|{{ 300000 * 1.5 }}|{{ 2 ** 0.5 }}"
    ),
}


@pytest.mark.parametrize("name", sorted(LEGIT))
def test_real_templates_render_as_in_a_plain_sandbox(name: str) -> None:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    variables = {"messages": MESSAGES, "add_generation_prompt": True, "bos_token": "<s>", "eos_token": "</s>"}
    expected = env.from_string(LEGIT[name]).render(**variables)
    assert expected and render(LEGIT[name]) == expected


FRAGMENTS = [
    "{{ ", " }}", "{% ", " %}", "for x in ", "range(", "99999", ")", "endfor", "if ", "endif", "messages", "x",
    "'a'", " * ", " + ", " ~ ", " ** ", " % ", "|join", "|center(", "|replace(", "'', ", ".__class__", ".format(",
    "loop", "(", "[", "]", ",", "set ns = namespace(s=", "ns.s", "macro f()", "endmacro", "f()", "raise_exception(",
    "|tojson", "|list", "9", " recursive", "loop(messages)", "\n", "text",
]  # fmt: skip


@FUZZ
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=30).map("".join))
def test_random_templates_render_or_refuse_cleanly(source: str) -> None:
    started = time.monotonic()
    try:
        template = ChatTemplate(source)
    except ValueError:
        return
    try:
        text = template.render(MESSAGES)
    except InvalidRequestError:
        pass
    else:
        assert len(text) <= 4_000_000
    assert time.monotonic() - started < 15


# ---- model ids ------------------------------------------------------------------------

TRAVERSAL_IDS = [
    "../../etc/passwd", "..", "a/../b", "/etc/passwd", "..\\..\\windows", "%2e%2e%2f", "a\x00b",
    "mödel", "模型", "a" * 201, "a" * 10_000, "", " ", "-leading-dash", "a..b",
]  # fmt: skip
TRAILING_NEWLINE = pytest.param("model\n")  # was accepted by re.match + '$'; fixed with fullmatch


@FUZZ
@given(st.text(min_size=0, max_size=300))
def test_validate_model_id_accepts_only_safe_names(text: str) -> None:
    try:
        assert validate_model_id(text) == text
    except InvalidRequestError as exc:
        assert exc.status == 400 and exc.param == "model"
        return
    assert MODEL_ID_RE.fullmatch(text) and not text.startswith("/") and "\\" not in text and ".." not in text


@pytest.mark.parametrize("model_id", [*TRAVERSAL_IDS, TRAILING_NEWLINE])
def test_traversal_ids_are_refused(model_id: str) -> None:
    with pytest.raises(InvalidRequestError):
        validate_model_id(model_id)


@pytest.mark.slow
@FUZZ
@given(st.one_of(st.sampled_from(TRAVERSAL_IDS), st.text(min_size=1, max_size=200)))
def test_model_ids_over_http_never_500(fuzz_server: ServerThread, model_id: str) -> None:
    base = fuzz_server.base_url
    with httpx.Client(base_url=base, headers=HEADERS, timeout=60) as http:
        body = {"model": model_id, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        chat = http.post("/v1/chat/completions", json=body)
        assert chat.status_code in (200, 400, 404), chat.text
        if chat.status_code == 200:
            # MODEL_ID, or any other name: the only chat model answers, as llama-server (issue 44)
            assert chat.json()["model"] == MODEL_ID
        else:
            assert chat.json()["error"]["param"] in ("model", None)
        path = "/v1/models/" + quote(model_id, safe="")
        got = http.get(path)
        # 405: an id with '{', '}' or an encoded '/' matches only `DELETE /v1/models/{model_id:.+}`.
        assert got.status_code in (200, 400, 404, 405), got.text
        assert http.post("/api/v1/requests/" + quote(model_id, safe="") + "/cancel").status_code in (400, 404)


# ---- JSONL batch files ------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
LINE_DICTS = st.fixed_dictionaries(
    {},
    optional={
        "custom_id": st.one_of(st.text(max_size=8), JSON_VALUES),
        "method": st.sampled_from(["POST", "GET", "post", 1]),
        "url": st.sampled_from(["/v1/chat/completions", "/v1/embeddings", "/v1/x", "", None]),
        "body": st.one_of(st.fixed_dictionaries({"model": st.sampled_from(["m", "n", "", 3])}), JSON_VALUES),
    },
)
LINES = st.one_of(
    LINE_DICTS.map(lambda d: json.dumps(d).encode()),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=60),
)


@FUZZ
@given(st.lists(LINES, max_size=25))
def test_jsonl_validation_accounts_for_every_line(tmp_path_factory: pytest.TempPathFactory, lines: list[bytes]) -> None:
    path = tmp_path_factory.mktemp("jsonl") / "input.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + b"\n")
    result = validate_file(path, None, Limits())
    num_nonblank = sum(1 for raw in path.read_bytes().split(b"\n") if raw.strip())
    # Each line is a request or an error naming it; a file without requests is an error.
    if num_nonblank:
        assert len(result.lines) + result.num_errors == num_nonblank
    else:
        assert not result.ok and result.errors[0].code == "empty_file"
    assert all(error.line is None or 1 <= error.line <= max(1, len(lines)) for error in result.errors)
    if result.ok:
        assert result.lines and result.endpoint and result.model
        bodies = read_bodies(path, result.lines)
        assert all(isinstance(body, dict) and body["model"] == result.model for body in bodies)
        assert len({ref.custom_id for ref in result.lines}) == len(result.lines)


def test_jsonl_deeply_nested_line_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b"[" * 100_000 + b"\n")
    try:
        result = validate_file(path, None, Limits())
    except RecursionError:
        result = None  # failed below, outside the handler: a RecursionError's traceback is too deep to show
    assert result is not None, "validate_file raised RecursionError"
    assert not result.ok and result.errors[0].line == 1
    assert result.errors[0].code == "invalid_json_line" and "nested too deeply" in result.errors[0].message


@pytest.mark.slow
def test_deeply_nested_json_body_is_a_400(fuzz_server: ServerThread) -> None:
    response = httpx.post(
        f"{fuzz_server.base_url}/v1/chat/completions", headers=HEADERS, content=b"[" * 100_000, timeout=60
    )
    assert response.status_code == 400, response.text


# ---- multipart audio ------------------------------------------------------------------

AUDIO_HEADS = [b"", b"RIFF", b"RIFF\x24\x00\x00\x00WAVEfmt ", b"ID3\x03\x00", b"OggS\x00\x02", b"fLaC", b"\xff\xfb\x90"]


@pytest.mark.slow
@FUZZ
@given(head=st.sampled_from(AUDIO_HEADS), tail=st.binary(max_size=4096))
def test_random_audio_bytes_are_a_400_not_a_500(fuzz_server: ServerThread, head: bytes, tail: bytes) -> None:
    if SPEECH_MODEL not in fuzz_server.registry.oneshot:
        pytest.skip("whisper-tiny.en is not installed")
    response = httpx.post(
        f"{fuzz_server.base_url}/v1/audio/transcriptions",
        headers=HEADERS,
        files={"file": ("audio.wav", head + tail)},
        data={"model": SPEECH_MODEL},
        timeout=60,
    )
    # Random bytes may by chance decode to (silent) audio: then a transcript.
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.slow
@FUZZ
@given(st.binary(max_size=2048), st.sampled_from(["xyz", "----b", ""]))
def test_malformed_multipart_is_a_400_not_a_500(fuzz_server: ServerThread, body: bytes, boundary: str) -> None:
    for route in ("/v1/audio/transcriptions", "/v1/files"):
        response = httpx.post(
            f"{fuzz_server.base_url}{route}",
            headers={**HEADERS, "Content-Type": f"multipart/form-data; boundary={boundary}"},
            content=f"--{boundary}\r\n".encode() + body,
            timeout=60,
        )
        assert 400 <= response.status_code < 500, (route, response.status_code, response.text)
        if response.status_code == 400:
            error = response.json()["error"]
            assert error["type"] == "invalid_request_error" and error["message"], error


def _multipart(fields: dict[str, str], filename: str, content: bytes) -> tuple[bytes, str]:
    """A well-formed multipart body and its Content-Type, as httpx sends it."""
    request = httpx.Request("POST", "http://x/", data=fields, files={"file": (filename, content)})
    return request.read(), request.headers["Content-Type"]


@pytest.mark.slow
@pytest.mark.parametrize("route", ["/v1/audio/transcriptions", "/v1/files"])
def test_truncated_multipart_is_a_400_that_says_so(fuzz_server: ServerThread, route: str) -> None:
    """An upload cut short (a client that died, a proxy's limit) is the
    client's fault: a 400 that says the body is malformed or truncated."""
    fields = {"model": SPEECH_MODEL} if "audio" in route else {"purpose": "batch"}
    body, content_type = _multipart(fields, "input.bin", b"RIFF" + bytes(range(256)) * 40)
    for cut in (len(body) // 3, len(body) // 2, len(body) - 40, len(body) - 3):
        response = httpx.post(
            f"{fuzz_server.base_url}{route}",
            headers={**HEADERS, "Content-Type": content_type},
            content=body[:cut],
            timeout=60,
        )
        assert response.status_code == 400, (cut, response.status_code, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert "malformed or truncated" in error["message"], error["message"]


# ---- GGUF headers ----------------------------------------------------------------------

GGUF_V3 = b"GGUF" + (3).to_bytes(4, "little")
#: Counts and lengths at their edges (past the file, past any index), or any.
U64 = st.one_of(st.sampled_from([0, 1, 2, 20, 2**31, 2**40, 2**63 + 5, 2**64 - 1]), st.integers(0, 2**64 - 1)).map(
    lambda n: n.to_bytes(8, "little")
)
VALUE_TYPE = st.integers(0, 14).map(lambda n: n.to_bytes(4, "little"))  # 0-12 are GGUF's, 13-14 are not
FIELD = st.tuples(U64, st.sampled_from([b"general.architecture", b"llama.block_count", b"x"]), VALUE_TYPE, U64)
GGUF_HEADERS = st.tuples(U64, U64, st.lists(FIELD.map(b"".join), max_size=4), st.binary(max_size=32)).map(
    lambda parts: GGUF_V3 + parts[0] + parts[1] + b"".join(parts[2]) + parts[3]
)


@FUZZ
@given(GGUF_HEADERS)
def test_damaged_gguf_headers_are_a_400_never_a_crash(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    """A file with GGUF's magic and garbage after it: `localserve run` and
    `serve` once ended in OverflowError ("cannot fit 'int' into an
    index-sized integer") for a key length past any index."""
    path = tmp_path_factory.mktemp("gguf") / "damaged.gguf"
    path.write_bytes(data)
    try:
        read_gguf_shape(path)
    except InvalidRequestError as exc:
        assert exc.status == 400 and str(path) in exc.message
    architecture = gguf_architecture(path)  # what model detection reads first: None or a name, never a crash
    assert architecture is None or isinstance(architecture, str)


def test_an_empty_gguf_file_is_a_400(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    with pytest.raises(InvalidRequestError, match="not a readable GGUF file"):
        read_gguf_shape(path)
