"""`localserve pull`, `list`, `rm` and the serve options, in-process against the fake hub."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from localserve.cli import main, settings_from_args
from localserve.models.store import ModelStore
from tests.models.hub import FakeHub


def test_pull_list_rm(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    data = os.urandom(400_000)
    hub.add("test/cli", "weights.gguf", data)
    assert main(["pull", "hf://test/cli/weights.gguf", "--name", "cli-model"]) == 0
    out, err = capsys.readouterr()
    assert "cli-model" in out and "weights.gguf [" in err and "100.0%" in err and "ETA" in err
    assert ModelStore().model_path("cli-model").read_bytes() == data  # type: ignore[union-attr]

    assert main(["pull", "hf://test/cli/weights.gguf", "--name", "cli-model"]) == 0
    assert "already in the model store" in capsys.readouterr().err

    assert main(["list", "--url", "http://127.0.0.1:9", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)["models"]}
    assert rows["cli-model"]["status"] == "downloaded" and rows["cli-model"]["size_bytes"] == len(data)
    assert rows["smollm2-135m-instruct"]["status"] == "installed"
    assert rows["qwen2.5-0.5b-instruct"]["status"] == "not downloaded"
    assert main(["list", "--url", "http://127.0.0.1:9"]) == 0
    assert "cli-model" in capsys.readouterr().out

    assert main(["rm", "cli-model"]) == 0
    assert "removed cli-model" in capsys.readouterr().out
    assert main(["rm", "cli-model"]) == 1
    assert main(["pull", "../x"]) == 1
    assert "invalid model id" in capsys.readouterr().err


def test_serve_options_for_limits_and_keep_alive(home: Path) -> None:
    settings = settings_from_args(["--max-loaded-models", "chat=2,asr=1", "--keep-alive", "10m"], {})
    assert settings.max_loaded_models == "chat=2,asr=1" and settings.keep_alive == "10m"
    env = {"LOCALSERVE_MAX_LOADED_MODELS": "4", "LOCALSERVE_KEEP_ALIVE": "-1"}
    settings = settings_from_args([], env)
    assert settings.max_loaded_models == "4" and settings.keep_alive == "-1"
    with pytest.raises(SystemExit):
        settings_from_args(["--keep-alive", "soon"], {})
