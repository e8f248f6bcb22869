"""`localserve batch run`'s engine room with a scripted executor: output and
errors files, resuming after an interruption, a malformed input."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from localserve.jobs.offline import BatchFileError, errors_url_for, run_file
from localserve.jobs.progress import Progress
from localserve.jobs.types import LineResult
from tests.jobs.fakes import FakeExecutor, read_jsonl, request_line


class Crashing(FakeExecutor):
    """Fails hard on line `n == crash_at`, as a killed process would stop."""

    def __init__(self, crash_at: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.crash_at = crash_at

    async def execute(self, endpoint: str, body: dict[str, Any]) -> LineResult:
        if body.get("n") == self.crash_at:
            raise RuntimeError("killed")
        return await super().execute(endpoint, body)


def opener(executor: FakeExecutor, models: list[str]) -> Any:
    @contextlib.asynccontextmanager
    async def open_model(name: str) -> AsyncIterator[tuple[FakeExecutor, str]]:
        models.append(name)
        yield executor, "loaded-id"

    return open_model


def write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


async def test_writes_output_in_order_and_errors_beside_it(tmp_path: Path) -> None:
    source = write(
        tmp_path / "in.jsonl", [request_line(f"c{i}", n=i) for i in range(12)] + [request_line("bad", fail=True)]
    )
    output = str(tmp_path / "out.jsonl")
    executor, models, stream = FakeExecutor(concurrency=3), [], io.StringIO()
    summary = await run_file(
        source, output, opener(executor, models), work_dir=tmp_path / "work", progress=Progress(stream)
    )
    assert models == ["m"], "the model named in the file"
    assert (summary.num_total, summary.num_completed, summary.num_failed) == (13, 12, 1)
    assert executor.max_in_flight_seen <= 3
    lines = read_jsonl(Path(output))
    assert [line["custom_id"] for line in lines] == [f"c{i}" for i in range(12)]
    assert lines[0]["response"]["status_code"] == 200 and lines[0]["error"] is None
    assert errors_url_for(output) == str(tmp_path / "out.errors.jsonl")
    (error,) = read_jsonl(tmp_path / "out.errors.jsonl")
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    assert list((tmp_path / "work").iterdir()) == [], "the journal is gone once OUTPUT is written"
    assert "13/13 requests, 1 failed" in stream.getvalue() and "tok/s" in stream.getvalue()


async def test_an_interrupted_run_resumes_without_redoing_lines(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", [request_line(f"c{i}", n=i) for i in range(20)])
    output = tmp_path / "out.jsonl"
    first = Crashing(crash_at=10, concurrency=1)
    with pytest.raises(RuntimeError, match="killed"):
        await run_file(source, str(output), opener(first, []), work_dir=tmp_path / "work")
    assert not output.exists(), "OUTPUT appears whole or not at all"
    second = FakeExecutor(concurrency=4)
    summary = await run_file(source, str(output), opener(second, []), work_dir=tmp_path / "work", model="other")
    assert sorted(first.calls) == list(range(10))
    assert sorted(second.calls) == list(range(10, 20)), "lines answered before the interruption are not redone"
    assert [line["custom_id"] for line in read_jsonl(output)] == [f"c{i}" for i in range(20)]
    assert summary.num_skipped == 10


async def test_lines_already_in_output_are_skipped(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", [request_line(f"c{i}", n=i) for i in range(5)])
    output = tmp_path / "out.jsonl"
    done = {"id": "batch_req_1", "custom_id": "c1", "response": {"status_code": 200, "request_id": "r", "body": {}}}
    output.write_text(json.dumps(done) + "\n")
    executor = FakeExecutor()
    await run_file(source, str(output), opener(executor, []), work_dir=tmp_path / "work")
    assert sorted(executor.calls) == [0, 2, 3, 4]
    assert sorted(line["custom_id"] for line in read_jsonl(output)) == [f"c{i}" for i in range(5)]


async def test_every_body_names_the_loaded_model(tmp_path: Path) -> None:
    seen: list[str] = []

    class Recording(FakeExecutor):
        async def execute(self, endpoint: str, body: dict[str, Any]) -> LineResult:
            seen.append(body["model"])
            return await super().execute(endpoint, body)

    source = write(tmp_path / "in.jsonl", [request_line("a", n=1)])
    await run_file(source, str(tmp_path / "o.jsonl"), opener(Recording(), []), work_dir=tmp_path / "w")
    assert seen == ["loaded-id"]


async def test_malformed_input_runs_nothing(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", [request_line("a"), "{nope"])
    models: list[str] = []
    with pytest.raises(BatchFileError) as exc:
        await run_file(source, str(tmp_path / "o.jsonl"), opener(FakeExecutor(), models), work_dir=tmp_path / "w")
    assert exc.value.validation.errors[0].line == 2
    assert models == [] and not (tmp_path / "o.jsonl").exists()


async def test_a_rerun_answers_earlier_failures_and_drops_their_errors(tmp_path: Path) -> None:
    source = write(tmp_path / "in.jsonl", [request_line("a", n=1), request_line("b", n=2, fail=True)])
    output = tmp_path / "out.jsonl"
    await run_file(source, str(output), opener(FakeExecutor(), []), work_dir=tmp_path / "w")
    assert [e["custom_id"] for e in read_jsonl(tmp_path / "out.errors.jsonl")] == ["b"]
    fixed = write(tmp_path / "in.jsonl", [request_line("a", n=1), request_line("b", n=2)])
    again = FakeExecutor()
    await run_file(fixed, str(output), opener(again, []), work_dir=tmp_path / "w")
    assert again.calls == [2], "only the failed line runs again"
    assert [line["custom_id"] for line in read_jsonl(output)] == ["a", "b"]
    assert not (tmp_path / "out.errors.jsonl").exists()
