"""`localserve batch run --ray` on a local Ray instance (2 CPUs, 2 replicas)
with the real SmolLM2: the same answers as the single-machine run, input and
output on an S3 API served on loopback by moto, and a resumed run that
computes only the lines missing from OUTPUT."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localserve.cli import main as cli
from localserve.jobs import progress as progress_module
from localserve.jobs import ray_progress
from tests.jobs.fakes import request_line
from tests.jobs.test_batch_run_real import BUCKET, MODEL_ID, s3  # noqa: F401 - the S3 fixture

NUM_LINES = 40
# One thread and 8 slots per engine: 2 replicas fit the 2 cores, and both runs decode alike.
# Flash attention on: the answers of two replicas equal the single machine's
# only where a sequence's logits do not depend on which others share its
# steps; without it (the CPU's `auto`), llama.cpp's matrix products round a
# prompt chunk by its neighbours and a near-tie may flip (kv_types.resolve_flash_attn).
ENGINE_ARGS = ["--threads", "1", "--concurrency", "8", "--ctx-size", "256", "--device", "cpu", "--flash-attn", "on"]
REPLICA_ROW = re.compile(r"^\s+r\d+ (\S+): (\d+) requests, (\d+) tokens", re.MULTILINE)


def batch_lines() -> str:
    return "".join(
        request_line(
            f"q{i:03d}",
            model=MODEL_ID,
            messages=[{"role": "user", "content": f"Name a fruit and the number {i}."}],
            max_tokens=16,
            temperature=0,
        )
        + "\n"
        for i in range(NUM_LINES)
    )


def answers(text: str) -> dict[str, dict[str, Any]]:
    """custom_id -> what must not depend on where the line ran (not the ids,
    times, nor the prefix-cache hits, which follow the lines run before)."""
    result = {}
    for line in text.splitlines():
        data = json.loads(line)
        body = data["response"]["body"]
        assert data["response"]["status_code"] == 200 and data["error"] is None
        assert data["custom_id"] not in result, "one answer per custom_id"
        usage = {key: body["usage"][key] for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
        result[data["custom_id"]] = {"choices": body["choices"], "usage": usage, "model": body["model"]}
    return result


@pytest.fixture
def local_ray(s3: object) -> Iterator[Any]:  # noqa: F811 - after the S3 variables are set: the workers inherit them
    ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install -e '.[ray]'")
    pytest.importorskip("ray.data", reason="Ray Data is missing: pip install -e '.[ray]'")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = cli.main(["batch", "run", *args, *ENGINE_ARGS])
    err = capsys.readouterr().err
    assert code == 0, err
    return err


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 100 real requests on 2 cores: about a minute alone, more beside other suites
def test_ray_matches_single_machine_and_resumes(
    local_ray: Any,
    s3: Any,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("LOCALSERVE_HOME", str(tmp_path / "home"))  # the driver's journal
    source = tmp_path / "in.jsonl"
    source.write_text(batch_lines())
    single = tmp_path / "single.jsonl"
    run_cli([str(source), "-o", str(single), "--quiet"], capsys)
    expected = answers(single.read_text())
    assert len(expected) == NUM_LINES

    s3.pipe(f"{BUCKET}/in.jsonl", source.read_bytes())
    args = [f"s3://{BUCKET}/in.jsonl", "-o", f"s3://{BUCKET}/out.jsonl", "--ray", "--replicas", "2"]
    err = run_cli(args, capsys)
    assert f"{NUM_LINES}/{NUM_LINES} requests" in err and "tok/s" in err and "ETA" in err, err
    assert "per replica tok/s: r1" in err, err
    replicas = REPLICA_ROW.findall(err)
    assert len({name for name, _, _ in replicas}) == 2, f"both replicas answered lines: {replicas}"
    assert sum(int(n) for _, n, _ in replicas) == NUM_LINES
    first = s3.cat(f"{BUCKET}/out.jsonl").decode()
    assert answers(first) == expected, "the same answers as the single-machine run"
    assert not s3.exists(f"{BUCKET}/out.errors.jsonl")

    # Lose every other answer, then run again: only those are computed.
    kept = first.splitlines(keepends=True)[::2]
    s3.pipe(f"{BUCKET}/out.jsonl", "".join(kept).encode())
    err = run_cli(args, capsys)
    num_missing = NUM_LINES - len(kept)
    assert f"{NUM_LINES} requests, {len(kept)} done before: {num_missing} answered, 0 failed" in err, err
    assert sum(int(n) for _, n, _ in REPLICA_ROW.findall(err)) == num_missing, "lines the replicas computed"
    resumed = s3.cat(f"{BUCKET}/out.jsonl").decode()
    assert resumed.startswith("".join(kept)), "earlier answers are kept as they were"
    assert answers(resumed) == expected


@pytest.mark.slow
def test_the_single_machine_path_runs_without_ray(tmp_path: Path) -> None:
    """`localserve batch run` without --ray works where ray cannot be imported."""
    source = tmp_path / "in.jsonl"
    source.write_text(batch_lines().splitlines(keepends=True)[0].replace('"max_tokens": 16', '"max_tokens": 2'))
    output = tmp_path / "out.jsonl"
    code = (
        "import sys; sys.modules['ray'] = None  # any `import ray` now fails\n"
        "from localserve.cli import main as cli\n"
        f"sys.exit(cli.main(['batch', 'run', {str(source)!r}, '-o', {str(output)!r}, '--quiet', *{ENGINE_ARGS!r}]))"
    )
    env = {**os.environ, "LOCALSERVE_HOME": str(tmp_path / "home")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert list(answers(output.read_text())) == ["q000"]


def test_progress_counts_each_replica_from_its_first_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = {"wall": 1000.0, "mono": 50.0}
    monkeypatch.setattr(ray_progress.time, "time", lambda: clock["wall"])
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: clock["mono"])
    monkeypatch.setattr(ray_progress.time, "monotonic", lambda: clock["mono"])
    stream = io.StringIO()
    progress = ray_progress.ReplicaProgress(stream)
    progress.start(10, 2)
    clock["wall"], clock["mono"] = 1030.0, 80.0  # 30 s of start-up: Ray, model loads
    progress.advance_replica("a:1", 1020.0, ok=True, num_tokens=100)  # its first batch began 10 s ago
    clock["wall"], clock["mono"] = 1040.0, 90.0
    progress.advance_replica("b:2", 1035.0, ok=False, num_tokens=0)
    progress.advance_replica("a:1", 1020.0, ok=True, num_tokens=100)
    line = progress.line()
    assert "5/10 requests, 1 failed" in line, line
    assert "10.0 tok/s" in line, "200 tokens over the 20 s since the first batch, not the 40 s since start"
    # 3 answers in those 20 s: the 5 left take 33 s
    assert "ETA 00:33" in line and line.endswith("per replica tok/s: r1 10.0 r2 0.0"), line
    assert progress.summary() == [
        "r1 a:1: 2 requests, 200 tokens, 10.0 tok/s",
        "r2 b:2: 1 requests, 0 tokens, 0.0 tok/s",
    ]
