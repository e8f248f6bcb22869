"""`localserve devices`: what each backend can run on, here and now (what
`--device` can pick; a server shows the same under `devices` in /api/v1/stats)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_devices_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "devices",
        help="list the devices each backend sees (llama.cpp, onnxruntime, OpenVINO)",
        description="Ask each backend what it can run on: llama.cpp's GPU offload support, onnxruntime's "
        "execution providers, OpenVINO's available devices (NPU, GPU, CPU) with their names. `--device auto` "
        "takes the first one listed; a device asked for and absent fails the load with this list.",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=cmd_devices)


def cmd_devices(args: argparse.Namespace) -> int:
    from localserve.backends.devices import discover

    found = discover()
    if args.json:
        print(json.dumps({"backends": [_jsonable(b) for b in found]}, indent=2))
        return 0
    for b in found:
        devices = ", ".join(b.devices) if b.available else "-"
        print(f"{b.backend:<10} {b.version or '-':<12} {devices}")
        for device, what in b.details.items():
            if what:
                print(f"{'':<10} {'':<12}   {device}: {what}")
        if b.note:
            print(f"{'':<10} {'':<12}   note: {b.note}")
    return 0


def _jsonable(found: Any) -> dict[str, Any]:
    from localserve.backends.devices import _as_dict

    return _as_dict(found)
