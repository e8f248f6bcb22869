"""`localserve export MODEL --to onnx|openvino`: export an LLM once for the
ONNX Runtime or OpenVINO backend, with a progress display."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def add_export_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export an LLM (GGUF or Hugging Face folder) to ONNX or OpenVINO IR (needs the convert extra)",
        description="Export a chat model (a built-in ID such as smollm2-135m-instruct, a .gguf PATH, a Hugging "
        "Face model folder, or ID=PATH) for the onnx or openvino backend, into the model store "
        "($LOCALSERVE_HOME/models, else the user data directory). A GGUF is dequantized to float32. "
        "Needs torch, transformers, optimum-onnx and openvino (pip install 'localserve[convert]'). "
        "Prints each exported folder; serve it with `localserve serve --model ID=FOLDER`.",
    )
    parser.add_argument("model", metavar="MODEL", help="a built-in ID, a .gguf PATH, a model folder, or ID=PATH")
    parser.add_argument(
        "--to",
        dest="formats",
        choices=("onnx", "openvino", "both"),
        default="both",
        help="the backend to export for (default: both)",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "fp16"),
        default="fp32",
        help="weights: fp32, or fp16 (OpenVINO only; halves the files, the device computes as it likes; default: fp32)",
    )
    parser.add_argument("--output", type=Path, default=None, help="store folder (default: the model store)")
    parser.add_argument("--force", action="store_true", help="export again even if the store has an up-to-date copy")
    parser.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from localserve.cli.convert import ConversionProgress
    from localserve.models.convert.export import FORMATS, export_model
    from localserve.models.registry import resolve

    spec = resolve(args.model)
    formats = FORMATS if args.formats == "both" else (args.formats,)
    progress = ConversionProgress(f"exporting {spec.model_id}", sys.stderr)
    started = time.monotonic()
    paths = export_model(
        spec.path,
        spec.model_id,
        formats,
        precision=args.precision,
        store=args.output,
        force=args.force,
        progress=progress,
    )
    progress.finish()
    note = f"exported in {time.monotonic() - started:.0f} s" if progress.called else "already exported"
    sys.stderr.write(f"model {spec.model_id}: {note}\n")
    for fmt in formats:
        print(f"{fmt}\t{paths[fmt]}")
    return 0
