"""Trace the adaptive thread count (engine/threads.py) step by step under
another program's load, in one process: the engine on SmolLM2, `--streams`
closed-loop greedy streams, and a neighbour process that spins throughout
(busy) or `--burst` seconds on and off (bursty).

    .venv/bin/python bench/threads_trace.py [--condition bursty] [--streams 8] [--seconds 24]

Prints tok/s over the run, the tokens made while the neighbour spun and
while it idled, and every switch of the count with the time since the
neighbour's last change (how long each transition took); `--steps` prints
every step (time, threads, measured and predicted ms, the CPU reading), and
`--json` writes them all. This is how facd1f0 found that a burst's end
waited 0.4-0.6 s on one thread: the CPU reading was taken only at a
window's end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.busy_desktop import BURST, SPIN  # noqa: E402
from localserve.backends.llamacpp.backend import LlamaCppBackend, LlamaCppConfig  # noqa: E402
from localserve.engine import threads as threads_module  # noqa: E402
from localserve.engine.engine import Engine, EngineConfig  # noqa: E402
from localserve.engine.types import GenerateRequest, SamplingParams  # noqa: E402
from localserve.models.registry import resolve  # noqa: E402

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. "
WARM_S = 6.0  # steps before the trace: the step-time model must be trusted (worker.TRUSTED_AFTER_STEPS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--condition", choices=("quiet", "busy", "bursty"), default="bursty", help="the neighbour (default: bursty)")
    add("--burst", default="2,2", help="bursty: seconds on, seconds off (default: 2,2)")
    add("--streams", type=int, default=8, help="closed-loop streams of 128 tokens (default: 8)")
    add("--seconds", type=float, default=24.0, help="length of the trace (default: 24)")
    add("--threads", type=int, default=2, help="the most threads (default: 2)")
    add("--fixed", action="store_true", help="keep --threads fixed (the baseline the chooser must beat)")
    add("--steps", action="store_true", help="print every step")
    add("--json", type=Path, default=None, help="write the steps and token times here")
    return parser.parse_args(argv)


def neighbour_code(condition: str, on_s: float, off_s: float) -> str | None:
    return {"quiet": None, "busy": SPIN, "bursty": BURST.format(on=on_s, off=off_s)}[condition]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    on_s, off_s = (float(x) for x in args.burst.split(","))
    steps: list[tuple[float, int, float, float, float, int]] = []
    observe = threads_module.ThreadChooser.observe

    def traced(chooser: threads_module.ThreadChooser, measured_s: float, predicted_s: float) -> int:
        before = chooser.threads
        after = observe(chooser, measured_s, predicted_s)
        steps.append((time.monotonic(), before, measured_s, predicted_s, chooser.last_busy_elsewhere, after))
        return after

    threads_module.ThreadChooser.observe = traced  # type: ignore[method-assign]
    path = str(resolve("smollm2-135m-instruct").path)
    config = LlamaCppConfig(model_path=path, n_ctx=1024, num_slots=16, n_threads=args.threads)
    with ThreadPoolExecutor(1) as pool:  # loaded off the main thread, as the server does (engine_bench.in_own_thread)
        backend = pool.submit(LlamaCppBackend, config).result()
    tokenizer = backend.tokenizer()
    stamps: list[float] = []

    async def run() -> float:
        engine = Engine(EngineConfig(adaptive_threads=not args.fixed))
        engine.add_model("m", backend)
        params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)

        async def client(index: int, until: float) -> None:
            n = 0
            while time.monotonic() < until:
                ids = tokenizer.encode(f"{index} {n}: " + PROMPT * 3, add_special=False)
                async for event in engine.submit("m", GenerateRequest(f"t{index}-{n}", ids, params)):
                    stamps.extend([time.monotonic()] * len(event.token_ids))
                n += 1

        await asyncio.gather(*(client(i, time.monotonic() + WARM_S) for i in range(args.streams)))
        stamps.clear()
        steps.clear()
        code = neighbour_code(args.condition, on_s, off_s)
        proc = subprocess.Popen([sys.executable, "-c", code]) if code else None
        started = time.monotonic()
        try:
            await asyncio.gather(*(client(i, started + args.seconds) for i in range(args.streams)))
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
        await engine.unload_model("m", close_backend=False)
        return started

    started = asyncio.run(run())
    backend.close()
    cycle = on_s + off_s

    def spinning(t: float) -> bool:
        return args.condition == "busy" or (args.condition == "bursty" and (t - started) % cycle < on_s)

    window = [t for t in stamps if started + 1.0 <= t < started + args.seconds - 1.0]
    span = args.seconds - 2.0
    on = sum(1 for t in window if spinning(t))
    mode = "fixed" if args.fixed else "auto"
    print(f"{args.condition}, {args.streams} streams, --threads {args.threads} {mode}: {len(window) / span:.1f} tok/s")
    print(f"  tokens while the neighbour spun: {on}; while it idled: {len(window) - on}")
    print("  switches (seconds since the neighbour's last change, at the end of the step that decided):")
    for t, before, measured, predicted, busy, after in steps:
        if after != before:
            since = (t - started) % cycle if args.condition == "bursty" else t - started
            if args.condition == "bursty" and since >= on_s:
                since -= on_s
            print(
                f"    {t - started:7.2f} s: {before} -> {after} threads, {since:.2f} s after the change, reading {busy:.2f}"
            )
        if args.steps:
            print(
                f"    {t - started:7.3f} {'spin' if spinning(t) else 'idle'} {before}->{after} "
                f"{measured * 1e3:7.1f} ms (predicted {predicted * 1e3:6.1f}) reading {busy:.2f}"
            )
    if args.json is not None:
        out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "started": started}
        out |= {"steps": steps, "token_times": stamps}
        args.json.write_text(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
