"""Batch input validation: each kind of problem is reported with its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localserve.jobs.validate import MAX_REPORTED_ERRORS, Limits, read_bodies, validate_file

URL = "/v1/chat/completions"


def line(custom_id: object = "a", *, method: object = "POST", url: object = URL, model: object = "m") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": {"model": model, "messages": []}})


def check(tmp_path: Path, lines: list[str], endpoint: str | None = URL, limits: Limits | None = None):  # type: ignore[no-untyped-def]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return validate_file(path, endpoint, limits or Limits())


def test_valid_file_gives_lines_with_offsets_and_the_model(tmp_path: Path) -> None:
    result = check(tmp_path, [line("a"), "", line("b")])  # a blank line is skipped
    assert result.ok and result.model == "m"
    assert [(r.line_no, r.custom_id) for r in result.lines] == [(1, "a"), (3, "b")]
    bodies = read_bodies(tmp_path / "in.jsonl", result.lines)
    assert bodies == [{"model": "m", "messages": []}] * 2


@pytest.mark.parametrize(
    ("bad", "code", "param"),
    [
        ("{not json", "invalid_json_line", None),
        ("[1, 2]", "invalid_json_line", None),
        (json.dumps({"method": "POST", "url": URL, "body": {"model": "m"}}), "missing_required_parameter", "custom_id"),
        (json.dumps({"custom_id": "x", "url": URL, "body": {"model": "m"}}), "missing_required_parameter", "method"),
        (json.dumps({"custom_id": "x", "method": "POST", "body": {}}), "missing_required_parameter", "url"),
        (json.dumps({"custom_id": "x", "method": "POST", "url": URL}), "missing_required_parameter", "body"),
        (line(""), "invalid_value", "custom_id"),
        (line(7), "invalid_value", "custom_id"),
        (line("x", method="GET"), "invalid_method", "method"),
        (line("x", url="/v1/embeddings"), "invalid_url", "url"),
        (line("x", model=None), "missing_required_parameter", "body.model"),
        (json.dumps({"custom_id": "x", "method": "POST", "url": URL, "body": "hi"}), "invalid_value", "body"),
        (line("a"), "duplicate_custom_id", "custom_id"),
        (line("x", model="other"), "mismatched_model", "body.model"),
    ],
)
def test_each_problem_names_its_line(tmp_path: Path, bad: str, code: str, param: str | None) -> None:
    result = check(tmp_path, [line("a"), bad, line("c")])
    assert not result.ok
    (error,) = result.errors
    assert (error.code, error.line, error.param) == (code, 2, param)
    assert error.message


def test_url_decides_the_endpoint_when_none_is_given(tmp_path: Path) -> None:
    result = check(tmp_path, [line("a", url="/v1/completions")], endpoint=None)
    assert result.ok and result.endpoint == "/v1/completions"


def test_limits(tmp_path: Path) -> None:
    too_many = check(tmp_path, [line(str(i)) for i in range(5)], limits=Limits(max_lines=4))
    assert [e.code for e in too_many.errors] == ["too_many_requests"]
    too_big = check(tmp_path, [line("a")], limits=Limits(max_bytes=10))
    assert [e.code for e in too_big.errors] == ["file_too_large"]
    embed = (
        '{"custom_id": "%s", "method": "POST", "url": "/v1/embeddings", "body": {"model": "e", "input": ["a", "b"]}}'
    )
    inputs = check(tmp_path, [embed % i for i in range(3)], "/v1/embeddings", Limits(max_embedding_inputs=5))
    assert [(e.code, e.line) for e in inputs.errors] == [("too_many_inputs", 3)]


def test_empty_file_fails(tmp_path: Path) -> None:
    assert [e.code for e in check(tmp_path, ["", "  "]).errors] == ["empty_file"]


def test_errors_are_capped_but_counted(tmp_path: Path) -> None:
    result = check(tmp_path, ["{"] * (MAX_REPORTED_ERRORS + 20))
    assert len(result.errors) == MAX_REPORTED_ERRORS
    assert result.num_errors == MAX_REPORTED_ERRORS + 20
