"""A terminal console whose tables never cut a number.

rich fits a table to the terminal (80 columns when the output is a pipe) by wrapping and
then truncating every column, so a time can print as ``182,776…``. Tables printed through
:func:`console` keep each number whole: a column's numbers set its minimum width, text
columns wrap (a word too long folds), and a table that cannot fit that way prints at its
natural width, wider than the terminal, rather than cut.

>>> from rich.table import Table
>>> t = Table("implementation", "executions", "time", "HBM traffic", "vs fused", "published", "ratio")
>>> t.add_row("compiled (cpu)", "-", "182,776,123.4 us", "-", "0.22x", "-", "-")
>>> out = console(width=40, file=io.StringIO(), color_system=None)
>>> out.print(t)
>>> "182,776,123.4 us" in out.file.getvalue() and "…" not in out.file.getvalue()
True
"""

from __future__ import annotations

import io  # noqa: F401 - the doctest's
import re

from rich.console import Console, Group
from rich.measure import Measurement
from rich.protocol import rich_cast
from rich.table import Table
from rich.text import Text

__all__ = ["console", "keep_numbers_whole"]

# a cell that is a number: digits with separators, an optional sign, exponent and unit
# ("1,044,917.3 us", "0.98x", "-12.5%", "3.1e+05 B/s", "7")
_NUMBER = re.compile(r"[-+~<>≈]?\s?\$?[\d,]*\.?\d+(?:[eE][-+]?\d+)?\s?[A-Za-zµ/%]{0,6}")


def _plain(cell) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        try:
            return Text.from_markup(cell).plain
        except Exception:  # noqa: BLE001 - not markup: the text itself
            return cell
    return ""


def keep_numbers_whole(table: Table) -> Table:
    """Give each column of ``table`` at least the width of its widest number; returns ``table``."""
    for column in table.columns:
        widths = [len(text) for text in map(_plain, column.cells) if _NUMBER.fullmatch(text.strip())]
        if widths:  # a numbers column: never narrower than its widest number, never wrapped
            column.min_width = max(column.min_width or 0, max(widths))
            column.no_wrap = True
        elif column.overflow == "ellipsis":  # a text column: a word too long for it folds
            column.overflow = "fold"
    return table


def _tables(renderable) -> list[Table]:
    renderable = rich_cast(renderable)
    if isinstance(renderable, Table):
        return [renderable]
    if isinstance(renderable, Group):
        return [t for r in renderable.renderables for t in _tables(r)]
    return []


_FOLDED = 8  # the narrowest a text column is made (its long words fold)


def _narrowest(console: Console, table: Table) -> int:
    """The width ``table`` needs with every number whole and its text columns folded."""
    options = console.options.update_width(1 << 20)
    total = table._extra_width  # borders and edges
    for column in table.columns:
        m = table._measure_column(console, options, column)  # (padding included)
        total += m.minimum if column.no_wrap else min(m.minimum, _FOLDED + table.padding[1] + table.padding[3])
    return total


class _Console(Console):
    def print(self, *objects, **kwargs) -> None:  # noqa: A003 - rich's name
        tables = [t for o in objects for t in _tables(o)]
        for t in tables:
            keep_numbers_whole(t)
        if all(_narrowest(self, t) <= self.width for t in tables) or kwargs.get("width") is not None:
            super().print(*objects, **kwargs)
            return
        width = self.width  # too narrow even with the text wrapped: the plain layout, wider than the terminal
        unbounded = self.options.update_width(1 << 20)
        self.width = max(Measurement.get(self, unbounded, t).maximum for t in tables)
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = width


def console(**kwargs) -> Console:
    """A ``rich.console.Console`` (same arguments) whose printed tables keep numbers whole."""
    return _Console(**kwargs)
