"""`POST /infill` (llama.cpp's dialect) and `/v1/completions` with `suffix`.

No FIM-capable model installs from PyPI (SmolLM2 declares no FIM tokens),
so these run on a tiny random-weight GGUF generated with Qwen2.5-Coder's FIM
tokens (`tests/fixtures/tiny_fim_gguf.py`): its text is gibberish, so the
tests check prompts, wire shapes and limits, not quality."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from localserve.engine.types import FinishReason, TokenEvent
from localserve.serving.fim import fim_prompt, fim_tokens
from localserve.serving.llamacpp.answer import InfillRun, LineLimits
from localserve.serving.llamacpp.request import NativeInfillRequest
from localserve.serving.types import ExtraChunk
from tests.api.harness import MODEL_ID, ServerThread, make_settings
from tests.fixtures.tiny_fim_gguf import FIM_SPECIALS, write_tiny_fim_llama

FIM_MODEL = "tiny-fim"

# What llama.vim sends (its `llama#fim` request, values as its defaults give them).
LLAMA_VIM_FIM = {
    "input_prefix": "def add(a, b):\n",
    "input_suffix": "\n\nprint(add(1, 2))\n",
    "input_extra": [{"text": "def sub(a, b):\n    return a - b\n", "time": 1730000000, "filename": "util.py"}],
    "prompt": "    return ",
    "n_predict": 128,
    "n_indent": 4,
    "top_k": 40,
    "top_p": 0.99,
    "stream": False,
    "samplers": ["top_k", "top_p", "infill"],
    "cache_prompt": True,
    "t_max_prompt_ms": 500,
    "t_max_predict_ms": 3000,
}
# llama.vim's warm-up request when it gathers extra context (`s:ring_update`).
LLAMA_VIM_WARMUP = {
    "input_prefix": "",
    "input_suffix": "",
    "input_extra": [{"text": "x = 1\n", "time": 1730000000, "filename": "a.py"}],
    "prompt": "",
    "n_predict": 1,
    "temperature": 0.0,
    "stream": False,
    "samplers": ["temperature"],
    "cache_prompt": True,
    "t_max_prompt_ms": 1,
    "t_max_predict_ms": 1,
}


@pytest.fixture(scope="module")
def fim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    path = write_tiny_fim_llama(tmp_path_factory.mktemp("fim") / "tiny-fim.gguf")
    settings = make_settings(models=[f"{FIM_MODEL}={path}"], parallel=4, ctx_size=1024, kv_size=4096, threads=1)
    srv = ServerThread(settings).start()
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def fim_http(fim_server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fim_server.base_url, timeout=60) as c:
        yield c


def ids_of(server: ServerThread) -> dict[str, int]:
    tokenizer = server.call(lambda: server.engine.tokenizer(FIM_MODEL))
    return {
        name: tokenizer.encode(text, add_special=False, parse_special=True)[0] for name, text in FIM_SPECIALS.items()
    }


# ---- the prompt -------------------------------------------------------------------------------


def test_fim_prompt_layout(fim_server: ServerThread) -> None:
    tokenizer = fim_server.call(lambda: fim_server.engine.tokenizer(FIM_MODEL))
    fim = fim_tokens(tokenizer)
    assert fim is not None
    special = ids_of(fim_server)
    assert (fim.pre, fim.suf, fim.mid, fim.rep, fim.sep) == tuple(
        special[k] for k in ("pre", "suf", "mid", "rep", "sep")
    )

    def text(s: str) -> list[int]:
        return tokenizer.encode(s, add_special=False, parse_special=False)

    built = fim_prompt(
        tokenizer,
        fim,
        prefix="def f(",
        suffix=")\n",
        prompt="x",
        extra=[ExtraChunk("a.py", "y = 2")],
        n_ctx=1024,
        max_tokens=16,
    )
    expected = [
        fim.rep, *text("myproject\n"),
        fim.sep, *text("a.py\n"), *text("y = 2"),
        fim.sep, *text("filename\n"),
        fim.pre, *text("def f("), *text("x"), fim.suf, *text(")\n"), fim.mid,
    ]  # fmt: skip
    assert built.token_ids == expected and not built.truncated
    # Code that spells a FIM token stays text: no special token sneaks in.
    sneaky = fim_prompt(tokenizer, fim, prefix="<|fim_middle|>", suffix="", n_ctx=1024, max_tokens=16)
    assert sneaky.token_ids.count(fim.mid) == 1


def test_fim_prompt_truncates_to_fit(fim_server: ServerThread) -> None:
    tokenizer = fim_server.call(lambda: fim_server.engine.tokenizer(FIM_MODEL))
    fim = fim_tokens(tokenizer)
    assert fim is not None
    built = fim_prompt(
        tokenizer,
        fim,
        prefix="a = 1\n" * 400,
        suffix="b = 2\n" * 400,
        extra=[ExtraChunk("x", "c\n" * 300)],
        n_ctx=512,
        max_tokens=64,
    )
    assert built.truncated
    assert len(built.token_ids) <= 512 - 64
    mid_pos, suf_pos = built.token_ids.index(fim.mid), built.token_ids.index(fim.suf)
    num_suffix, num_prefix = mid_pos - suf_pos - 1, suf_pos - built.token_ids.index(fim.pre) - 1
    assert num_prefix > num_suffix > 0  # the prefix keeps the larger share


# ---- limits, without a model ----------------------------------------------------------------------


def test_line_limits_cut_a_shallow_line() -> None:
    lines = LineLimits(n_indent=4)
    out = "".join(lines.push(piece) for piece in ["x + 1", "\n    y", " = 2\n  ", " ", "z"])
    assert lines.cut
    assert out == "x + 1\n    y = 2\n   "  # cut before the first character of the shallow line
    free = LineLimits(n_indent=0)
    assert "".join(free.push(p) for p in ["a\n", "b\n", "c"]) == "a\nb\nc" and not free.cut


def _event(text: str, token_id: int = 1, finish: FinishReason | None = None) -> TokenEvent:
    return TokenEvent("r", (token_id,) if token_id >= 0 else (), text, finish_reason=finish, num_prompt_tokens=9)


def test_time_limit_needs_a_new_line_first() -> None:
    body = NativeInfillRequest.model_validate({"input_prefix": "", "input_suffix": "", "t_max_predict_ms": 1})
    run = InfillRun(body, "m", False, 1024, "")
    run.add(_event("a"))
    run.first_token_at -= 1.0  # a second ago
    run.add(_event("b"))
    assert not run.stopped  # no newline yet: no time limit
    run.add(_event("\n"))
    run.add(_event("c"))
    assert run.stop_type == "limit"
    result = run.result()
    assert result["content"] == "ab\nc" and result["stop_type"] == "limit" and result["tokens_predicted"] == 4


def test_stop_types_and_response_fields() -> None:
    body = NativeInfillRequest.model_validate(
        {"input_prefix": "", "input_suffix": "", "response_fields": ["content", "timings/predicted_n"]}
    )
    eos = InfillRun(body, "m", False, 1024, "")
    eos.add(_event("x"))
    eos.add(_event("", token_id=-1, finish=FinishReason.STOP))
    assert eos.stop_type == "eos"
    assert eos.result() == {"content": "x", "timings/predicted_n": 1}


# ---- over HTTP ----------------------------------------------------------------------------------


def test_llama_vim_request(fim_http: httpx.Client) -> None:
    # llama.vim sends no seed; one here keeps the sample repeatable (unseeded,
    # the model's first pick is now and then end-of-text: 0 tokens predicted).
    response = fim_http.post("/infill", json={**LLAMA_VIM_FIM, "seed": 7})
    assert response.status_code == 200, response.text
    result = response.json()
    for key in (
        "content",
        "tokens_predicted",
        "tokens_evaluated",
        "stop",
        "stop_type",
        "truncated",
        "timings",
        "tokens_cached",
    ):
        assert key in result, key
    assert result["stop"] is True and isinstance(result["content"], str)
    assert 1 <= result["tokens_predicted"] <= 128
    assert result["stop_type"] in ("eos", "limit", "word")
    assert result["generation_settings"]["n_ctx"] == 1024
    timings = result["timings"]
    assert timings["predicted_n"] == result["tokens_predicted"] and timings["prompt_n"] > 0
    warm = fim_http.post("/infill", json=LLAMA_VIM_WARMUP)
    assert warm.status_code == 200 and warm.json()["tokens_predicted"] <= 1


def test_stream_matches_whole(fim_http: httpx.Client) -> None:
    body = {"input_prefix": "def f(x):\n", "input_suffix": "\n", "prompt": "    ", "n_predict": 12, "temperature": 0}
    # The prompt into the prefix cache first, so that both answers compared below read it alike
    # (a whole prompt and its last token alone round differently: README, Sampling defaults).
    fim_http.post("/infill", json={**body, "n_predict": 1})
    whole = fim_http.post("/infill", json=body).json()
    with fim_http.stream("POST", "/infill", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and "[DONE]" not in raw
    chunks = [json.loads(e[len("data: ") :]) for e in events]
    assert all(c["stop"] is False for c in chunks[:-1]) and chunks[-1]["stop"] is True
    assert chunks[-1]["content"] == "" and chunks[-1]["tokens_predicted"] == whole["tokens_predicted"]
    assert "".join(c["content"] for c in chunks) == whole["content"]


def test_return_tokens_and_seed(fim_http: httpx.Client) -> None:
    body = {
        "input_prefix": "x = ",
        "input_suffix": "",
        "n_predict": 6,
        "seed": 5,
        "return_tokens": True,
        "ignore_eos": True,
    }
    first, second = (fim_http.post("/infill", json=body).json() for _ in range(2))
    assert first["tokens"] == second["tokens"] and len(first["tokens"]) == 6
    assert first["stop_type"] == "limit"


def test_long_input_is_truncated_not_refused(fim_http: httpx.Client) -> None:
    body = {"input_prefix": "a = 1\n" * 2000, "input_suffix": "b = 2\n" * 2000, "n_predict": 4}
    result = fim_http.post("/infill", json=body).json()
    assert result["truncated"] is True and result["tokens_evaluated"] < 1024


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input_suffix": ""}, "input_prefix"),
        ({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]}, "input_extra[0].text"),
        ({"input_prefix": "", "input_suffix": "", "input_extra": {"text": "a"}}, "input_extra"),
    ],
)
def test_invalid_infill(fim_http: httpx.Client, body: dict, param: str) -> None:  # type: ignore[type-arg]
    response = fim_http.post("/infill", json=body)
    assert response.status_code in (400, 404)
    assert response.json()["error"]["param"] == param


def test_completions_with_suffix(fim_http: httpx.Client) -> None:
    body = {
        "model": FIM_MODEL,
        "prompt": "def add(a, b):\n    return ",
        "suffix": "\n",
        "max_tokens": 5,
        "temperature": 0,
    }
    reply = fim_http.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    prefix_only = fim_http.post("/v1/completions", json={**body, "suffix": None}).json()
    # The FIM prompt is longer than the plain prompt: the suffix and FIM tokens went in.
    assert reply.json()["usage"]["prompt_tokens"] > prefix_only["usage"]["prompt_tokens"]


# ---- a model without FIM tokens -----------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_has_no_fim_tokens(server: ServerThread, http: httpx.Client) -> None:
    assert fim_tokens(server.call(lambda: server.engine.tokenizer(MODEL_ID))) is None
    response = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
    assert response.status_code == 400
    assert "fill in the middle" in response.json()["error"]["message"]
    completion = http.post("/v1/completions", json={"model": MODEL_ID, "prompt": "def f(", "suffix": ")"})
    assert completion.status_code == 400 and completion.json()["error"]["param"] == "suffix"
