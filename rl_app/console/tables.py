"""Tables that never cut an identifier: optional columns go first when the terminal is narrow,
and output to a file or a pipe is as wide as the table needs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console, JustifyMethod
from rich.table import Table


@dataclass(frozen=True)
class Column:
    name: str
    justify: JustifyMethod = "left"
    optional: bool = False  # dropped, last first, when the table does not fit the terminal


def output_console() -> Console:
    """The terminal's width on a terminal; unlimited in files and pipes (rich would wrap or cut at 80)."""
    return Console(highlight=False, width=None if sys.stdout.isatty() else 1_000)


def warner(console: Console) -> Callable[[str], None]:
    """Prints what it is given as a warning line on ``console``."""
    return lambda text: console.print(f"[yellow]warning:[/yellow] {text}")


def fitted_table(title: str, columns: list[Column], rows: list[list[str]], width: int) -> Table:
    """A table of ``rows`` that fits ``width`` by dropping optional columns; cells fold, never cut."""
    widths = [max([len(column.name), *(len(row[i]) for row in rows)]) for i, column in enumerate(columns)]
    keep = list(range(len(columns)))
    for index in reversed(range(len(columns))):
        if sum(widths[i] + 3 for i in keep) + 1 <= width:
            break
        if columns[index].optional:
            keep.remove(index)
    table = Table(title=title, title_justify="left")
    for i in keep:
        table.add_column(columns[i].name, justify=columns[i].justify, overflow="fold")
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table
