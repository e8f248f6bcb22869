"""`localserve convert MODEL`: convert a model once into the model store,
with a progress display (the server also converts on first load, silently)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from localserve.cli.progress import ProgressLine, bar


def add_convert_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert an embeddings model to GGUF, ONNX or OpenVINO IR into the model store (no torch needed)",
        description="Convert a sentence-transformers BERT folder (a built-in ID such as all-minilm-l6-v2, "
        "a PATH, or ID=PATH) to a llama.cpp GGUF, an ONNX graph or OpenVINO IR in the model store "
        "($LOCALSERVE_HOME/models, else the user data directory). `serve` does this on first load; run it ahead "
        "to see progress. Prints the converted file's path.",
    )
    parser.add_argument(
        "model", metavar="MODEL", help="a built-in ID, a PATH to a sentence-transformers folder, or ID=PATH"
    )
    parser.add_argument(
        "--format",
        dest="out_format",
        choices=("gguf", "onnx", "openvino"),
        default="gguf",
        help="gguf (llama.cpp, what `serve` uses for a built-in ID), onnx (ONNX Runtime; serve it "
        "with --model ID=PATH.onnx) or openvino (OpenVINO IR; serve it with --model ID=PATH.xml, or use the "
        "catalog id all-minilm-l6-v2-openvino) (default: gguf)",
    )
    parser.add_argument(
        "--graph",
        choices=("fused", "int8", "plain"),
        default=None,
        help="ONNX graph: fused (ONNX Runtime's fused operators, float32), int8 (the same with int8 "
        "projections, activations quantized per token) or "
        "plain (standard operators only) (default: the catalog entry's variant, else fused)",
    )
    parser.add_argument(
        "--type", dest="out_type", choices=("f32", "f16"), default="f32", help="GGUF weight type (default: f32)"
    )
    parser.add_argument("--force", action="store_true", help="convert again even if the store has an up-to-date copy")
    parser.set_defaults(handler=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from localserve.errors import InvalidRequestError
    from localserve.models.convert.cache import cached_gguf
    from localserve.models.kinds import ModelKind
    from localserve.models.oneshot import oneshot_kind
    from localserve.models.registry import resolve

    spec = resolve(args.model)
    if oneshot_kind(spec.labels) != ModelKind.EMBEDDINGS or not spec.path.is_dir():
        raise InvalidRequestError(
            f"nothing to convert: {args.model!r} ({spec.path}) is served as it is; "
            "`convert` turns sentence-transformers folders into GGUF, ONNX or OpenVINO IR"
        )
    started = time.monotonic()
    progress = ConversionProgress(f"converting {spec.model_id}", sys.stderr)
    if args.out_format == "onnx":
        from localserve.models.catalog import catalog_variant
        from localserve.models.convert.bert_onnx import cached_onnx

        variant = args.graph or catalog_variant(spec.model_id) or "fused"
        path = cached_onnx(spec.path, spec.model_id, variant=variant, force=args.force, progress=progress)
    elif args.out_format == "openvino":
        from localserve.models.convert.bert_openvino import cached_openvino_embeddings

        path = cached_openvino_embeddings(spec.path, spec.model_id, force=args.force, progress=progress)
    else:
        path = cached_gguf(spec.path, spec.model_id, out_type=args.out_type, force=args.force, progress=progress)
    progress.report(path, time.monotonic() - started)
    print(path)
    return 0


class ConversionProgress(ProgressLine):
    """`label [#####-----] 12/101 blk.1.attn_q.weight` (cli/progress.py)."""

    def __init__(self, label: str, out: TextIO) -> None:
        super().__init__(out)
        self.label = label
        self.called = False

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.called = True
        fraction = done / max(1, total)
        self.show("", 1.0 if stage == "done" else fraction, f"{self.label} {bar(fraction)} {done}/{total} {stage}")

    def report(self, path: Path, seconds: float) -> None:
        """The last line: converted (or already so) and the size."""
        self.finish()
        weights = path.with_suffix(".bin") if path.suffix == ".xml" else path  # OpenVINO IR: weights in the .bin
        size = (path.stat().st_size + (weights.stat().st_size if weights != path else 0)) / 1e6
        note = f"converted in {seconds:.1f} s" if self.called else "already converted"
        self.out.write(f"{self.label.replace('converting', 'model')}: {note}, {size:.0f} MB\n")
        self.out.flush()
