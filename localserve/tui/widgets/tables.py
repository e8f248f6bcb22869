"""Small read-only tables (rich) whose columns come and go with the width."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.table import Table
from rich.text import Text


@dataclass(frozen=True, slots=True)
class Col:
    header: str
    numeric: bool = False
    shows_from: int = 0  # the table's width (cells) from which the column shows
    flexible: bool = False  # takes the room left, cut with an ellipsis


def make_table(columns: Sequence[Col], rows: Sequence[Sequence[Text | str]], width: int) -> Table:
    """A borderless table of the columns that show at `width` cells, header dimmed."""
    keep = [i for i, col in enumerate(columns) if width >= col.shows_from]
    table = Table(box=None, padding=(0, 1), pad_edge=False, expand=True, show_edge=False, header_style="bold dim")
    for i in keep:
        col = columns[i]
        table.add_column(
            col.header,
            justify="right" if col.numeric else "left",
            no_wrap=True,
            overflow="ellipsis",
            ratio=1 if col.flexible else None,
        )
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table
