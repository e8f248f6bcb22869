"""`localserve devices`: what each backend can run on, here and now, under the
names `--device` takes (backends/device_names.py); a server shows the same
under `devices` in /api/v1/stats."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_devices_command(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "devices",
        help="list the devices each backend sees, under the names --device takes",
        description="Ask each backend what it can run on (the GPUs llama.cpp sees, onnxruntime's execution "
        "providers, OpenVINO's NPU, GPU and CPU, CTranslate2's CUDA devices), listed under the names --device "
        "takes (cpu, gpu:0, npu, cuda, ...), with every name each backend accepts. `--device auto` takes the "
        "first one listed; a device asked for and absent fails the load with this list.",
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
        print(f"{b.backend:<15} {b.version or '-':<10} {devices}")
        for device, what in b.details.items():
            if what:
                print(f"{'':<27} {device}: {what}")
        if b.accepts:
            print(f"{'':<27} --device: {b.accepts}")
        if b.note:
            print(f"{'':<27} note: {b.note}")
    return 0


def _jsonable(found: Any) -> dict[str, Any]:
    from localserve.backends.devices import _as_dict

    return _as_dict(found)
