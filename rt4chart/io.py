"""JSONL in and out. Every input line yields exactly one item: a sample or the reason it is bad."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from rt4chart.types import Report, Sample


@dataclass(frozen=True)
class InputLine:
    """One line of an input file, parsed or not."""

    line: int
    """1-based line number."""
    sample: Sample | None
    """The sample, when the line is valid."""
    error: str | None = None
    """Why the line is not a valid sample."""
    raw_id: str | None = None
    """The line's ``id`` when one could be read, even from an invalid line."""


def _describe(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "line"
        problems.append(f"{where}: {item['msg']}")
    return "; ".join(problems)


def parse_sample(record: Any, line: int) -> InputLine:
    """Validate one decoded JSON value as a sample."""
    if not isinstance(record, dict):
        return InputLine(line, None, f"line {line}: expected a JSON object, got {type(record).__name__}")
    raw_id = record.get("id")
    raw_id = str(raw_id) if isinstance(raw_id, (str, int)) else None
    try:
        sample = Sample.model_validate({**record, "id": raw_id if raw_id is not None else f"line-{line}"})
    except ValidationError as error:
        return InputLine(line, None, f"line {line}: {_describe(error)}", raw_id)
    if not sample.answer.strip():
        return InputLine(line, None, f"line {line}: answer is empty", raw_id)
    return InputLine(line, sample, None, raw_id)


def read_jsonl(path: Path | str) -> Iterator[InputLine]:
    """Read an input file; blank lines are skipped, every other line yields one item."""
    with open(path, encoding="utf-8") as handle:
        yield from parse_lines(handle)


def parse_lines(lines: IO[str] | list[str]) -> Iterator[InputLine]:
    """Parse JSONL text lines (see :func:`read_jsonl`)."""
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as error:
            yield InputLine(number, None, f"line {number}: not valid JSON ({error.msg} at column {error.colno})")
            continue
        yield parse_sample(record, number)


def error_report(item: InputLine) -> Report:
    """The output record of an input line that could not be audited."""
    return Report(id=item.raw_id, line=item.line, errors=[item.error or "invalid input"])


def dump_report(report: Report) -> str:
    """One output line (no trailing newline)."""
    return report.model_dump_json(exclude_none=False)
