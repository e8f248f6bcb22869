"""Screens over the dashboard: the `?` help and the confirmation of an action."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = (
    ("?", "this help (esc or ? closes it)"),
    ("↑ ↓ PgUp PgDn", "select a request"),
    ("/", "filter requests by id, model, class or state (enter keeps it, esc clears it)"),
    ("s  S", "sort by the next / previous column (or click a column's header)"),
    ("r", "reverse the sort order"),
    ("c", "cancel the selected request (asks first)"),
    ("m", "show the next model in the priority panel (▶)"),
    ("u", "unload the ▶ model (asks first)"),
    ("p", "pause the view (the charts keep recording)"),
    ("q", "quit"),
)
FIGURES = (
    ("TTFT", "time to first token: from submission to the first generated token"),
    ("wait", "queue wait: from submission to the first engine step that computes the request"),
    ("ITL", "inter-token latency: between two tokens of one request"),
    ("p50 p95", "over the last minute, per priority class; a dash: nothing measured"),
    ("Tok/s", "a request's decode rate since its first token (a dash until it has a few)"),
    ("layers", "layers offloaded to the GPU / all layers"),
    ("KV use", "KV cache cells in use; prefix hit: prompt tokens reused from the cache"),
    ("unloads", "when keep-alive unloads an idle model (in use: not idle)"),
)


def _two_columns(title: str, rows: tuple[tuple[str, str], ...]) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 1), title=title, title_justify="left", title_style="bold")
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, what in rows:
        table.add_row(key, what)
    return table


class HelpScreen(ModalScreen[None]):
    """The keys, and what the figures mean."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Vertical {
        width: 100;
        max-width: 100%;
        height: auto;
        max-height: 100%;
        border: round $accent;
        background: $panel;
        padding: 0 1;
        overflow-y: auto;
    }
    """
    BINDINGS = [
        Binding("escape,question_mark,q", "dismiss", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "localserve top · help"
            yield Static(_two_columns("Keys", KEYS))
            yield Static(_two_columns("Figures", FIGURES))


class ConfirmScreen(ModalScreen[bool]):
    """Asks once: y or enter confirms, n or esc declines."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Static {
        width: 72;
        max-width: 100%;
        height: auto;
        border: round $warning;
        background: $panel;
        padding: 0 1;
    }
    """
    BINDINGS = [
        Binding("y,enter", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: Text | str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        text = Text.assemble(self.question, "\n\n", ("y", "bold"), " yes   ", ("n", "bold"), " / esc no")
        yield Static(text)

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
