"""What a JSON schema costs (issue 31): decode throughput with a schema
against without one, at 1 and 8 streams, on llama.cpp and ONNX Runtime, and
llama.cpp's new grammar engine (llguidance) against the GBNF sampler it
replaced; plus the time to compile a 50-property schema, with llguidance and
(when installed) xgrammar.

The backends are driven step by step in-process (the same `execute` the
scheduler calls), so what differs between the runs is only the sampling.
Each cell runs `--pairs` times; a pair runs the constrained and the
unconstrained case back to back in alternating order, and the table gives
the median of the per-pair ratios with their spread. The old GBNF path runs
from a git worktree of the commit before the change (`--old-commit`), in a
child process, alternating with the new one in the same way.

    python bench/structured_bench.py --pairs 5 --out bench/results/structured.json

Start it on a quiet machine (the 1-minute load is recorded before each pair).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OLD_COMMIT = "680a7cb"  # the last commit with llama.cpp's GBNF grammar sampler
SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 6,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                    "city": {"type": "string"},
                    "email": {"type": "string"},
                },
                "required": ["name", "age", "city", "email"],
            },
        }
    },
    "required": ["people"],
}
PROMPT = (
    "<|im_start|>user\nList six people as JSON: name, age, city and email of each.<|im_end|>\n<|im_start|>assistant\n"
)
TOKENS = 96


def _grammar(old: bool) -> str:
    """The schema as the code under test takes it: GBNF for the old path,
    llguidance's grammar for the new (serving/grammar.py)."""
    if old:
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        return str(json_schema_to_gbnf(json.dumps(SCHEMA)))
    from localserve.serving.grammar import grammar_for
    from localserve.serving.types import OutputFormat

    grammar = grammar_for(OutputFormat("json_schema", SCHEMA))
    assert grammar is not None
    return grammar


def run_case(backend_name: str, folder: str, streams: int, constrained: bool, old: bool) -> dict[str, float]:
    """Decode `TOKENS` tokens in each of `streams` sequences; tokens/s of the decode steps."""
    from localserve.engine.types import SamplingParams, SeqChunk, StepPlan

    backend = _open(backend_name, folder, streams)
    try:
        params = SamplingParams(
            temperature=0.0, grammar=_grammar(old) if constrained else None, ignore_eos=not constrained
        )
        if constrained:
            backend.validate(params)  # builds the vocabulary's constraint tokenizer once, as a request would
        prompt = tuple(backend.tokenizer().encode(PROMPT, add_special=False))
        eog = backend.tokenizer().eog_token_ids
        backend.clear_slots(list(range(streams)))
        first = backend.execute(StepPlan(0, (), tuple(SeqChunk(i, i, prompt, 0, True, params) for i in range(streams))))
        last = {i: first.sampled[i].token_id for i in range(streams)}
        pos = {i: len(prompt) for i in range(streams)}
        done: set[int] = set()
        tokens = 0
        started = time.perf_counter()
        for step in range(1, TOKENS):
            chunks = tuple(SeqChunk(i, i, (last[i],), pos[i], True, params) for i in range(streams) if i not in done)
            if not chunks:
                break
            result = backend.execute(StepPlan(step, (), chunks))
            for chunk in chunks:
                token = result.sampled[chunk.seq_id].token_id
                pos[chunk.seq_id] += 1
                last[chunk.seq_id] = token
                tokens += 1
                if token in eog:
                    done.add(chunk.seq_id)
        elapsed = time.perf_counter() - started
        backend.release(list(range(streams)))
        return {"tokens": tokens, "seconds": elapsed, "tok_s": tokens / elapsed}
    finally:
        backend.close()


def _open(backend_name: str, folder: str, streams: int) -> Any:
    if backend_name == "llamacpp":
        from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig

        return LlamaCppBackend(LlamaCppConfig(folder, n_ctx=512, num_slots=max(streams, 1)))
    from localserve.backends.onnx.backend import OnnxBackend, OnnxConfig

    return OnnxBackend(OnnxConfig(folder, n_ctx=512, num_slots=max(streams, 1), step_tokens=512, n_threads=0))


def child(args: list[str], cwd: Path) -> dict[str, float]:
    """One case in a fresh process (of `cwd`'s code)."""
    env = dict(os.environ, PYTHONPATH=str(cwd), LOCALSERVE_LLAMA_CHECK="0")
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "structured_bench.py"), "--case", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def compile_times() -> dict[str, Any]:
    """Seconds to compile a 50-property schema (median of 5)."""
    schema = {
        "type": "object",
        "properties": {f"field_{i}": {"type": ["string", "integer", "boolean"][i % 3]} for i in range(50)},
        "required": [f"field_{i}" for i in range(50)],
    }
    from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig
    from localserve.serving.grammar import _schema_grammar

    backend = LlamaCppBackend(LlamaCppConfig(_smollm2(), n_ctx=256, num_slots=1))
    tokenizer = backend.tokenizer().guidance_tokenizer()
    out: dict[str, Any] = {}
    import llguidance

    times = []
    for i in range(5):
        started = time.perf_counter()
        text = json.dumps(schema | {"title": f"run {i}"}, sort_keys=True)  # a new schema each time: no cache
        llguidance.LLMatcher(tokenizer, _schema_grammar(text, False))
        times.append(time.perf_counter() - started)
    out["llguidance_s"] = statistics.median(times)
    try:
        import xgrammar

        pieces = [backend.tokenizer().token_bytes(t) or b"" for t in range(backend.tokenizer().vocab_size)]
        info = xgrammar.TokenizerInfo(pieces, vocab_type=xgrammar.VocabType.RAW)
        compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        times = []
        for _ in range(5):
            started = time.perf_counter()
            compiler.compile_json_schema(json.dumps(schema))
            times.append(time.perf_counter() - started)
        out["xgrammar_s"] = statistics.median(times)
    except ImportError:
        out["xgrammar_s"] = None
    backend.close()
    return out


def _smollm2() -> str:
    from localserve.models.registry import resolve

    return str(resolve("smollm2-135m-instruct").path)


def _onnx_folder() -> str:
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.export_smollm2 import export_smollm2

    return str(export_smollm2(Path(_smollm2()))["onnx"])


def load1() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--backends", default="llamacpp,onnx")
    parser.add_argument("--old-commit", default=OLD_COMMIT)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case", nargs=5, metavar=("BACKEND", "FOLDER", "STREAMS", "CONSTRAINED", "OLD"))
    args = parser.parse_args()
    if args.case:
        backend, folder, streams, constrained, old = args.case
        print(json.dumps(run_case(backend, folder, int(streams), constrained == "1", old == "1")))
        return
    old_tree = Path("/tmp/localserve-structured-old")
    if not old_tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(old_tree), args.old_commit], cwd=ROOT, check=True)
    folders = {"llamacpp": _smollm2(), "onnx": _onnx_folder()}
    cells: list[dict[str, Any]] = []
    for backend in args.backends.split(","):
        for streams in (int(s) for s in args.streams.split(",")):
            runs: dict[str, list[float]] = {"plain": [], "schema": [], "schema_gbnf": []}
            loads = []
            for pair in range(args.pairs):
                loads.append(load1())
                order = ["plain", "schema", "schema_gbnf"] if backend == "llamacpp" else ["plain", "schema"]
                if pair % 2:
                    order.reverse()
                for case in order:
                    old = case == "schema_gbnf"
                    result = child(
                        [backend, folders[backend], str(streams), "0" if case == "plain" else "1", "1" if old else "0"],
                        old_tree if old else ROOT,
                    )
                    runs[case].append(result["tok_s"])
            cell: dict[str, Any] = {"backend": backend, "streams": streams, "load1": loads, "tok_s": runs}
            for name, num, den in (("schema_vs_plain", "schema", "plain"), ("schema_vs_gbnf", "schema", "schema_gbnf")):
                if runs[den]:
                    ratios = [a / b for a, b in zip(runs[num], runs[den], strict=True)]
                    cell[name] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
            cells.append(cell)
            print(json.dumps(cell), flush=True)
    report = {"cells": cells, "compile_50_properties": compile_times(), "tokens_per_stream": TOKENS}
    print(json.dumps(report["compile_50_properties"]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
