"""The command line: help texts, flags and LOCALSERVE_* variables, model
arguments, one-line errors, and `localserve run` on the real SmolLM2."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from localserve import __version__
from localserve.cli import main as cli
from localserve.config import DEFAULT_MODEL, ServerSettings

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m localserve ARGS` in a subprocess, with LOCALSERVE_* cleared."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LOCALSERVE_")}
    return subprocess.run(
        [sys.executable, "-m", "localserve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**clean, **(env or {})},
    )


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0]


# ---- help --------------------------------------------------------------------


def test_top_level_help_lists_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert {"serve", "run", "list"} <= set(subcommands())
    for name in subcommands():
        assert name in out


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_subcommand_help_mentions_every_option(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main([name, "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for action in subcommands()[name]._actions:
        for flag in action.option_strings:
            assert flag in out
        if action.help and action.option_strings and action.dest != "help":
            assert "default" in action.help or action.const is not None, f"{name} {action.option_strings}: no default"


def test_serve_help_names_each_env_var_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    out = "".join(capsys.readouterr().out.split())  # argparse may break a name across lines
    for option in cli.SERVE_OPTIONS:
        assert option.env in out
    assert "default:8400" in out
    assert f"default:{DEFAULT_MODEL}" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"localserve {__version__}"


def test_help_is_fast_and_imports_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "from localserve.cli import main as cli\n"
        "try:\n    cli.main(['serve', '--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('llama_cpp', 'aiohttp', 'localserve.server', 'localserve.engine') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_python_dash_m_runs_the_cli() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"localserve {__version__}"


# ---- settings from flags and environment ---------------------------------------


def test_defaults_match_server_settings() -> None:
    assert cli.settings_from_args([], {}) == ServerSettings()
    assert cli.settings_from_args(["serve"], {}).models == [DEFAULT_MODEL]


def test_env_var_sets_a_value_and_a_flag_wins() -> None:
    env = {"LOCALSERVE_PORT": "9999", "LOCALSERVE_API_KEY": "secret"}
    assert cli.settings_from_args([], env).port == 9999
    settings = cli.settings_from_args(["--port", "8500"], env)
    assert settings.port == 8500
    assert settings.api_key == "secret"


def test_every_option_reads_its_env_var() -> None:
    env = {
        "LOCALSERVE_HOST": "0.0.0.0",
        "LOCALSERVE_PORT": "1234",
        "LOCALSERVE_MODEL": "a.gguf, b=/x/y.gguf",
        "LOCALSERVE_API_KEY": "k",
        "LOCALSERVE_MAX_QUEUE": "7",
        "LOCALSERVE_PARALLEL": "3",
        "LOCALSERVE_CTX_SIZE": "2048",
        "LOCALSERVE_KV_SIZE": "8192",
        "LOCALSERVE_BATCH_TOKENS": "256",
        "LOCALSERVE_THREADS": "2",
        "LOCALSERVE_DEVICE": "CPU",
        "LOCALSERVE_N_GPU_LAYERS": "all",
        "LOCALSERVE_ALLOW_HOST": "box.lan,other",
        "LOCALSERVE_CORS_ORIGIN": "https://app.example",
        "LOCALSERVE_MAX_BODY_BYTES": "1000",
        "LOCALSERVE_BODY_TIMEOUT": "12.5",
        "LOCALSERVE_AGING": "5",
        "LOCALSERVE_RESERVED_SLOTS": "3",
        "LOCALSERVE_BATCH_ITL_TARGET": "1.3",
        "LOCALSERVE_BATCH_TTFT_TARGET": "2",
        "LOCALSERVE_SHUTDOWN_TIMEOUT": "2.5",
        "LOCALSERVE_MAX_LOADED_MODELS": "2",
        "LOCALSERVE_KEEP_ALIVE": "10m",
        "LOCALSERVE_CACHE_TYPE_K": "q8_0",
        "LOCALSERVE_CACHE_TYPE_V": "q4_0",
        "LOCALSERVE_FLASH_ATTN": "on",
        "LOCALSERVE_SPECULATIVE": "draft",
        "LOCALSERVE_DRAFT_MODEL": "/m/draft.gguf",
        "LOCALSERVE_DRAFT_MAX": "4",
        "LOCALSERVE_REASONING": "off",
        "LOCALSERVE_REASONING_BUDGET": "256",
        "LOCALSERVE_PREFIX_CACHE_DISK": "2G",
        "LOCALSERVE_BATCH_DISK_TIMEOUT": "60",
        "LOCALSERVE_NO_UI": "yes",
        "LOCALSERVE_STRICT_MODEL_NAMES": "true",
        "LOCALSERVE_N_PREDICT": "64",
        "LOCALSERVE_TEMP": "0.2",
        "LOCALSERVE_SEED": "42",
        "LOCALSERVE_CHAT_TEMPLATE_FILE": "/t/chat.jinja",
        "LOCALSERVE_CHAT_TEMPLATE": "chatml",
        "LOCALSERVE_NO_SLOTS": "1",
        "LOCALSERVE_NO_METRICS": "1",
        "LOCALSERVE_VERBOSE": "1",
        "LOCALSERVE_SLOT_SAVE_PATH": "/t/slots",
        "LOCALSERVE_POOLING": "NONE",
    }
    assert set(env) == {o.env for o in cli.SERVE_OPTIONS if o.field}, "test covers every settings option"
    assert cli.settings_from_args([], env) == ServerSettings(
        host="0.0.0.0",
        port=1234,
        models=["a.gguf", "b=/x/y.gguf"],
        api_key="k",
        max_queue=7,
        parallel=3,
        ctx_size=2048,
        kv_size=8192,
        batch_tokens=256,
        threads=2,
        device="cpu",
        n_gpu_layers=-1,
        allow_hosts=["box.lan", "other"],
        cors_origins=["https://app.example"],
        max_body_bytes=1000,
        body_timeout_s=12.5,
        aging_s=5.0,
        reserved_slots=3,
        batch_itl_target=1.3,
        batch_ttft_target=2.0,
        shutdown_timeout_s=2.5,
        max_loaded_models="2",
        keep_alive="10m",
        cache_type_k="q8_0",
        cache_type_v="q4_0",
        flash_attn="on",
        speculative="draft",
        draft_model="/m/draft.gguf",
        draft_max=4,
        reasoning="off",
        reasoning_budget=256,
        prefix_cache_disk=2 << 30,
        batch_disk_timeout_s=60.0,
        no_ui=True,
        strict_model_names=True,
        n_predict=64,
        temp=0.2,
        seed=42,
        chat_template_file="/t/chat.jinja",
        chat_template="chatml",
        no_slots=True,
        no_metrics=True,
        verbose=True,
        slot_save_path="/t/slots",
        pooling="none",
    )


def test_repeated_flags_replace_the_env_list() -> None:
    env = {"LOCALSERVE_MODEL": "from-env.gguf"}
    settings = cli.settings_from_args(["--model", "one.gguf", "--model", "two=/m/two.gguf"], env)
    assert settings.models == ["one.gguf", "two=/m/two.gguf"]


def test_a_chat_template_is_a_builtin_name_or_jinja() -> None:
    assert cli.settings_from_args(["--chat-template", "{{ messages }}"], {}).chat_template == "{{ messages }}"
    with pytest.raises((SystemExit, cli.CliError)):
        cli.settings_from_args(["--chat-template", "no-such-format"], {})


def test_empty_env_var_is_ignored() -> None:
    assert cli.settings_from_args([], {"LOCALSERVE_PORT": "", "LOCALSERVE_API_KEY": " "}) == ServerSettings()


def test_bad_env_value_names_the_variable() -> None:
    with pytest.raises(cli.CliError, match="LOCALSERVE_PORT='http'"):
        cli.settings_from_args([], {"LOCALSERVE_PORT": "http"})
    with pytest.raises(cli.CliError, match="LOCALSERVE_DEVICE.*use one of: auto, cpu, gpu, gpu:N, npu"):
        cli.settings_from_args([], {"LOCALSERVE_DEVICE": "tpu"})


def test_device_takes_the_one_vocabulary() -> None:
    for given, device in (("GPU.1", "gpu:1"), ("npu", "npu"), ("DML", "directml"), ("cuda:0", "cuda:0")):
        assert cli.settings_from_args(["--device", given], {}).device == device


def test_model_options_are_unset_unless_given() -> None:
    """Unset per-model options let the model's config file or catalog entry decide (models/options.py)."""
    settings = cli.settings_from_args([], {})
    assert (settings.ctx_size, settings.parallel, settings.kv_size, settings.device, settings.n_gpu_layers) == (
        None,
        None,
        None,
        None,
        None,
    )
    given = cli.settings_from_args(["--ctx-size", "0", "--n-gpu-layers", "auto"], {"LOCALSERVE_N_GPU_LAYERS": "3"})
    assert (given.ctx_size, given.n_gpu_layers) == (0, "auto")
    assert cli.settings_from_args(["--n-gpu-layers", "12"], {}).n_gpu_layers == 12


@pytest.mark.parametrize("argv", [["--ctx-size", "8"], ["--n-gpu-layers", "many"], ["--n-gpu-layers", "-2"]])
def test_bad_model_option_flags_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.settings_from_args(argv, {})
    assert exc.value.code == 2 and argv[0] in capsys.readouterr().err


def test_bad_flag_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.settings_from_args(["--parallel", "0"], {})
    assert exc.value.code == 2
    assert "--parallel" in capsys.readouterr().err


def test_bad_env_value_exits_with_one_line() -> None:
    result = run_cli("serve", env={"LOCALSERVE_PORT": "99999"})
    assert_one_line_error(result, "LOCALSERVE_PORT")


# ---- model arguments ------------------------------------------------------------


def test_model_path_is_served_under_its_stem(tmp_path: Path) -> None:
    from localserve.models.registry import resolve

    path = tmp_path / "tiny-chat.Q4_0.gguf"
    path.write_bytes(b"GGUF")
    spec = resolve(str(path))
    assert (spec.model_id, spec.path) == ("tiny-chat.Q4_0", path.resolve())
    named = resolve(f"mine={path}")
    assert (named.model_id, named.path) == ("mine", path.resolve())
    cli.check_models([str(path), f"mine={path}"])


def test_two_models_with_one_id_are_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for folder in ("a", "b"):
        (tmp_path / folder / "same.gguf").write_bytes(b"GGUF")
    with pytest.raises(cli.CliError, match="ID=PATH"):
        cli.check_models([str(tmp_path / "a" / "same.gguf"), str(tmp_path / "b" / "same.gguf")])


def test_unknown_model_is_one_line() -> None:
    result = run_cli("run", "no-such-model", "hello", "--max-tokens", "1")
    assert_one_line_error(result, "no-such-model", "smollm2-135m-instruct")


def test_serve_unknown_model_and_missing_file_fail_before_starting(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("serve", "--model", "no-such-model"), "unknown model")
    missing = tmp_path / "missing.gguf"
    assert_one_line_error(run_cli("serve", "--model", str(missing)), "not found", str(missing))


def test_serve_port_in_use_is_one_line() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = run_cli("serve", "--port", str(port))
    assert_one_line_error(result, f"port {port}", "--port")


def _garbage_gguf(path: Path) -> Path:
    """GGUF's magic and version, then a key length past any index: the header
    reader's OverflowError, once a traceback."""
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
                     + (2**63 + 5).to_bytes(8, "little") + b"garbage")  # fmt: skip
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_exits_1_with_one_line_when_a_startup_model_cannot_load(tmp_path: Path) -> None:
    garbage = _garbage_gguf(tmp_path / "x.gguf")
    result = run_cli("serve", "--model", str(garbage), "--port", str(_free_port()), timeout=120)
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result, "could not load model", str(garbage), "not a readable GGUF file")
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n")
    result = run_cli("serve", "--model", str(text), "--port", str(_free_port()), timeout=120)
    assert result.returncode == 1, result.stderr
    assert_one_line_error(result, str(text))


@pytest.mark.slow
def test_serve_exits_1_when_the_gpu_asked_for_is_missing() -> None:
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama.cpp build offloads to a GPU: the request would succeed")
    for flags in (["--device", "gpu"], ["--n-gpu-layers", "10"]):
        result = run_cli("serve", *flags, "--port", str(_free_port()), timeout=180)
        assert result.returncode == 1, (flags, result.stderr)
        assert_one_line_error(result, f"could not load model {DEFAULT_MODEL}", "GPU support")


def test_run_and_batch_run_fail_in_one_line_on_a_damaged_gguf_or_a_missing_file(tmp_path: Path) -> None:
    garbage = _garbage_gguf(tmp_path / "x.gguf")
    assert_one_line_error(run_cli("run", str(garbage), "hi"), "not a readable GGUF file")
    missing = run_cli("batch", "run", str(tmp_path / "nofile.jsonl"), "-o", str(tmp_path / "out.jsonl"), "--quiet")
    assert_one_line_error(missing, "No such file or directory", "nofile.jsonl")


def test_run_wants_a_chat_model() -> None:
    embeddings = run_cli("run", "all-minilm-l6-v2", "hi")
    assert_one_line_error(embeddings, "'all-minilm-l6-v2' is an embeddings model", DEFAULT_MODEL, "/v1/embeddings")
    unknown = run_cli("run", "no-such-model", "hi")
    assert_one_line_error(unknown, "unknown model 'no-such-model'", "chat model", DEFAULT_MODEL)
    assert "all-minilm" not in unknown.stderr and "whisper" not in unknown.stderr  # not ids `run` could use


def test_run_and_batch_run_take_the_gpu_options_their_hints_name(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["run", "--help"], ["batch", "run", "--help"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
        out = capsys.readouterr().out
        assert "--device" in out and "--n-gpu-layers" in out


@pytest.mark.slow
def test_run_with_bytes_that_are_not_utf8_is_one_line() -> None:
    """A byte that is not UTF-8 reaches Python's argv as a lone surrogate (\udcff),
    which the tokenizer cannot encode: a one-line error, not a traceback."""
    result = run_cli("run", DEFAULT_MODEL, b"caf\xff".decode("utf-8", "surrogateescape"), "--max-tokens", "1")
    assert_one_line_error(result, "lone UTF-16 surrogate")


# ---- list -----------------------------------------------------------------------


def test_list_shows_builtin_models_without_a_server() -> None:
    result = run_cli("list", "--url", "http://127.0.0.1:9", "--json")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    row = next(r for r in body["models"] if r["id"] == DEFAULT_MODEL)
    assert row["installed"] is True
    assert row["path"].endswith(".gguf") and row["size_bytes"] > 50_000_000
    assert body["loaded"] is None and "no server" in body["server_note"]

    table = run_cli("list", "--url", "http://127.0.0.1:9")
    assert table.returncode == 0
    assert DEFAULT_MODEL in table.stdout and "no server answering" in table.stdout


# ---- run on the real model ------------------------------------------------------


@pytest.mark.slow
def test_run_streams_a_real_completion() -> None:
    result = run_cli(
        "run", DEFAULT_MODEL, "The capital of France is", "--raw", "--max-tokens", "8", "--temperature", "0"
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "tokens" in result.stderr and "tok/s" in result.stderr


@pytest.mark.slow
def test_run_chat_template_with_system_message() -> None:
    result = run_cli(
        "run",
        DEFAULT_MODEL,
        "What is the capital of France?",
        "--system",
        "Answer in one short sentence.",
        "--max-tokens",
        "24",
        "--temperature",
        "0",
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
