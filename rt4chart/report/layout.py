"""Tables that stay readable in narrow terminals and CI logs (80 columns): a table when it fits the
console's width whole, else a list, so no word, name or path is ever split across lines."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

_UNBOUNDED = 1_000_000
"""A console width no table reaches."""


def print_rows(
    console: Console,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
    right: Sequence[str] = (),
) -> None:
    """Print ``rows`` (cells in console markup) under ``headers``: as a table (``right``: the headers
    of right-justified columns) when its natural width fits ``console``, else as a list, each row's
    first cell then ``header: value`` lines, printed unwrapped (a terminal folds a long line itself)."""
    table = Table(title=title, title_justify="left")
    for header in headers:
        table.add_column(header, justify="right" if header in right else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    unbounded = console.options.update_width(_UNBOUNDED)  # the width the table takes when nothing folds
    if Measurement.get(console, unbounded, table).maximum <= console.width:
        console.print(table)
        return
    if title:
        console.print(Text(title, style="italic"), soft_wrap=True)
    for first, *rest in rows:
        console.print(Text.from_markup(first, style="bold"), soft_wrap=True)
        for header, value in zip(headers[1:], rest, strict=True):
            console.print(Text.assemble(f"  {header}: ", Text.from_markup(value)), soft_wrap=True, highlight=False)
