"""Does this llama.cpp build run on this CPU? Decode in a subprocess and see.

A llama.cpp built for "this machine" can still die on it: on a Xeon that
reports AMX, the native build of the llama.cpp vendored by llama-cpp-python
0.3.36 compiles ggml's AMX kernels, and the first decode dies with SIGILL
(`tilezero`, upstream PR #26954). No cpuid or permission probe predicts it;
only running a decode does. So before a process loads a GGUF in-process for
the first time with a given llama.cpp library, it runs the same kind of
decode in a child process - one sequence, then eight together, with as many
threads as serving uses - and remembers the verdict by the library's hash.
A child that dies on a signal leaves the server standing and refusing in
one line, with the rebuild that fixes it.

This file is also the child, and the Makefile's wheel check
(`scripts/llama_wheel.py`) runs it by path before localserve is installed,
so its top level imports the standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

#: Bump when the check itself changes, so verdicts of an older check are redone.
CHECK_VERSION = 1
TIMEOUT_S = 300.0
#: The rebuild that leaves out the instruction sets known to crash, else a portable one.
FIX = (
    "rebuild llama-cpp-python without them: "
    "CFLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' CXXFLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' "
    "pip install --force-reinstall --no-cache-dir --no-binary llama-cpp-python llama-cpp-python==0.3.36 "
    "(or CMAKE_ARGS=-DGGML_NATIVE=OFF for a portable build; `make install` in a clone does this for you)"
)
_PROMPT = "The quick brown fox jumps over the lazy dog. A check of every kernel the decode uses, one and eight at once."


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a check found: `ok`, else why not (`signal` names a fatal one)."""

    ok: bool
    detail: str
    signal: str = ""

    def line(self) -> str:
        return "decodes" if self.ok else (f"died on {self.signal}" if self.signal else f"failed: {self.detail}")


def run_check(
    model_path: Path,
    *,
    embeddings: bool = False,
    python_path: str | None = None,
    threads: int = 0,
    script: Path | None = None,
    speed: bool = False,
) -> Verdict:
    """Run the decode check in a child process (`embeddings`: the model is an
    embeddings model, so it is run as one). `python_path` is put first on the
    child's PYTHONPATH (an unpacked wheel); `script` replaces this file (tests
    put a stand-in that dies the way a broken build does). No core is dumped.
    `speed`: time decoding instead (`_speed_check`; the wheel recipe compares
    two builds with it); the verdict's detail is then its JSON line."""
    env = dict(os.environ)
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (python_path, env.get("PYTHONPATH", "")) if p)
    mode = "speed" if speed else "embed" if embeddings else "generate"
    command = [
        sys.executable,
        str(script or Path(__file__)),
        str(model_path),
        str(threads or os.cpu_count() or 1),
        mode,
    ]
    try:
        child = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, preexec_fn=_no_core_dump
        )
    except subprocess.TimeoutExpired:
        return Verdict(False, f"the decode check did not finish in {TIMEOUT_S:.0f} s")
    if child.returncode < 0:
        name = signal.Signals(-child.returncode).name
        return Verdict(False, f"the decode check died on {name}", name)
    if child.returncode != 0:
        tail = (child.stderr.strip().splitlines() or ["(no output)"])[-1]
        return Verdict(False, tail[:300])
    return Verdict(True, child.stdout.strip().splitlines()[-1][:300] if child.stdout.strip() else "ok")


def _no_core_dump() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


# ---- the verdict per library, for serve / run / batch run ------------------------------------


def library_digest(lib_dir: Path) -> str:
    """A hash of every shared library in llama_cpp's lib folder (the binary under test)."""
    digest = hashlib.sha256(f"check-{CHECK_VERSION}".encode())
    for path in sorted(lib_dir.iterdir()):
        if path.is_file() and (".so" in path.name or path.suffix in (".dll", ".dylib")):
            digest.update(path.name.encode())
            with path.open("rb") as file:
                while block := file.read(1 << 20):
                    digest.update(block)
    return digest.hexdigest()[:24]


def verdict_dir() -> Path:
    """Where verdicts are remembered: `$LOCALSERVE_CACHE`, else the user cache directory."""
    root = os.environ.get("LOCALSERVE_CACHE", "").strip()
    if root:
        return Path(root).expanduser() / "llama-check"
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("localserve", appauthor=False)) / "llama-check"


_lock = threading.Lock()
_checked: dict[str, Verdict] = {}  # library digest -> verdict, for this process


def library_verdict(model_path: Path, *, embeddings: bool = False, lib_dir: Path | None = None) -> Verdict:
    """This llama.cpp library's verdict: remembered (process, then disk) or
    found now by decoding `model_path` in a child process (a few seconds, once
    per library). Only a crash (a signal) is remembered as a failure: any
    other failure (a model the check cannot run, a timeout) may not be the
    library's, so it is returned once and checked again next time.
    `LOCALSERVE_LLAMA_CHECK=0` skips the check."""
    if os.environ.get("LOCALSERVE_LLAMA_CHECK", "").strip().lower() in ("0", "off", "false", "no"):
        return Verdict(True, "check skipped (LOCALSERVE_LLAMA_CHECK=0)")
    if lib_dir is None:
        import llama_cpp

        lib_dir = Path(llama_cpp.__file__).parent / "lib"
    with _lock:  # one check at a time; a second load waits for the first verdict
        digest = library_digest(lib_dir)
        if digest in _checked:
            return _checked[digest]
        stored = verdict_dir() / f"{digest}.json"
        verdict = _read(stored)
        if verdict is None:
            verdict = run_check(model_path, embeddings=embeddings)
            _write(stored, verdict)
        _checked[digest] = verdict
        return verdict


def _read(path: Path) -> Verdict | None:
    try:
        data = json.loads(path.read_text())
        return Verdict(bool(data["ok"]), str(data["detail"]), str(data.get("signal", "")))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: check again


def _write(path: Path, verdict: Verdict) -> None:
    if not verdict.ok and not verdict.signal:
        return  # a failure that is not a crash (a timeout, a bad file) may not be the library's: ask again next time
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(verdict)))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: the check runs again in the next process


# ---- the child ---------------------------------------------------------------------------------


def _decode_check(model_path: str, threads: int, mode: str = "generate") -> str:
    """Load the model on the CPU and decode one sequence, then eight at once
    (prompts and single tokens, so both the matrix-matrix and the
    matrix-vector kernels run); the logits must be finite. An embeddings
    model embeds one text, then eight."""
    import llama_cpp
    import numpy as np

    if mode == "embed":
        return _embed_check(model_path, threads)
    if mode == "speed":
        return _speed_check(model_path, threads)

    model = _load(model_path)
    n_seqs, n_ctx_seq = 8, 128
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_seq_max = n_seqs * n_ctx_seq, 512, n_seqs
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    text = _PROMPT.encode()
    tokens = (llama_cpp.llama_token * 64)()
    n_prompt = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, 64, True, False)
    if n_prompt <= 0:
        raise SystemExit("the tokenizer returned no tokens")
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(items: list[tuple[int, int, int]]) -> list[int]:
        batch.n_tokens = len(items)
        for i, (token, pos, seq) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, 0
        batch.logits[len(items) - 1] = 1
        last = {seq: i for i, (_, _, seq) in enumerate(items)}
        for i in last.values():
            batch.logits[i] = 1
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        out = []
        for seq in sorted(last):
            row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, last[seq]), shape=(n_vocab,))
            if not np.isfinite(row).all():
                raise SystemExit("llama_decode gave non-finite logits")
            out.append(int(row.argmax()))
        return out

    prompt = list(tokens[:n_prompt])
    decode([(t, p, 0) for p, t in enumerate(prompt)])  # one sequence
    llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
    nexts = decode([(t, p, s) for s in range(n_seqs) for p, t in enumerate(prompt)])  # eight prompts at once
    for step in range(4):  # eight sequences, one token each
        nexts = decode([(nexts[s], n_prompt + step, s) for s in range(n_seqs)])
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    return f"decoded 1 and {n_seqs} sequences with {threads} threads; {info}"


def _speed_check(model_path: str, threads: int, steps_1: int = 96, steps_16: int = 32) -> str:
    """Decode speed on the CPU, as serving decodes: one sequence, then 16
    together (each with its own KV stream), one token each a step with
    logits. Prints JSON: tokens/s at 1 and 16 sequences and their geometric
    mean (`tok_s`), the score that `scripts/llama_wheel.py` compares builds by."""
    import time

    import llama_cpp

    model = _load(model_path)
    n_seqs, n_ctx_seq = 16, 128
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_seq_max = n_seqs * n_ctx_seq, 512, n_seqs
    cparams.kv_unified = False
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    vocab = llama_cpp.llama_model_get_vocab(model)
    text = _PROMPT.encode()
    tokens = (llama_cpp.llama_token * 64)()
    n_prompt = min(llama_cpp.llama_tokenize(vocab, text, len(text), tokens, 64, True, False), 24)
    if n_prompt <= 0:
        raise SystemExit("the tokenizer returned no tokens")
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(items: list[tuple[int, int, int]], logits: bool) -> None:
        batch.n_tokens = len(items)
        for i, (token, pos, seq) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, int(logits)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    decode([(tokens[p], p, s) for s in range(n_seqs) for p in range(n_prompt)], logits=False)
    tok_s = {}
    for count, steps in ((1, steps_1), (n_seqs, steps_16)):
        started = time.perf_counter()
        for step in range(steps):
            decode([(tokens[step % n_prompt], n_prompt + step, s) for s in range(count)], logits=True)
        tok_s[str(count)] = round(count * steps / (time.perf_counter() - started), 2)
        for s in range(count):  # back to the prompt, so both counts decode at the same positions
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), s, n_prompt, -1)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    score = round((tok_s["1"] * tok_s[str(n_seqs)]) ** 0.5, 2)
    return json.dumps({"tok_s": score, "by_sequences": tok_s, "threads": threads})


def _load(model_path: str):  # type: ignore[no-untyped-def]
    """llama.cpp, silenced, and the model's weights on the CPU (the kernels under test)."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    _silence.append(llama_cpp.llama_log_callback(lambda level, text, user: None))  # referenced while in use
    llama_cpp.llama_log_set(_silence[-1], None)
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp could not load {model_path}")
    return model


_silence: list[object] = []


def _embed_check(model_path: str, threads: int) -> str:
    import llama_cpp
    import numpy as np

    model = _load(model_path)
    n_seqs = 8
    cparams = llama_cpp.llama_context_default_params()
    cparams.embeddings, cparams.kv_unified = True, True
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = 512
    cparams.n_seq_max = n_seqs
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        raise SystemExit("llama.cpp could not create a context")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_embd = llama_cpp.llama_model_n_embd(model)
    encoder_only = llama_cpp.llama_model_has_encoder(model) and not llama_cpp.llama_model_has_decoder(model)
    text = _PROMPT.encode()
    tokens = (llama_cpp.llama_token * 64)()
    n_prompt = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, 64, True, False)
    if n_prompt <= 0:
        raise SystemExit("the tokenizer returned no tokens")
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    for count in (1, n_seqs):
        memory = llama_cpp.llama_get_memory(ctx)
        if memory:
            llama_cpp.llama_memory_clear(memory, True)
        batch.n_tokens = count * n_prompt
        for s in range(count):
            for p in range(n_prompt):
                i = s * n_prompt + p
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tokens[p], p, 1
                batch.seq_id[i][0], batch.logits[i] = s, 1
        run = llama_cpp.llama_encode if encoder_only else llama_cpp.llama_decode
        if run(ctx, batch) != 0:
            raise SystemExit("llama.cpp could not embed")
        for s in range(count):
            pointer = llama_cpp.llama_get_embeddings_seq(ctx, s) or llama_cpp.llama_get_embeddings_ith(ctx, -1)
            if not pointer or not np.isfinite(np.ctypeslib.as_array(pointer, shape=(n_embd,))).all():
                raise SystemExit("llama.cpp gave no finite embedding")
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return f"embedded 1 and {n_seqs} texts with {threads} threads"


if __name__ == "__main__":
    threads_arg = int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 1
    print(_decode_check(sys.argv[1], threads_arg, sys.argv[3] if len(sys.argv) > 3 else "generate"), flush=True)
