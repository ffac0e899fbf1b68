"""Tables for notebooks, reports and docs: HTML in Jupyter, aligned text elsewhere, Markdown on request.

Shared by `atlas.notebook` (lessons) and `atlas.research` (evaluation reports), without pandas. Floats carry 3
decimals, so output is deterministic.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: Characters of memory text shown in a table cell.
TEXT_WIDTH = 60


# --- the table ------------------------------------------------------------------------------


def fmt(value: object) -> str:
    """One cell: floats with 3 decimals, None as empty, bools as yes/no."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def truncate(text: str, width: int = TEXT_WIDTH) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 1] + "…"


@dataclass
class Table:
    """Rows under named columns; HTML in Jupyter, aligned text in `str()`/`repr()`, Markdown on request."""

    columns: list[str]
    rows: list[list[object]]
    title: str | None = None
    #: Columns aligned right (numbers); the rest are left-aligned.
    numeric: set[str] = field(default_factory=set)

    def cells(self) -> list[list[str]]:
        return [[fmt(v) for v in row] for row in self.rows]

    def column(self, name: str) -> list[object]:
        at = self.columns.index(name)
        return [row[at] for row in self.rows]

    def __str__(self) -> str:
        cells = self.cells()
        widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(self.columns)]

        def line(values: Sequence[str]) -> str:
            parts = [v.rjust(w) if c in self.numeric else v.ljust(w)
                     for v, w, c in zip(values, widths, self.columns, strict=True)]
            return "  ".join(parts).rstrip()

        out = [self.title] if self.title else []
        out += [line(self.columns), "  ".join("-" * w for w in widths)]
        out += [line(r) for r in cells]
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        def td(tag: str, column: str, value: str) -> str:
            align = ' style="text-align:right"' if column in self.numeric else ' style="text-align:left"'
            return f"<{tag}{align}>{html.escape(value)}</{tag}>"

        head = "".join(td("th", c, c) for c in self.columns)
        body = "".join("<tr>" + "".join(td("td", c, v) for c, v in zip(self.columns, row, strict=True)) + "</tr>"
                       for row in self.cells())
        caption = f"<caption>{html.escape(self.title)}</caption>" if self.title else ""
        return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    def to_markdown(self) -> str:
        def esc(value: str) -> str:
            return value.replace("|", "\\|")

        rows = ["| " + " | ".join(self.columns) + " |",
                "|" + "|".join("---:" if c in self.numeric else "---" for c in self.columns) + "|"]
        rows += ["| " + " | ".join(esc(v) for v in r) + " |" for r in self.cells()]
        return "\n".join(([f"**{self.title}**", ""] if self.title else []) + rows)


def table(rows: Iterable[Mapping[str, object]], *, title: str | None = None,
          numeric: Iterable[str] = ()) -> Table:
    """A `Table` from dicts; columns in first-seen key order."""
    rows = list(rows)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    return Table(columns, [[row.get(c) for c in columns] for row in rows], title, set(numeric))


# --- ids -----------------------------------------------------------------------------------
