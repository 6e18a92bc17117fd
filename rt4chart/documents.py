"""Documents as input: retrieved documents with ids, and structured values (JSON, tables) rendered
into text a judge can read, one verifiable unit (a field, a cell) at a known place in it.

A sample's ``documents`` is a list of :class:`Document`: ``{"id", "text", "title"?}`` for prose,
``{"id", "data"}`` for a JSON value, ``{"id", "table"}`` for a table (a list of records, or CSV or
Markdown text with ``"format"``). Each becomes one passage of the context (:func:`render_document`):

- a JSON value: one line per leaf, ``path: value`` (``attributes.WiFi: free``), keys in sorted order
  so that equal values render alike whatever their key order (the judge's prompt, and so the cache
  key, is canonical); each line's anchor is the leaf's JSON path (``$.attributes.WiFi``);
- a table: one line per row, ``row 1: name: Mike's | price: $$``, each ``column: value`` a unit
  anchored by its JSON path over the rows (``$[0].price``), its 1-based ``row`` and its ``column``.

Evidence quoted from such a passage names the units it covers (:class:`UnitAnchor`).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator


class UnitAnchor(BaseModel):
    """Where a verifiable unit of a structured document sits in its value."""

    model_config = ConfigDict(frozen=True)

    path: str
    """JSON path of the field or cell (``$.hours.Monday``, ``$[0].price``: rows counted from 0 as JSON
    lists are)."""
    row: int | None = Field(default=None, exclude_if=lambda value: value is None)
    """A table cell's row, counted from 1 as a reader counts data rows (header excluded); ``None`` for a
    JSON field."""
    column: str | None = Field(default=None, exclude_if=lambda value: value is None)
    """A table cell's column name; ``None`` for a JSON field."""


class Unit(BaseModel):
    """One verifiable unit of a rendered document: its place in the document's text and its anchor."""

    start: int
    """Offset of the unit's first character in the rendered document."""
    end: int
    """Offset one past its last character."""
    anchor: UnitAnchor
    """The field or cell it renders."""


def _absent(value: object) -> bool:
    return value is None


TableFormat = Literal["csv", "markdown"]
"""How a table given as text is written."""


class Document(BaseModel):
    """One document of a sample's ``documents``: prose (``text``), a JSON value (``data``) or a table
    (``table``), exactly one of them."""

    model_config = ConfigDict(extra="forbid")

    id: str
    """The document's id: evidence names it, citation markers may cite it."""
    text: str | None = Field(default=None, exclude_if=_absent)
    """The document's text."""
    title: str | None = Field(default=None, exclude_if=_absent)
    """Its title, shown in reports beside its evidence (not part of the verified text)."""
    data: JsonValue = Field(default=None, exclude_if=_absent)
    """A JSON value rendered one leaf per line (see the module's docstring)."""
    table: list[dict[str, JsonValue]] | str | None = Field(default=None, exclude_if=_absent)
    """A table: a list of records (one object per row), or CSV / Markdown text (``format``)."""
    format: TableFormat | None = Field(default=None, exclude_if=_absent)
    """How a ``table`` given as text is written."""

    @model_validator(mode="before")
    @classmethod
    def _id_as_text(cls, data: Any) -> Any:
        # An integer id is as good as its digits (passages named 1, 2, 3 are cited as [1], [2], [3]).
        if isinstance(data, dict) and isinstance(data.get("id"), int) and not isinstance(data.get("id"), bool):
            return {**data, "id": str(data["id"])}
        return data

    @model_validator(mode="after")
    def _one_body(self) -> Document:
        bodies = [name for name in ("text", "data", "table") if getattr(self, name) is not None]
        if len(bodies) != 1:
            raise ValueError(f"give exactly one of text, data, table (got {bodies or 'none'})")
        if isinstance(self.table, str) and self.format is None:
            raise ValueError('a table given as text needs "format": "csv" or "markdown"')
        if self.format is not None and not isinstance(self.table, str):
            raise ValueError('"format" applies only to a table given as text')
        return self


@dataclass(frozen=True)
class RenderedDocument:
    """A document as the judge reads it."""

    text: str
    """The passage's text."""
    units: list[Unit] = field(default_factory=list)
    """Its structured units in text order (none for prose)."""


def render_document(document: Document) -> RenderedDocument:
    """The passage a document becomes, with its units."""
    if document.data is not None:
        return _render([("", [(_field_label(steps) + ": " + _scalar(value), UnitAnchor(path=json_path(steps)))])
                        for steps, value in _leaves(document.data, ())])
    if document.table is not None:
        rows = _table_rows(document)
        return _render([
            (f"row {number}: ", [(f"{column}: {_scalar(value)}",
                                  UnitAnchor(path=json_path((number - 1, column)), row=number, column=column))
                                 for column, value in row.items()])
            for number, row in enumerate(rows, start=1)
        ])
    return RenderedDocument(document.text or "")


UNIT_SEPARATOR = " | "
"""Between the cells of a rendered table row."""


def _render(lines: list[tuple[str, list[tuple[str, UnitAnchor]]]]) -> RenderedDocument:
    """Lines of units, each line a prefix and its units joined by :data:`UNIT_SEPARATOR`."""
    text, units = "", []
    for prefix, cells in lines:
        text += ("\n" if text else "") + prefix
        for position, (cell, anchor) in enumerate(cells):
            text += UNIT_SEPARATOR if position else ""
            units.append(Unit(start=len(text), end=len(text) + len(cell), anchor=anchor))
            text += cell
    return RenderedDocument(text, units)


Key = str | int
"""One step of a JSON path: an object key or a list index."""


def json_path(steps: tuple[Key, ...]) -> str:
    """The JSON path of ``steps`` (``$.hours.Monday``, ``$.reviews[2].text``, ``$["opening hours"]``)."""
    path = "$"
    for step in steps:
        if isinstance(step, int):
            path += f"[{step}]"
        elif _IDENTIFIER.fullmatch(step):
            path += f".{step}"
        else:
            path += f"[{json.dumps(step, ensure_ascii=False)}]"
    return path


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _field_label(steps: tuple[Key, ...]) -> str:
    """A field's name as the judge reads it: its JSON path without the root (``attributes.WiFi``)."""
    return json_path(steps).removeprefix("$").removeprefix(".") or "value"


def _leaves(value: JsonValue, steps: tuple[Key, ...]) -> list[tuple[tuple[Key, ...], JsonValue]]:
    """Every leaf of a JSON value with its steps, objects' keys sorted (the canonical order); an empty
    object or list is a leaf (it states that there is nothing)."""
    if isinstance(value, dict) and value:
        return [leaf for key in sorted(value) for leaf in _leaves(value[key], (*steps, key))]
    if isinstance(value, list) and value:
        return [leaf for index, item in enumerate(value) for leaf in _leaves(item, (*steps, index))]
    return [(steps, value)]


def _scalar(value: JsonValue) -> str:
    """A leaf as the judge reads it: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _table_rows(document: Document) -> list[dict[str, JsonValue]]:
    table = document.table
    if not isinstance(table, str):
        return table or []
    if document.format == "csv":
        cells = [row for row in csv.reader(io.StringIO(table)) if row]
    else:
        cells = _markdown_cells(table)
    if not cells:
        raise ValueError("the table has no header row")
    header = cells[0]
    for number, row in enumerate(cells[1:], start=1):
        if len(row) != len(header):
            raise ValueError(f"table row {number} has {len(row)} cells, its header {len(header)}")
    return [dict(zip(header, row, strict=True)) for row in cells[1:]]


def _markdown_cells(table: str) -> list[list[str]]:
    """A Markdown pipe table's header and rows (its |---| separator row checked and left out)."""
    lines = [line.strip() for line in table.strip().splitlines() if line.strip()]
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    if len(cells) < 2 or not all(re.fullmatch(r":?-+:?", cell) for cell in cells[1]):
        raise ValueError("a Markdown table needs a header row and a |---| separator row")
    return [cells[0], *cells[2:]]
