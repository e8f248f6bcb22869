"""Run llama.cpp's own server test suite (`tools/server/tests`) against localserve.

    /work/bin/cpugate .venv/bin/python tests/compat/run_llama_suite.py [-k EXPR] [--valid-only] [FILES...]

`--valid-only` runs only the valid tests of the files (a third of the time).

The suite ships in the llama-cpp-python sdist on PyPI; it is downloaded once
into a cache folder (`--cache`, default ~/.cache/localserve-compat), copied
to a temporary folder with the chat templates it reads, and run with
`LLAMA_SERVER_BIN_PATH` pointing at `llama_server_shim.py`, which maps every
preset to SmolLM2 (embedding presets to all-MiniLM) and llama-server's flags
to `localserve serve`. Nothing of llama.cpp's is kept in this repository.

The report counts the *valid* tests passed: those that pass on the real
llama-server with the same SmolLM2 GGUF (`valid_tests.json`, written by
`--peer PATH_TO_LLAMA_SERVER --write-valid all`; `LLAMA_SHIM_PEER_EMBED`
names an all-MiniLM GGUF for the embedding presets), less the files of
llama-server features localserve does not have (`OUT_OF_SCOPE`). The
others need stories260K's exact text or its chat template. The rerank
presets go to all-MiniLM as a bi-encoder (no trained cross-encoder installs
from PyPI here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

SDIST = "llama-cpp-python==0.3.36"
SUITE = "vendor/llama.cpp/tools/server/tests/"
TEMPLATES = "vendor/llama.cpp/models/templates/"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VALID_FILE = HERE / "valid_tests.json"
#: Test files the runner runs by default: those with tests that pass on llama-server with SmolLM2.
DEFAULT_FILES = (
    "test_basic.py",
    "test_chat_completion.py",
    "test_completion.py",
    "test_compat_anthropic.py",
    "test_compat_oai_responses.py",
    "test_ctx_shift.py",
    "test_embedding.py",
    "test_ignore_eos.py",
    "test_infill.py",
    "test_kv_keep_only_active.py",
    "test_metrics.py",
    "test_rerank.py",
    "test_security.py",
    "test_slot_save.py",
    "test_stream.py",
    "test_template.py",
    "test_tokenize.py",
    "test_tool_call.py",
)
#: Features of llama-server that are not localserve's: their tests pass on llama-server but are not counted.
OUT_OF_SCOPE = {
    "test_mcp_servers.py": "llama-server's MCP server bridge",
    "test_tools_builtin.py": "llama-server's built-in tools (/tools: shell, files)",
    "test_vision_api.py": "vision (no vision GGUF with its mmproj installs here)",
    "test_proxy.py": "the web UI's /cors-proxy",
    "test_router.py": "llama-server's router mode (models loaded by a child server)",
    "test_sleep.py": "--sleep-idle-seconds",
    "test_compat_gcp.py": "Vertex AI's /predict (AIP_MODE)",
}
STUB_WGET = "def download(url, out=None):\n    raise RuntimeError(f'offline: {url}')\n"


def fetch_suite(cache: Path) -> Path:
    """The extracted suite in `cache` (downloaded once with pip)."""
    root = cache / "llama.cpp"
    if (root / SUITE).is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    archives = list(cache.glob("llama_cpp_python-*.tar.gz"))
    if not archives:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", SDIST, "-d", str(cache)]
        subprocess.run(pip, check=True)
        archives = list(cache.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(archives[0]) as tar:
        top = tar.getnames()[0].split("/")[0]
        wanted = [m for m in tar.getmembers() if m.name.startswith((f"{top}/{SUITE}", f"{top}/{TEMPLATES}"))]
        for member in wanted:
            member.name = member.name[len(top) + 1 + len("vendor/llama.cpp/") :]
        tar.extractall(root, members=wanted, filter="data")
    return root


def prepare(root: Path, work: Path) -> Path:
    """A scratch copy laid out as the suite expects (`../../../models/templates`)."""
    shutil.copytree(root / "tools/server/tests", work / "tools/server/tests")
    shutil.copytree(root / "models/templates", work / "models/templates")
    tests = work / "tools/server/tests"
    (tests / "wget.py").write_text(STUB_WGET)  # the presets never download here
    shim = work / "llama-server"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HERE / "llama_server_shim.py"}" "$@"\n')
    shim.chmod(0o755)
    return tests


def run_pytest(tests: Path, work: Path, files: list[str], extra: list[str], peer: str | None) -> Path:
    junit = work / "junit.xml"
    env = {
        **os.environ,
        "LLAMA_SERVER_BIN_PATH": str(work / "llama-server"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        "LOCALSERVE_HOME": str(work / "home"),
        "LLAMA_CACHE": str(work / "llama-cache"),
    }
    if peer:
        env["LLAMA_SHIM_PEER"] = peer
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q", "--tb=line"]
    cmd += [f"--junitxml={junit}", *extra, *[f"unit/{name}" for name in files]]  # files or test ids
    subprocess.run(cmd, cwd=tests, env=env, check=False)
    return junit


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id (`file.py::name[param]`) -> (passed|failed|skipped, first error line)."""
    found: dict[str, tuple[str, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}.py::{case.get('name')}"
        status, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                status = "skipped" if tag == "skipped" else "failed"
                why = (
                    (node.get("message") or node.text or "").strip().splitlines()[0][:200]
                    if (node.get("message") or node.text)
                    else ""
                )
                break
        found[name] = (status, why)
    return found


def report(results: dict[str, tuple[str, str]], valid: set[str] | None, out: Path | None) -> None:
    if valid is not None:
        valid = {t for t in valid if t.split("::")[0] not in OUT_OF_SCOPE}
    counted = set(results) if valid is None else valid & set(results)
    passed = sorted(t for t in counted if results[t][0] == "passed")
    failed = sorted(t for t in counted if results[t][0] != "passed")
    for test in failed:
        print(f"FAIL {test}: {results[test][1]}")
    extra = sorted(t for t in set(results) - counted if results[t][0] == "passed")
    label = "valid" if valid is not None else "run (no valid list)"
    print(f"\n{len(passed)} of {len(counted)} {label} tests passed")
    for name, why in OUT_OF_SCOPE.items():
        print(f"not counted: {name}: {why}")
    print(f"not valid with SmolLM2 but passed anyway: {len(extra)}")
    if out:
        summary = {"passed": passed, "failed": {t: results[t][1] for t in failed}}
        out.write_text(json.dumps(summary, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", help=f"test files (default: {len(DEFAULT_FILES)} files)")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache/localserve-compat")
    parser.add_argument("--peer", help="run the real llama-server at this path instead (validity run)")
    parser.add_argument("--write-valid", action="store_true", help="with --peer: record what passed as valid")
    parser.add_argument("--json", type=Path, help="write the summary here")
    parser.add_argument("--valid-only", action="store_true", help="run only the valid tests (much faster)")
    args = parser.parse_args()
    files = args.files or list(DEFAULT_FILES)
    if files == ["all"]:
        files = sorted(p.name for p in (fetch_suite(args.cache) / "tools/server/tests/unit").glob("test_*.py"))
    root = fetch_suite(args.cache)
    valid = set(json.loads(VALID_FILE.read_text())) if VALID_FILE.exists() and not args.peer else None
    if args.valid_only and valid is not None:
        chosen = set(files)
        files = sorted(t for t in valid if t.split("::")[0] in chosen - set(OUT_OF_SCOPE))
    with tempfile.TemporaryDirectory(prefix="llama-suite-") as scratch:
        work = Path(scratch)
        tests = prepare(root, work)
        junit = run_pytest(tests, work, files, ["-k", args.k] if args.k else [], args.peer)
        results = outcomes(junit)
    if args.peer and args.write_valid:
        VALID_FILE.write_text(json.dumps(sorted(t for t, (s, _) in results.items() if s == "passed"), indent=1) + "\n")
        print(f"wrote {VALID_FILE}")
    report(results, valid, args.json)


if __name__ == "__main__":
    main()
