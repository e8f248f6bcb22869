"""The load generator against a real `localserve serve` process (tiny
random-weight model, tiny load): every kind of level, the priority mix, the
probe, and the `localserve bench` command."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from localserve.bench.report import Slo, markdown_table
from localserve.bench.runner import Level, Probe
from localserve.bench.session import run_bench
from localserve.bench.workload import RequestClass, Workload, parse_mix

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
OUTPUT_TOKENS = 6


@pytest.fixture(scope="module")
def server_url(tiny_gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALSERVE_")}
    log = (tmp_path_factory.mktemp("bench") / "server.log").open("wb")
    argv = [
        sys.executable,
        "-m",
        "localserve",
        "serve",
        "--port",
        str(port),
        "--model",
        f"tiny={tiny_gguf_path}",
        "--threads",
        "1",
        "--parallel",
        "4",
        "--ctx-size",
        "256",
    ]
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, "the server exited; see its log"
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(20)
        log.close()


def workload() -> Workload:
    return Workload("tiny", prompt_tokens=12, output_tokens=OUTPUT_TOKENS)


async def test_closed_and_open_loop_levels_with_a_priority_mix(server_url: str) -> None:
    levels = [Level("concurrency", 2, num_requests=4), Level("rate", 20, num_requests=4)]
    doc = await run_bench(server_url, workload(), parse_mix("interactive=0.5,batch=0.5"), levels, Slo(), pause_s=0)
    assert [lv["label"] for lv in doc["levels"]] == ["c=2", "rate=20/s"]
    for level in doc["levels"]:
        everything = level["all"]
        assert everything["num_completed"] == 4 and everything["num_failed"] == 0, everything["errors"]
        assert set(level["classes"]) == {"interactive", "batch"}
        assert level["classes"]["interactive"]["num_completed"] == 2
        assert {r["num_output_tokens"] for r in level["requests"]} == {OUTPUT_TOKENS}  # ignore_eos + min_tokens
        assert everything["ttft_ms"]["p99"] >= everything["ttft_ms"]["p50"] > 0
        assert everything["itl_ms"]["p50"] is not None and everything["output_tokens_per_s"] > 0
    table = markdown_table(doc["levels"])
    assert table.count("\n| c=2 |") == 3 and "| rate=20/s | interactive |" in table
    json.dumps(doc)  # the whole document is JSON-ready


async def test_a_probe_ends_its_level_and_cuts_off_the_main_load(server_url: str) -> None:
    probe = Probe(
        RequestClass("probe", "interactive"), rate=20, num_requests=2, output_tokens=2, prompt_tokens=4, delay_s=0.2
    )
    load = Workload("tiny", prompt_tokens=12, output_tokens=200)  # longer than the probe's life
    doc = await run_bench(
        server_url, load, [RequestClass("batch", "batch")], [Level("concurrency", 2, probe=probe)], Slo(), warmup=0
    )
    level = doc["levels"][0]
    assert level["classes"]["probe"]["num_completed"] == 2
    assert level["classes"]["batch"]["num_cut_off"] >= 1
    assert level["all"]["num_failed"] == 0, level["all"]["errors"]


def test_bench_command_prints_a_table_and_writes_json(server_url: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "localserve",
            "bench",
            "--url",
            server_url,
            "--concurrency",
            "1",
            "--num-requests",
            "2",
            "--prompt-tokens",
            "8",
            "--output-tokens",
            "4",
            "--warmup",
            "0",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert "| c=1 | none | 2/0/0 |" in result.stdout
    doc = json.loads(out.read_text())
    assert doc["meta"]["workload"]["model"] == "tiny"  # found through GET /v1/models
    assert doc["levels"][0]["all"]["mean_output_tokens"] == 4
