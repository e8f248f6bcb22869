"""Check a batch input file before anything runs, as OpenAI does: every line
a JSON object `{"custom_id", "method": "POST", "url", "body"}`, custom ids
unique, one endpoint and one model, within the limits.

The result is either the lines (with their byte offsets, so the runner can
read one body at a time) or the errors, each naming its line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from localserve.jobs.types import BATCH_ENDPOINTS, BatchError, LineRef

MAX_REPORTED_ERRORS = 100  # a broken 50k-line file gets the first 100, not 50k


@dataclass(frozen=True, slots=True)
class Limits:
    max_lines: int = 50_000
    max_bytes: int = 200 * 1024 * 1024
    max_embedding_inputs: int = 50_000  # across the whole batch (OpenAI's limit)


@dataclass(slots=True)
class Validation:
    """Lines of a valid file, or what is wrong with it."""

    endpoint: str | None = None
    model: str | None = None
    lines: list[LineRef] = field(default_factory=list)
    errors: list[BatchError] = field(default_factory=list)
    num_errors: int = 0  # errors found, reported or not

    @property
    def ok(self) -> bool:
        return not self.num_errors

    def add(self, error: BatchError) -> None:
        self.num_errors += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(error)


def validate_file(path: Path, endpoint: str | None, limits: Limits) -> Validation:
    """Validate the file at `path` for a batch on `endpoint` (None: take the
    first line's url)."""
    result = Validation(endpoint=endpoint)
    size = path.stat().st_size
    if size > limits.max_bytes:
        result.add(BatchError("file_too_large", f"The input file has {size} bytes; the limit is {limits.max_bytes}."))
        return result
    with path.open("rb") as f:
        _check_lines(_numbered_lines(f), result, limits)
    if result.ok and not result.lines:
        result.add(BatchError("empty_file", "The input file has no requests: write one JSON object per line."))
    return result


def _numbered_lines(f: BinaryIO) -> Iterator[tuple[int, int, bytes]]:
    """(1-based line number, byte offset, raw line) of each non-blank line."""
    offset = 0
    for line_no, raw in enumerate(f, start=1):
        if raw.strip():
            yield line_no, offset, raw
        offset += len(raw)


def _check_lines(lines: Iterable[tuple[int, int, bytes]], result: Validation, limits: Limits) -> None:
    batch = _BatchCheck(result, limits)
    for num_seen, (line_no, offset, raw) in enumerate(lines):
        if num_seen >= limits.max_lines:
            message = f"The input file has more than {limits.max_lines} requests; split it into several batches."
            result.add(BatchError("too_many_requests", message))
            return
        request = _check_line(raw, line_no, result)
        if request is None:
            continue
        custom_id, body = request
        if batch.fits(line_no, custom_id, body):
            result.lines.append(LineRef(line_no, custom_id, offset, len(raw)))
        elif batch.over_limit:
            return


class _BatchCheck:
    """What each line is checked against: the lines before it."""

    def __init__(self, result: Validation, limits: Limits) -> None:
        self.result = result
        self.limits = limits
        self.first_line_of: dict[str, int] = {}  # custom_id -> line
        self.model_line = 0
        self.num_inputs = 0
        self.over_limit = False

    def fits(self, line_no: int, custom_id: str, body: dict[str, Any]) -> bool:
        """Unique custom_id, the batch's one model, within the input limit."""
        result = self.result
        if custom_id in self.first_line_of:
            message = (
                f"The custom_id {custom_id!r} is a duplicate of the one on line {self.first_line_of[custom_id]}; "
                "each request of a batch needs its own custom_id."
            )
            result.add(BatchError("duplicate_custom_id", message, line_no, "custom_id"))
            return False
        self.first_line_of[custom_id] = line_no
        if result.model is None:
            result.model, self.model_line = body["model"], line_no
        elif body["model"] != result.model:
            message = (
                f"The model {body['model']!r} differs from {result.model!r} on line {self.model_line}; "
                "all requests of a batch use one model."
            )
            result.add(BatchError("mismatched_model", message, line_no, "body.model"))
            return False
        if result.endpoint == "/v1/embeddings":
            self.num_inputs += _num_embedding_inputs(body)
            if self.num_inputs > self.limits.max_embedding_inputs:
                message = f"The batch has more than {self.limits.max_embedding_inputs} embedding inputs in all."
                result.add(BatchError("too_many_inputs", message, line_no, "body.input"))
                self.over_limit = True
                return False
        return True


def _check_line(raw: bytes, line_no: int, result: Validation) -> tuple[str, dict[str, Any]] | None:
    """The line's custom_id and body, or None after reporting what is wrong."""
    try:
        data = json.loads(raw)
    except ValueError:
        result.add(BatchError("invalid_json_line", "This line is not parseable as valid JSON.", line_no))
        return None
    except RecursionError:  # not a ValueError: left alone it failed the whole validation, retried forever
        message = "This line is JSON nested too deeply to parse; a request nests a few levels, not thousands."
        result.add(BatchError("invalid_json_line", message, line_no))
        return None
    if not isinstance(data, dict):
        result.add(BatchError("invalid_json_line", "This line is not a JSON object.", line_no))
        return None
    for name in ("custom_id", "method", "url", "body"):
        if name not in data:
            result.add(
                BatchError("missing_required_parameter", f"Missing required parameter: '{name}'.", line_no, name)
            )
            return None
    custom_id, method, url, body = data["custom_id"], data["method"], data["url"], data["body"]
    if not isinstance(custom_id, str) or not custom_id:
        result.add(BatchError("invalid_value", "custom_id must be a non-empty string.", line_no, "custom_id"))
        return None
    if method != "POST":
        result.add(
            BatchError("invalid_method", f"Only the POST method is supported; got {method!r}.", line_no, "method")
        )
        return None
    if result.endpoint is None and url in BATCH_ENDPOINTS:
        result.endpoint = url
    if url != result.endpoint:
        expected = result.endpoint or " or ".join(BATCH_ENDPOINTS)
        result.add(
            BatchError(
                "invalid_url", f"The url {url!r} does not match the batch's endpoint {expected}.", line_no, "url"
            )
        )
        return None
    if not isinstance(body, dict):
        result.add(BatchError("invalid_value", "body must be a JSON object (the request's body).", line_no, "body"))
        return None
    if not isinstance(body.get("model"), str) or not body["model"]:
        result.add(
            BatchError("missing_required_parameter", "Missing required parameter: 'body.model'.", line_no, "body.model")
        )
        return None
    return custom_id, body


def _num_embedding_inputs(body: dict[str, Any]) -> int:
    value = body.get("input")
    if isinstance(value, list) and value and not isinstance(value[0], int):
        return len(value)
    return 1


def read_bodies(path: Path, refs: Iterable[LineRef]) -> list[dict[str, Any]]:
    """The `body` of each line (validated before, so well-formed)."""
    bodies = []
    with path.open("rb") as f:
        for ref in refs:
            f.seek(ref.offset)
            bodies.append(json.loads(f.read(ref.length))["body"])
    return bodies
