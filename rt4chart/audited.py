"""Output records paired with the input they audit: what every human- and CI-facing view reads.

An output record (:class:`~rt4chart.types.AuditRecord`) holds offsets, not text: the answer its claim
spans point into and the context its evidence points into live in the input file. The views
(HTML report, terminal view, JUnit, GitHub annotations) need both, so this module joins them by
input line, and keeps any record fields that :class:`AuditRecord` does not model (signals, several
judges' verdicts added by other tools) so those views can show them as they are.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from pydantic_core import PydanticSerializationError

from rt4chart.io import InputLine, read_records
from rt4chart.text import displayable, join_passages, json_displayable
from rt4chart.types import AuditRecord, Label, Sample


class FailOn(StrEnum):
    """Which answers fail a run (exit code 1, JUnit failures): a policy of what a finished run
    reports, applied to the joined records here (:func:`failing_labels`) and offered by the CLI
    through :mod:`rt4chart.outputs`."""

    CONTRADICTED = "contradicted"
    HALLUCINATED = "hallucinated"
    NEVER = "never"
    NEW = "new"
    """Only hallucinations the ``--baseline`` audit did not have (and hallucinated answers new to the input)."""
    WORSE = "worse"
    """A hallucination rate above the ``--baseline``'s by the exact McNemar test (p < 0.05, more new than fixed)."""
    MISATTRIBUTED = "misattributed"
    """Answers with a claim supported only by passages it does not cite (:mod:`rt4chart.citations`)."""
    MISCITED = "miscited"
    """Answers with a claim whose citation does not hold: misattributed, unsupported (cited but not
    entailed) or uncited (entailed, in an answer that cites elsewhere)."""


class ShowOnly(StrEnum):
    """Which samples ``rt4 show --only`` keeps: the :class:`FailOn` policies that select answers
    by their own label or their claims' citation verdicts (``never``, ``new`` and ``worse`` select
    none, or need a baseline)."""

    CONTRADICTED = FailOn.CONTRADICTED.value
    HALLUCINATED = FailOn.HALLUCINATED.value
    MISATTRIBUTED = FailOn.MISATTRIBUTED.value
    MISCITED = FailOn.MISCITED.value


class ResultsError(ValueError):
    """A results file that cannot be read, or that does not belong to the given input."""


def _displayable_value(value: Any) -> Any:
    if isinstance(value, str):
        return displayable(value)
    if isinstance(value, list):
        return [_displayable_value(item) for item in value]
    if isinstance(value, dict):
        return {key: _displayable_value(item) for key, item in value.items()}
    return value


_Model = TypeVar("_Model", AuditRecord, Sample)


def _displayable(model: _Model) -> _Model:
    """``model`` with every string made :func:`~rt4chart.text.displayable` (itself when none changes)."""
    try:  # the common case, without a walk over every string
        if json_displayable(model.model_dump_json()):
            return model
    except PydanticSerializationError:  # a lone surrogate, which no JSON text holds: the walk handles it
        pass
    dumped = model.model_dump(mode="json")
    shown = _displayable_value(dumped)
    return model if shown == dumped else type(model).model_validate(shown)


@dataclass(frozen=True)
class AuditedSample:
    """One output record with the input sample it audits, when that input is known."""

    report: AuditRecord
    """The output record."""
    sample: Sample | None = None
    """The audited input; ``None`` for an invalid input line or when no input file was given."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Record fields :class:`AuditRecord` does not model (e.g. signals, other judges' verdicts)."""

    def __post_init__(self) -> None:
        # Everything a reporting module shows comes through here: terminal escapes and bidi
        # controls from answers or judges are made visible, length for length (offsets hold).
        object.__setattr__(self, "report", _displayable(self.report))
        if self.sample is not None:
            object.__setattr__(self, "sample", _displayable(self.sample))
        object.__setattr__(self, "extra", _displayable_value(self.extra))

    @property
    def context_text(self) -> str | None:
        """The joined context that evidence offsets refer to."""
        return None if self.sample is None else join_passages(self.sample.context)[0]

    @property
    def judge_errors(self) -> list[str]:
        """Problems met while judging a readable sample (record- and claim-level)."""
        if self.report.label is None:
            return []
        return [*self.report.errors, *(e for claim in self.report.claims for e in claim.errors)]

    @property
    def ungrounded(self) -> bool:
        """Whether any claim's evidence could not be anchored in the context."""
        return any(not claim.grounded for claim in self.report.claims)

    def fails(self, fail_on: FailOn) -> bool:
        """Whether this sample counts against the run under the ``fail_on`` policy."""
        by_citations = fails_citations(self.report, fail_on)
        return by_citations if by_citations is not None else self.report.label in failing_labels(fail_on)


CITATION_POLICIES: dict[FailOn, frozenset[str]] = {
    FailOn.MISATTRIBUTED: frozenset({"misattributed"}),
    FailOn.MISCITED: frozenset({"misattributed", "unsupported", "uncited"}),
}
"""The ``--fail-on`` policies decided by claims' citation verdicts, and the verdicts that fail each."""


def fails_citations(report: AuditRecord, fail_on: FailOn) -> bool | None:
    """Whether a judged record fails a citation policy; ``None`` when ``fail_on`` is not one."""
    verdicts = CITATION_POLICIES.get(fail_on)
    if verdicts is None:
        return None
    return report.label is not None and any(
        claim.citation is not None and claim.citation.verdict in verdicts for claim in report.claims
    )


def failing_labels(fail_on: FailOn) -> frozenset[Label]:
    """The answer labels that count against a run under ``fail_on`` (none for ``never``)."""
    if fail_on is FailOn.CONTRADICTED:
        return frozenset({Label.CONTRADICTED})
    if fail_on in (FailOn.HALLUCINATED, FailOn.NEW, FailOn.WORSE):
        # Against a baseline, which of these are new is the gate's business (rt4chart.diff).
        return frozenset({Label.CONTRADICTED, Label.BASELESS})
    return frozenset()


def pair_with_inputs(reports: Iterable[AuditRecord], items: Iterable[InputLine]) -> list[AuditedSample]:
    """Join records to the input lines they audit, in input order (records the pipeline just made)."""
    samples = {item.line: item.sample for item in items}
    ordered = sorted(reports, key=lambda report: report.line)
    return [AuditedSample(report, samples.get(report.line)) for report in ordered]


def read_results(path: Path, items: list[InputLine] | None = None) -> list[AuditedSample]:
    """Read a results file (``rt4 verify`` output), joined to ``items`` when an input file is given.

    Raises :class:`ResultsError` naming the first bad line, or the first record whose id differs
    from its input line's (the results of some other input file).
    """
    if not path.is_file():
        raise ResultsError(f"results file not found: {path}")
    samples = {item.line: item.sample for item in items or []}
    audited: list[AuditedSample] = []
    for record in read_records(path):
        number, report = record.number, record.report
        if report is None or record.value is None:
            raise ResultsError(f"{path} line {number}: {record.problem}")
        sample = samples.get(report.line)
        if items is not None and report.line not in samples:
            raise ResultsError(f"{path} line {number}: record {report.id!r} names input line {report.line}, "
                               "which the input file does not have")
        if items is not None and sample is not None and sample.id != report.id:
            raise ResultsError(
                f"{path} line {number}: record {report.id!r} does not match input line {report.line} "
                f"(id {sample.id!r}); were these results made from another input file?"
            )
        extra = {key: value for key, value in record.value.items() if key not in AuditRecord.model_fields}
        audited.append(AuditedSample(report, sample, extra))
    return audited
