"""How the course shows tables and text: one home for the width and the look of every table.

A `Table` is columns and rows. Jupyter shows it as an HTML table (no index, numbers
right-aligned, units in the header); a terminal, `print` and the `course` command get plain text of at
most WIDTH characters a line: columns fitted to their contents, long names (recipes) wrapped onto more
lines, and, when even that cannot fit, one block per row. `to_frame()` gives the numbers as a pandas
DataFrame to work with.

    Table([Column("recipe", wrap=True), Column("peak", "MiB", ".1f")], [("baseline", 304.3)], title="...")

`wrap` and `say` keep prose within WIDTH too (about 118 characters fit a JupyterLab output at 1366 px).
"""

from __future__ import annotations

import html
import math
import re
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

WIDTH = 100  # the most characters in any line of text the course prints
GAP = 2  # spaces between two columns of a text table
MIN_WRAPPED = 12  # a wrapped column is never made narrower than this (or its longest word, up to 20)
NOTE = "note"  # the column that holds a row's note (skipped, does not fit) in the HTML and the DataFrame

# a list item's marker: its continuation lines hang under the text after it
_MARKER = re.compile(r"^(\s*)((?:[-*\u2022]|\d+\.|\[[ x]\]|\( \))(?: [A-Z]\.)? )")


# ---------------------------------------------------------------------------------------------
# prose
# ---------------------------------------------------------------------------------------------
def wrap(text: str, width: int = WIDTH, indent: str | None = None) -> str:
    """`text` with every line longer than `width` wrapped at spaces; shorter lines are kept as they are.
    A wrapped line's continuation is indented 2 more than the line, or, for a list item ("- ", "1. ",
    "[x] ", "( ) A. "), hangs under the item's text; `indent`, when given, is the continuation's indent."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        marker = _MARKER.match(line)
        lead = re.match(r"\s*", line).group(0)
        hang = indent if indent is not None else " " * len(marker.group(0)) if marker else lead + "  "
        out += textwrap.wrap(line, width, subsequent_indent=hang, break_on_hyphens=False) or [line[:width]]
    return "\n".join(out)


def wrap_parts(parts: Iterable[str], sep: str = ", ", width: int = WIDTH, first: str = "", hang: str = "  ") -> str:
    """Pieces joined by `sep` and packed into lines of at most `width`, breaking only between pieces (a piece
    longer than a line is wrapped at its spaces): for lists like versions, where a break inside one reads badly.
    `first` starts the first line; the other lines start with `hang`."""
    lines, line = [], first
    parts = list(parts)
    for i, part in enumerate(parts):
        piece = part + (sep.rstrip() if i < len(parts) - 1 else "")
        if line.strip() and len(line) + len(piece) > width:
            lines.append(line.rstrip())
            line = hang
        if len(line) + len(piece) > width:  # too long for a line of its own: wrap it at its spaces
            wrapped = textwrap.wrap(piece, width, initial_indent=line, subsequent_indent=hang, break_on_hyphens=False)
            lines += wrapped[:-1]
            line = wrapped[-1] + " "
        else:
            line += piece + " "
    lines.append(line.rstrip())
    return "\n".join(lines)


def common_parts(names: Sequence[str], sep: str = ", ") -> tuple[list[str], list[str]]:
    """(the parts every name has, each name without them): "a, b, c" and "a, b, d" give (["a", "b"], ["c", "d"]),
    so a table can say once what all its recipes share. Fewer than two names: nothing is shared."""
    split = [n.split(sep) for n in names]
    if len(split) < 2:
        return [], list(names)
    shared = [p for p in split[0] if all(p in s for s in split[1:])]
    return shared, [sep.join(p for p in s if p not in shared) or "-" for s in split]


def say(*parts: Any, width: int = WIDTH) -> None:
    """print() for a notebook's prose: the parts joined by spaces, wrapped at `width` (see wrap)."""
    print(wrap(" ".join(str(p) for p in parts), width))


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """One column: its name, the unit of its numbers, how numbers are written, and how it is laid out.

    name: the full name (HTML, DataFrame); short: the name in the text form, when shorter there ("\\n"
    splits it over header lines). fmt: a format spec for numbers (".1f", ",.0f"); a column with one is
    right-aligned unless `align` says otherwise. wrap: text that may wrap onto more lines (recipe names).
    """

    name: str
    unit: str = ""
    fmt: str = ""
    short: str = ""
    wrap: bool = False
    align: str = ""  # "left" or "right"; "" : right when fmt is set

    @property
    def right(self) -> bool:
        """True when the column is right-aligned (numbers)."""
        return self.align == "right" or (not self.align and bool(self.fmt))

    @property
    def label(self) -> str:
        """The name with its unit, as the HTML header and the DataFrame show it."""
        return f"{self.name} ({self.unit})" if self.unit else self.name

    def header(self) -> tuple[list[str], str]:
        """The text form's header: the lines of the short (or full) name, and what goes on the units' line:
        the unit in brackets, or a bracketed last line of `short` ("loss\n(final)")."""
        names = (self.short or self.name).split("\n")
        if not self.unit and len(names) > 1 and names[-1].startswith("("):
            return names[:-1], names[-1]
        return names, f"({self.unit})" if self.unit else ""

    def cell(self, value: Any) -> str:
        """One value as text: numbers by `fmt`, None and NaN as '-', a Flagged value with its mark."""
        if isinstance(value, Flagged):
            return self.cell(value.value) + value.mark
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return "-"
        if self.fmt and isinstance(value, (int, float)) and not isinstance(value, bool):
            return format(value, self.fmt)
        return str(value)


class Note(str):
    """A row's last cell that stands for all the columns after it: why the row has no numbers."""


@dataclass(frozen=True)
class Flagged:
    """A value shown with a mark after it ("1234*"); the table's notes say what the mark means."""

    value: Any
    mark: str = "*"


class TableError(ValueError):
    """A table whose rows do not match its columns; the message names the row."""


class Table:
    """Columns and rows, with an optional title (above) and notes (below), shown as HTML in Jupyter and as
    text of at most `width` characters elsewhere (str, print). A row is one value per column, or fewer
    values ending in a Note, which fills the rest of the row."""

    def __init__(self, columns: Sequence[Column | str], rows: Iterable[Sequence[Any]], title: str = "",
                 notes: Sequence[str] = (), width: int = WIDTH):
        self.columns = [c if isinstance(c, Column) else Column(c) for c in columns]
        self.rows = [list(r) for r in rows]
        self.title, self.notes, self.width = title, list(notes), width
        for i, row in enumerate(self.rows):
            short = len(row) < len(self.columns) and row and isinstance(row[-1], Note)
            if len(row) != len(self.columns) and not short:
                raise TableError(f"row {i} ({row[:1]}) has {len(row)} values for {len(self.columns)} columns "
                                 f"({', '.join(c.name for c in self.columns)}); end a shorter row with a Note")

    def __repr__(self) -> str:
        return f"<Table {self.title.splitlines()[0] if self.title else ''!r}: {len(self.rows)} rows>"

    def __str__(self) -> str:
        return self.text()

    def _repr_pretty_(self, p, cycle: bool) -> None:
        """IPython's text/plain: the text form."""
        p.text(self.text())

    # --- text ---------------------------------------------------------------------------------
    def text(self) -> str:
        """The table as plain text, no line over `width`: title, header, rows, notes."""
        body = self._grid() if self.rows else []
        if body is None:
            body = self._stacked()
        parts = [wrap(self.title, self.width, indent="")] + ([""] if body else []) if self.title else []
        parts += body
        parts += [wrap(n, self.width) for n in self.notes]
        return "\n".join(parts)

    def _cells(self, row: list) -> list[str]:
        """A row's values as text (a Note is the last one)."""
        return [c.cell(v) if not isinstance(v, Note) else str(v) for c, v in zip(self.columns, row)]

    def _widths(self) -> list[int] | None:
        """Column widths that fit `width` (wrapped columns narrowed, widest first), or None when none do."""
        widths = []
        for k, col in enumerate(self.columns):
            names, unit = col.header()
            texts = names + [unit] + self._column_texts(k)
            widths.append(max(len(t) for t in texts))
        floor = [max(MIN_WRAPPED, min(20, max([len(w) for t in self._column_texts(k) for w in t.split()] or [0])))
                 if c.wrap else widths[k] for k, c in enumerate(self.columns)]
        while sum(widths) + GAP * (len(widths) - 1) > self.width:
            shrinkable = [k for k, c in enumerate(self.columns) if c.wrap and widths[k] > floor[k]]
            if not shrinkable:
                return None
            widest = max(shrinkable, key=lambda k: widths[k])
            widths[widest] -= 1
        return widths

    def _column_texts(self, k: int) -> list[str]:
        return [self._cells(r)[k] for r in self.rows if k < len(r) and not isinstance(r[k], Note)]

    def _grid(self) -> list[str] | None:
        """Header and rows in fitted columns, or None when the columns cannot fit (then: stacked)."""
        widths = self._widths()
        if widths is None:
            return None
        names = [self._lines(c.header()[0], w, c.wrap) for c, w in zip(self.columns, widths)]
        height = max(len(n) for n in names)
        heads = [[""] * (height - len(n)) + n for n in names]  # names bottom-aligned, over the units' line
        if any(c.header()[1] for c in self.columns):
            heads = [h + [c.header()[1]] for h, c in zip(heads, self.columns)]
        lines = [self._join([h[i] for h in heads], widths) for i in range(len(heads[0]))]
        for row in self.rows:
            lines += self._row(row, widths)
        return lines

    @staticmethod
    def _lines(texts: list[str], width: int, wrapped: bool) -> list[str]:
        """Header or cell text as lines of at most `width` (wrapped columns only; others already fit). A cell's
        continuation lines are indented by 2, so a row's first line is the one that starts at the margin."""
        if not wrapped:
            return texts
        return [line for t in texts for line in (textwrap.wrap(t, width, break_on_hyphens=False,
                                                               subsequent_indent=t[:len(t) - len(t.lstrip())] + "  ")
                                                 or [""])]

    def _join(self, cells: list[str], widths: list[int]) -> str:
        """One text line of cells, each padded to its column's width and alignment."""
        out = [c.rjust(w) if col.right else c.ljust(w) for c, w, col in zip(cells, widths, self.columns)]
        return (" " * GAP).join(out).rstrip()

    def _row(self, row: list, widths: list[int]) -> list[str]:
        """A row as one or more text lines; a Note runs from its column to the end of the line."""
        cells = self._cells(row)
        note = cells.pop() if isinstance(row[-1], Note) else None
        per = [self._lines([t], w, c.wrap) for t, w, c in zip(cells, widths, self.columns)]
        height = max([len(p) for p in per] or [1])
        lines = [self._join([p[i] if i < len(p) else "" for p in per], widths[:len(per)]) for i in range(height)]
        if note is None:
            return lines
        start = sum(widths[:len(cells)]) + GAP * len(cells)
        if self.width - start < 30:  # too little room beside the name: the note goes under it
            return lines + [wrap("    " + note, self.width)]
        noted = textwrap.wrap(note, self.width - start, break_on_hyphens=False) or [""]
        lines += [""] * (len(noted) - len(lines))
        return [(line.ljust(start) + n).rstrip() for line, n in zip(lines, noted + [""] * len(lines))]

    def _stacked(self) -> list[str]:
        """One block per row: its first value, then 'name value unit' of the others, wrapped."""
        out = []
        for row in self.rows:
            cells = self._cells(row)
            out.append(wrap(cells[0], self.width))
            pairs = [f"{c.name} {t}" + (f" {c.unit}" if c.unit else "") for c, t in zip(self.columns[1:], cells[1:])]
            if isinstance(row[-1], Note):
                pairs[-1] = cells[-1]
            out.append(wrap_parts(pairs, "; ", self.width, first="  ", hang="    "))
        return out

    # --- HTML and pandas ------------------------------------------------------------------------
    def to_frame(self):
        """The table as a pandas DataFrame: one column per table column, labelled with its unit, numbers as
        numbers (None where a row has none), and a 'note' column when a row has a note."""
        import pandas as pd

        noted = any(isinstance(r[-1], Note) for r in self.rows)
        records = []
        for row in self.rows:
            values = [v.value if isinstance(v, Flagged) else v for v in row if not isinstance(v, Note)]
            values += [None] * (len(self.columns) - len(values))
            records.append(values + ([str(row[-1]) if isinstance(row[-1], Note) else ""] if noted else []))
        return pd.DataFrame(records, columns=[c.label for c in self.columns] + ([NOTE] if noted else []))

    def _repr_html_(self) -> str:
        """Jupyter's view: title, an HTML table (values as the text form writes them) and notes. Written here,
        not by pandas' Styler, so that the same table gives the same HTML with any pandas (nbval compares it)."""
        noted = any(isinstance(r[-1], Note) for r in self.rows)
        columns = self.columns + [Column(NOTE, wrap=True)] * noted
        pad = "padding: 2px 8px; vertical-align: top; "

        def style(c: Column, head: bool) -> str:
            if c.right:
                return pad + "text-align: right" + ("" if head else "; white-space: nowrap")
            return pad + "text-align: left" + ("; white-space: normal; min-width: 14em" if c.wrap else
                                               "" if head else "; white-space: nowrap")

        head = "".join(f"<th style='{style(c, True)}'>{html.escape(c.label)}</th>" for c in columns)
        body = []
        for row in self.rows:
            cells = self._cells(row)
            note = cells.pop() if isinstance(row[-1], Note) else ""
            cells += [""] * (len(self.columns) - len(cells)) + ([note] if noted else [])
            body.append("<tr>" + "".join(f"<td style='{style(c, False)}'>{html.escape(str(v))}</td>"
                                         for c, v in zip(columns, cells)) + "</tr>")
        table = (f"<table style='border-collapse: collapse'><thead><tr>{head}</tr></thead>"
                 f"<tbody>{''.join(body)}</tbody></table>")
        title = "".join(f"<p style='margin:4px 0'>{html.escape(t)}</p>" for t in self.title.split("\n") if t)
        notes = "".join(f"<p style='margin:2px 0; font-size:90%'>{html.escape(n)}</p>" for n in self.notes)
        return f"<div class='course-table'>{title}{table}{notes}</div>"
