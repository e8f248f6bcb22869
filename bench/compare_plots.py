"""The comparison's plots (matplotlib, PNG): throughput and TTFT p95 against
concurrency, and interactive TTFT under a batch load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLE = {  # server -> (colour, marker)
    "localserve": ("tab:blue", "o"),
    "llama-server": ("tab:orange", "s"),
    "llama_cpp.server": ("tab:green", "^"),
}


def _series(section: dict[str, Any], metric: str) -> tuple[list[float], list[float], list[list[float]]]:
    xs, ys, err = [], [], [[], []]
    for key, values in sorted(section.items(), key=lambda kv: float(kv[0])):
        value, span = values.get(metric), values.get(metric + "_range")
        if value is None:
            continue
        xs.append(float(key))
        ys.append(value)
        low, high = span if span else (value, value)
        err[0].append(max(0.0, value - low))
        err[1].append(max(0.0, high - value))
    return xs, ys, err


def _plot(
    summary: dict[str, Any],
    section: str,
    metric: str,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    path: Path,
    log_x: bool = False,
    log_y: bool = False,
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for name, server in summary["servers"].items():
        xs, ys, err = _series(server[section], metric)
        if not xs:
            continue
        colour, marker = STYLE.get(name, ("tab:gray", "x"))
        ax.errorbar(xs, ys, yerr=err, label=name, color=colour, marker=marker, capsize=3, linewidth=1.6)
    if log_x:
        ax.set_xscale(
            "symlog" if any(float(k) == 0 for s in summary["servers"].values() for k in s[section]) else "log", base=2
        )
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    xticks = sorted({float(k) for s in summary["servers"].values() for k in s[section]})
    ax.set_xticks(xticks, [f"{x:g}" for x in xticks])
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.text(0.99, 0.01, _footnote(summary), ha="right", va="bottom", fontsize=6.5, color="0.4")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def _footnote(summary: dict[str, Any]) -> str:
    meta = summary.get("meta", {})
    work = meta.get("workload", {})
    loads = summary.get("loadavg_all_runs") or []
    load = f"load avg {min(loads):.1f}-{max(loads):.1f}" if loads else ""
    return (
        f"SmolLM2-135M Q4_1, {meta.get('cpu_count')} CPUs, prompt ~{work.get('prompt_tokens')} + "
        f"{work.get('output_tokens')} output tokens, median (bars: range) of "
        f"{max((s['sweep'].get('1', {}).get('num_runs', 0) for s in summary['servers'].values()), default=0)} "
        f"runs, {load}"
    )


def plot_all(summary: dict[str, Any], docs: Path, tag: str) -> list[Path]:
    """Write the three plots; their paths."""

    def name(kind: str) -> Path:
        return docs / (f"bench-{kind}.png" if tag == "smollm2" else f"bench-{tag}-{kind}.png")

    paths = [
        _plot(
            summary,
            "sweep",
            "output_tokens_per_s",
            title="Aggregate output throughput",
            xlabel="concurrent streams",
            ylabel="output tokens/s",
            path=name("throughput"),
            log_x=True,
        ),
        _plot(
            summary,
            "sweep",
            "ttft_p95_ms",
            title="Time to first token, p95",
            xlabel="concurrent streams",
            ylabel="TTFT p95 (ms)",
            path=name("ttft-p95"),
            log_x=True,
            log_y=True,
        ),
    ]
    if any(server["interactive_under_batch"] for server in summary["servers"].values()):
        paths.append(
            _plot(
                summary,
                "interactive_under_batch",
                "ttft_p95_ms",
                title="Interactive TTFT p95 under a batch-priority load",
                xlabel="batch streams (0 = idle)",
                ylabel="interactive TTFT p95 (ms)",
                path=name("interactive-ttft"),
                log_y=True,
            )
        )
    return paths
