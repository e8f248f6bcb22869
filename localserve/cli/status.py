"""`localserve list` (known models, and which a running server has loaded)
and `localserve top` (the live dashboard of a running server)."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from localserve.cli.models import catalog_rows, print_rows
from localserve.config import DEFAULT_URL


def add_server_options(parser: argparse.ArgumentParser, what: str) -> None:
    """--url and --api-key of the running server a command talks to."""
    parser.add_argument(
        "--url", default=None, metavar="URL", help=f"{what} (env LOCALSERVE_URL; default: {DEFAULT_URL})"
    )
    parser.add_argument(
        "--api-key", default=None, metavar="KEY", help="API key of that server (env LOCALSERVE_API_KEY; default: none)"
    )


def server_of(args: argparse.Namespace) -> tuple[str, str | None]:
    """(base URL, API key) from the flags, else the environment, else the defaults."""
    url = (args.url or os.environ.get("LOCALSERVE_URL") or DEFAULT_URL).rstrip("/")
    return url, args.api_key or os.environ.get("LOCALSERVE_API_KEY") or None


def add_list_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "list",
        help="show known models, whether they are on this machine, and which a server has loaded",
        description="List the catalog's models and every model in the Hugging Face cache, Ollama's store and "
        "LM Studio's folder (name, labels, backend, status or source, size, path, and what to install when its "
        "backend is missing) and, when a server answers at --url, which it has loaded.",
    )
    add_server_options(parser, "server to ask")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=cmd_list)


def cmd_list(args: argparse.Namespace) -> int:
    url, api_key = server_of(args)
    rows = catalog_rows()
    loaded, server_note = fetch_loaded(url, api_key)
    for row in rows:
        row["loaded"] = loaded is not None and row["id"] in loaded
        if loaded and loaded.get(row["id"]):
            row["options"] = loaded[row["id"]]  # effective: ctx per slot, slots, GPU layers, KV size
    if args.json:
        ids = None if loaded is None else list(loaded)
        print(json.dumps({"models": rows, "server": url, "loaded": ids, "server_note": server_note}, indent=2))
        return 0
    print_rows(rows, loaded)
    print()
    print(server_note if loaded is None else f"loaded at {url}: {', '.join(loaded) or 'none'}")
    for model_id, options in (loaded or {}).items():
        if options:
            print(f"  {model_id}: {describe_options(options)}")
    return 0


def describe_options(options: Mapping[str, Any]) -> str:
    """`ctx 8192 x 8 slots, GPU layers 0/30, KV 1440 MiB, device CPU` from a load report."""
    layers = f"{options.get('n_gpu_layers', 0)}/{options['n_layers']}" if options.get("n_layers") else "-"
    kv_mib = float(options.get("kv_mib") or 0)
    kv = f", KV {kv_mib:.0f} MiB" if kv_mib >= 10 else f", KV {kv_mib:.1f} MiB" if kv_mib else ""
    return (
        f"ctx {options.get('ctx_per_slot')} x {options.get('parallel')} slots, GPU layers {layers}{kv}, "
        f"device {options.get('device', '?')}"
    )


def fetch_loaded(url: str, api_key: str | None, timeout_s: float = 1.0) -> tuple[dict[str, dict[str, Any]] | None, str]:
    """The models loaded at `url` (every kind; chat only from a server without
    /api/v1/loaded), each with its effective options ({} if not known), or
    None and why not."""
    try:
        for path in ("/api/v1/loaded", "/v1/models"):
            request = urllib.request.Request(f"{url}{path}", headers={"Accept": "application/json"})
            if api_key:
                request.add_header("Authorization", f"Bearer {api_key}")
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    body = json.load(response)
                return {str(item["id"]): dict(item.get("options") or {}) for item in body.get("data", [])}, ""
            except urllib.error.HTTPError as exc:
                if exc.code != 404 or path == "/v1/models":
                    raise
        raise AssertionError("unreachable")
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            return None, f"the server at {url} wants an API key: pass --api-key or set LOCALSERVE_API_KEY"
        return None, f"the server at {url} answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return None, f"no server answering at {url} (start one with `localserve serve`)"


def add_top_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "top",
        help="live dashboard of a running server: models, priority classes, requests",
        description="Watch a server live: its models (memory, context and slots, device, GPU layers, "
        "when keep-alive unloads them), time to first token, queue wait and inter-token latency per "
        "priority class, throughput, requests in flight and batch jobs. Keys: ? help, / filter, "
        "s/S/r sort, c cancel request, m next model, u unload model, p pause, q quit (cancel and "
        "unload ask first). Waits for the server if it is not up yet and reconnects when it restarts; "
        "meanwhile the last data stays on screen, marked stale.",
    )
    add_server_options(parser, "server to watch")
    parser.set_defaults(handler=cmd_top)


def cmd_top(args: argparse.Namespace) -> int:
    from localserve.tui.app import run  # heavy: textual

    run(*server_of(args))
    return 0
