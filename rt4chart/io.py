"""JSONL in and out. Every input line yields exactly one item: a sample or the reason it is bad."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    # bool is an int to Python, but `"id": true` is a mistake, not the id "True".
    if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, (str, int))):
        kind = type(raw_id).__name__
        return InputLine(line, None, f"line {line}: id: must be a string or an integer, got {kind}")
    raw_id = None if raw_id is None else str(raw_id)
    try:
        sample = Sample.model_validate({**record, "id": raw_id if raw_id is not None else f"line-{line}"})
    except ValidationError as error:
        return InputLine(line, None, f"line {line}: {_describe(error)}", raw_id)
    if not sample.answer.strip():
        return InputLine(line, None, f"line {line}: answer is empty", raw_id)
    return InputLine(line, sample, None, raw_id)


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line of a JSONL file, decoded or not."""

    number: int
    """1-based line number."""
    text: str
    """The line as read (empty when it is not UTF-8)."""
    value: Any = None
    """The decoded JSON value, when the line is valid."""
    problem: str | None = None
    """Why the line could not be decoded (``not valid JSON (...)``), without the line number."""


def json_lines(lines: Iterable[str | bytes]) -> Iterator[JsonLine]:
    """Decode JSONL lines given as text or as UTF-8 bytes; blank lines are skipped.

    Every reader of JSONL in rt4chart (inputs, datasets, predictions) goes through this, so a line
    that is not UTF-8 or not JSON is reported the same way everywhere, and one bad line is one bad
    line, not a failed run.
    """
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as error:
            yield JsonLine(number, "", problem=f"not valid UTF-8 (byte {error.start + 1})")
            continue
        if number == 1:
            text = text.removeprefix("\ufeff")  # a byte order mark left by some editors
        if not text.strip():
            continue
        try:
            yield JsonLine(number, text, value=json.loads(text))
        except json.JSONDecodeError as error:
            yield JsonLine(number, text, problem=f"not valid JSON ({error.msg} at column {error.colno})")


def read_json_lines(path: Path | str) -> Iterator[JsonLine]:
    """The lines of a JSONL file (see :func:`json_lines`)."""
    with open(path, "rb") as handle:
        yield from json_lines(handle)


def read_jsonl(path: Path | str) -> Iterator[InputLine]:
    """Read an input file; blank lines are skipped, every other line yields one item."""
    return parse_lines(read_json_lines(path))


def parse_lines(lines: Iterable[JsonLine]) -> Iterator[InputLine]:
    """Turn decoded JSONL lines into input items, one per line (see :func:`read_jsonl`)."""
    for line in lines:
        if line.problem is not None:
            yield InputLine(line.number, None, f"line {line.number}: {line.problem}")
        else:
            yield parse_sample(line.value, line.number)


def error_report(item: InputLine) -> Report:
    """The output record of an input line that could not be audited."""
    return Report(id=item.raw_id, line=item.line, errors=[item.error or "invalid input"])


def unaudited_report(item: InputLine, reason: str) -> Report:
    """The record of an input line the judge could not audit: verdict open, ``incomplete``."""
    if item.sample is None:
        return error_report(item)
    return Report(id=item.sample.id, line=item.line, errors=[reason], incomplete=True, gold=item.sample.gold)


def dump_report(report: Report) -> str:
    """One output line (no trailing newline)."""
    return report.model_dump_json(exclude_none=False)


def read_completed(path: Path, items: list[InputLine]) -> dict[int, Report]:
    """Records already complete in an output file, by input line number.

    A record counts only if it parses as a whole :class:`Report`, names an input line with the same
    id and is not ``incomplete``; a torn last line left by a killed run, a record of some other
    input, or one whose verdict judge failures left open, does not.
    """
    expected = {item.line: item.sample.id if item.sample else item.raw_id for item in items}
    completed: dict[int, Report] = {}
    if not path.exists():
        return completed
    with open(path, encoding="utf-8") as handle:
        for text in handle:
            if not text.endswith("\n"):
                break  # torn: the run died while writing this line
            try:
                report = Report.model_validate_json(text)
            except ValidationError:
                continue
            # A record the judge left incomplete is audited again.
            if report.line in expected and expected[report.line] == report.id and not report.incomplete:
                completed.setdefault(report.line, report)
    return completed


def write_reports_atomically(path: Path, reports: list[Report]) -> None:
    """Replace ``path`` with ``reports``, one per line, via a temporary file and a rename."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        for report in reports:
            handle.write(dump_report(report) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


class ReportAppender:
    """Appends records to an output file, one ``write`` per record.

    Each record goes out in a single ``os.write`` on an ``O_APPEND`` descriptor, so a killed run
    leaves at most one torn last line, which :func:`read_completed` ignores.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, report: Report) -> None:
        data = (dump_report(report) + "\n").encode("utf-8")
        written = os.write(self._fd, data)
        while written < len(data):
            written += os.write(self._fd, data[written:])

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)


class PredictionsError(ValueError):
    """A predictions file cannot be scored (missing, or a line that is not an output record)."""


def read_predictions(path: Path) -> list[Report]:
    """Read ``rt4 verify`` / ``rt4 eval`` output records; raises :class:`PredictionsError`."""
    if not path.is_file():
        raise PredictionsError(f"predictions file not found: {path}")
    reports = []
    for line in read_json_lines(path):
        if line.problem is not None:
            raise PredictionsError(f"{path}:{line.number}: {line.problem}")
        try:
            reports.append(Report.model_validate(line.value))
        except ValidationError as error:
            problem = error.errors()[0]
            raise PredictionsError(
                f"{path}:{line.number}: not an rt4chart output record ({problem['loc']}: {problem['msg']})"
            ) from None
    return reports
