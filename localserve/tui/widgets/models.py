"""The loaded models, like `ollama ps`: memory, context and slots, device
and offloaded layers, KV use, activity and when keep-alive unloads them."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.widget import Widget

from localserve.tui.fmt import DASH, fmt_mib, fmt_rate
from localserve.tui.models_view import ModelView, OneShotView
from localserve.tui.snapshot import Snapshot
from localserve.tui.widgets.tables import Col, make_table

COLUMNS = (
    Col("model", flexible=True),
    Col("backend", shows_from=100),
    Col("device"),
    Col("layers", numeric=True),  # offloaded to the GPU / all
    Col("threads", numeric=True),  # CPU threads in use (of the most, when fewer)
    Col("weights", numeric=True),
    Col("KV", numeric=True),
    Col("ctx×slots", numeric=True),
    Col("KV use", numeric=True),
    Col("prefix hit", numeric=True, shows_from=185),
    Col("disk hits", numeric=True, shows_from=185),  # prefixes restored from the prefix cache's disk tier
    Col("drafts kept", numeric=True, shows_from=185),  # speculative decoding: accepted / drafted
    Col("avg batch", numeric=True, shows_from=185),
    Col("busy", numeric=True, shows_from=185),
    Col("activity", shows_from=150),
    Col("unloads"),
)


def kv_style(fraction: float) -> str:
    return "red" if fraction >= 0.9 else "yellow" if fraction >= 0.7 else "green"


class ModelsPanel(Widget):
    """One row per loaded model (generative, then embeddings and speech);
    ▶ marks the model the priority panel shows and `u` unloads."""

    DEFAULT_CSS = """
    ModelsPanel {
        height: auto;
        border: round $primary;
        border-title-color: $text;
        padding: 0 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.snapshot: Snapshot | None = None
        self.focused_model = ""
        self.border_title = "models"

    def show(self, snapshot: Snapshot, focused_model: str) -> None:
        self.snapshot, self.focused_model = snapshot, focused_model
        title = f"models: {len(snapshot.models) + len(snapshot.one_shot)}"
        fewer = [m for m in snapshot.models if 0 < m.threads < m.max_threads]
        if fewer:  # in the title, not a line of its own: the request table keeps its rows
            title += " · " + _threads_note(fewer[0])
        self.border_title = title
        self.refresh(layout=True)

    def render(self) -> RenderableType:
        snap = self.snapshot
        if snap is None:
            return Text("waiting for the server …", style="dim")
        rows = [self._generative(m) for m in snap.models] + [self._one_shot(m) for m in snap.one_shot]
        notes = [Text(f"◌ {name} loading …", style="yellow") for name in snap.loading]
        notes += [Text(f"✖ {name}: {why}", style="red") for name, why in snap.load_errors.items()]
        if not rows:
            return Group(*notes) if notes else Text("no model loaded", style="dim")
        table = make_table(COLUMNS, rows, self.content_size.width)
        return Group(table, *notes) if notes else table

    def _generative(self, m: ModelView) -> list[Text | str]:
        kv = m.kv_used / m.kv_size if m.kv_size else 0.0
        name = Text("▶ " if m.model_id == self.focused_model else "  ", style="bold yellow")
        name.append(m.model_id, style="bold green")
        layers = f"{m.n_gpu_layers}/{m.n_layers}" if m.n_layers else DASH
        activity = f"{m.num_running} run {m.num_waiting} queued · {fmt_rate(m.decode_tokens_per_s)} tok/s"
        return [
            name,
            Text(m.backend, style="magenta"),
            Text(m.device, style="magenta"),
            layers,
            _threads_cell(m),
            fmt_mib(m.weights_mib),
            fmt_mib(m.kv_mib),
            f"{m.n_ctx}×{m.num_slots}",
            Text(f"{kv:.0%}", style=kv_style(kv)),
            f"{m.prefix_cache_hit_rate:.0%}",
            str(m.prefix_disk_hits) if m.prefix_disk_hits is not None else DASH,
            f"{m.spec_accepted_tokens / m.spec_draft_tokens:.0%}" if m.spec_draft_tokens else DASH,
            f"{m.mean_batch_size:.1f}",
            f"{m.busy_fraction:.0%}",
            activity,
            m.keep_alive.describe(),
        ]

    def _one_shot(self, m: OneShotView) -> list[Text | str]:
        activity = f"{m.in_flight} run {m.queue_items} queued · {fmt_rate(m.items_per_s)} items/s"
        return [
            Text("  " + m.model_id, style="bold blue"),
            Text(m.kind or "one-shot", style="magenta"),
            DASH,
            DASH,
            DASH,
            DASH,
            DASH,
            DASH,
            DASH,
            DASH,
            DASH,
            DASH,
            f"{m.mean_batch_size:.1f}",
            f"{m.busy_fraction:.0%}",
            f"{activity} · padding {m.padding_ratio:.0%}",
            m.keep_alive.describe(),
        ]


def _threads_cell(m: ModelView) -> Text | str:
    if not m.threads:
        return DASH
    if m.threads < m.max_threads:
        return Text(f"{m.threads}/{m.max_threads}", style="yellow")
    return str(m.threads)


def _threads_note(m: ModelView) -> str:
    """Why a model computes on fewer threads than it could."""
    return (
        f"CPU busy elsewhere ({m.cpu_busy_elsewhere:.1f} cores): {m.model_id} runs on "
        f"{m.threads} of {m.max_threads} threads"
    )
