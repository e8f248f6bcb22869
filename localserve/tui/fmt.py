"""How the dashboard writes figures: short, fixed-width, and a dash for a
figure that was not measured."""

from __future__ import annotations

DASH = "-"


def fmt_mib(mib: float) -> str:
    """`98 MiB`, `1.4 GiB`; a dash for 0 (not known)."""
    if mib <= 0:
        return DASH
    return f"{mib:.0f} MiB" if mib < 1024 else f"{mib / 1024:.1f} GiB"


def fmt_bytes(num_bytes: float) -> str:
    if num_bytes < 1e6:
        return f"{num_bytes / 1e3:.0f} KB"
    if num_bytes < 1e9:
        return f"{num_bytes / 1e6:.0f} MB"
    return f"{num_bytes / 1e9:.1f} GB"


def fmt_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h04m`, `3d02h`."""
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def fmt_latency(seconds: float | None) -> str:
    """At most 6 cells: `4.2ms`, `420ms`, `1.25s`, `10.5s`, `105s`; a dash for None."""
    if seconds is None:
        return DASH
    if seconds < 0.01:
        return f"{seconds * 1000:.1f}ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 10:
        return f"{seconds:.2f}s"
    return f"{seconds:.1f}s" if seconds < 100 else f"{seconds:.0f}s"


def fmt_rate(per_s: float | None) -> str:
    """`9.5`, `182`, `4373`; a dash for None (too few tokens for a rate)."""
    if per_s is None:
        return DASH
    return f"{per_s:.1f}" if per_s < 100 else f"{per_s:,.0f}"
