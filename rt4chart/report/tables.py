"""Audit records as flat tables: one row per claim or one row per answer, written as CSV
(``rt4 export --csv``) or made a pandas DataFrame (:func:`to_dataframe`).

Each level's columns are declared once (:data:`CLAIM_COLUMNS`, :data:`ANSWER_COLUMNS`): a name, what
it holds (the README's table) and how it is read from a record, so the CSV header, the DataFrame's
columns and the documentation cannot drift apart. Lists (evidence quotes, errors) are joined into one
cell; a value that is unknown (an open verdict, a claim with no answer span) is an empty cell in CSV
and ``None`` in a DataFrame.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from rt4chart.records.io import read_predictions, write_text_atomically
from rt4chart.types import AuditRecord, ClaimVerdict, Label

if TYPE_CHECKING:
    import pandas

Cell = str | int | float | bool | None
"""One value of a row."""
Row = TypeVar("Row")

LIST_SEPARATOR = " | "
"""Between the items of a list held in one cell (evidence quotes, errors)."""


class TableLevel(StrEnum):
    """What one row of an exported table is."""

    CLAIM = "claim"
    """One row per claim of every answer (answers with no claim have no row)."""
    ANSWER = "answer"
    """One row per audited answer."""


@dataclass(frozen=True)
class Column(Generic[Row]):
    """One column of a table: its header, what it holds, and how a row gives its value."""

    name: str
    description: str
    value: Callable[[Row], Cell]


def support_score(record: AuditRecord) -> float:
    """The share of an answer's claims that the context entails (1.0 for an answer with no claim to
    check): the ``support`` column, and what ``assert_grounded(min_support=)`` is compared with."""
    if not record.claims:
        return 1.0
    return sum(claim.label is Label.ENTAILED for claim in record.claims) / len(record.claims)


def _count(label: Label | None) -> Callable[[AuditRecord], int]:
    return lambda record: sum(claim.label is label for claim in record.claims)


def _joined(items: Iterable[str]) -> str:
    return LIST_SEPARATOR.join(items)


ClaimOf = tuple[AuditRecord, ClaimVerdict]
"""A claim with the record it belongs to: the row of the claim-level table."""

CLAIM_COLUMNS: tuple[Column[ClaimOf], ...] = (
    Column("id", "the answer's sample id", lambda row: row[0].id),
    Column("line", "its line in the audited input (1-based)", lambda row: row[0].line),
    Column("answer_label", "the answer's verdict (empty: left open)", lambda row: row[0].label),
    Column("claim_index", "the claim's number within its answer (0-based)", lambda row: row[1].index),
    Column("claim", "the claim's text", lambda row: row[1].text),
    Column("label", "entailed, contradicted or baseless (empty: left open by judge errors)", lambda row: row[1].label),
    Column("answer_start", "where the claim's span starts in the answer (characters)",
           lambda row: row[1].answer_span.start if row[1].answer_span else None),
    Column("answer_end", "where it ends (exclusive)",
           lambda row: row[1].answer_span.end if row[1].answer_span else None),
    Column("evidence", f"the evidence quotes from the context, joined by '{LIST_SEPARATOR}'",
           lambda row: _joined(evidence.text for evidence in row[1].evidence)),
    Column("evidence_spans", "their context offsets, START-END each, in the same order",
           lambda row: _joined(f"{evidence.start}-{evidence.end}" for evidence in row[1].evidence)),
    Column("grounded", "whether the judge's evidence was found in the context", lambda row: row[1].grounded),
    Column("confidence", "the judge's stated confidence, when it gives one", lambda row: row[1].confidence),
    Column("rationale", "the judge's reason", lambda row: row[1].rationale),
    Column("errors", "the claim's judge errors, joined", lambda row: _joined(row[1].errors)),
    Column("judge", "the judge that audited the answer", lambda row: row[0].judge),
)
"""The columns of ``--level claim`` (the default), in order."""

ANSWER_COLUMNS: tuple[Column[AuditRecord], ...] = (
    Column("id", "the answer's sample id", lambda record: record.id),
    Column("line", "its line in the audited input (1-based)", lambda record: record.line),
    Column("label", "the answer's verdict (empty: left open)", lambda record: record.label),
    Column("hallucinated", "whether a claim is contradicted or baseless (empty: unknown)",
           lambda record: record.hallucinated),
    Column("claims", "how many claims the answer was split into", lambda record: len(record.claims)),
    Column("entailed", "claims the context entails", _count(Label.ENTAILED)),
    Column("contradicted", "claims the context contradicts", _count(Label.CONTRADICTED)),
    Column("baseless", "claims the context does not support", _count(Label.BASELESS)),
    Column("open", "claims judge errors left without a verdict", _count(None)),
    Column("support", "entailed claims over all claims (1 with no claim)", support_score),
    Column("incomplete", "whether judge errors left a verdict open", lambda record: record.incomplete),
    Column("calls", "judge calls made for the answer", lambda record: record.usage.calls),
    Column("cache_hits", "of them answered from the cache", lambda record: record.usage.cache_hits),
    Column("prompt_tokens", "prompt tokens sent", lambda record: record.usage.prompt_tokens),
    Column("completion_tokens", "completion tokens received", lambda record: record.usage.completion_tokens),
    Column("cost_usd", "what the calls cost", lambda record: record.usage.cost_usd),
    Column("errors", "the answer's errors, joined", lambda record: _joined(record.errors)),
    Column("judge", "the judge that audited the answer", lambda record: record.judge),
    Column("prompt_version", "the prompts' version", lambda record: record.prompt_version),
)
"""The columns of ``--level answer``, in order."""


def _rows(columns: Sequence[Column[Row]], rows: Iterable[Row]) -> list[list[Cell]]:
    # A label is a StrEnum: its plain value, so a DataFrame's column holds strings.
    return [[str(value) if isinstance(value, StrEnum) else value for value in (c.value(row) for c in columns)]
            for row in rows]


def table(
    records: Sequence[AuditRecord], level: TableLevel | str = TableLevel.CLAIM
) -> tuple[list[str], list[list[Cell]]]:
    """The header and rows of ``records`` at ``level`` (``ValueError`` for an unknown level)."""
    if TableLevel(level) is TableLevel.ANSWER:
        return [column.name for column in ANSWER_COLUMNS], _rows(ANSWER_COLUMNS, records)
    claims = [(record, claim) for record in records for claim in record.claims]
    return [column.name for column in CLAIM_COLUMNS], _rows(CLAIM_COLUMNS, claims)


def _csv_cell(value: Cell) -> str | int | float:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def csv_text(records: Sequence[AuditRecord], level: TableLevel | str = TableLevel.CLAIM) -> str:
    """``records`` as CSV (RFC 4180: a header, quoted where needed, CRLF line ends)."""
    header, rows = table(records, level)
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows([_csv_cell(value) for value in row] for row in rows)
    return buffer.getvalue()


def write_csv(path: Path, records: Sequence[AuditRecord], level: TableLevel | str = TableLevel.CLAIM) -> None:
    """Write ``records`` as CSV at ``path`` (atomically)."""
    write_text_atomically(path, [csv_text(records, level)])


def to_dataframe(
    records: Sequence[AuditRecord] | Path | str, level: TableLevel | str = TableLevel.CLAIM
) -> pandas.DataFrame:
    """``records`` (or the records file of an audit, ``rt4 verify --out``) as a pandas DataFrame, one
    row per claim (``level="answer"``: per answer), with the columns of ``rt4 export --csv``. pandas
    is optional: ``ImportError`` saying so when it is missing; a file that holds no records raises
    :class:`~rt4chart.records.io.PredictionsError` naming its first bad line."""
    try:
        import pandas
    except ImportError as error:
        raise ImportError("rt4chart.to_dataframe needs pandas, which is not installed: pip install pandas "
                          "(or write CSV: rt4 export RESULTS.jsonl --csv FILE.csv)") from error
    if isinstance(records, (Path, str)):
        records = read_predictions(Path(records))
    header, rows = table(records, level)
    return pandas.DataFrame(rows, columns=header)
