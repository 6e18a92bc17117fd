"""Everything a finished run writes besides its JSONL records: the readable terminal view, the HTML
report, JUnit XML, GitHub annotations.

``rt4 verify`` (after its audit) and ``rt4 report`` (over an existing results file) both end in
:func:`publish`, so the two commands write the same files; the pass/fail decision (``--fail-on``,
``--max-rate``, a baseline gate) is the run layer's (:func:`rt4chart.runs.run.policy_fails`).
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.text import Text

from rt4chart.options import AuditOptions, FailOn, HelpPanel
from rt4chart.report.audited import AuditedSample
from rt4chart.report.ci_formats import github_annotations, write_junit
from rt4chart.report.terminal_view import print_samples
from rt4chart.types import AuditRecord

if TYPE_CHECKING:
    from rt4chart.analysis.diff import GateOutcome


class OutputFormat(StrEnum):
    """What ``rt4 verify`` writes to stdout when no ``--out`` is given."""

    AUTO = "auto"
    """The readable view on a terminal, JSONL anywhere else (pipes, files, CI logs)."""
    JSONL = "jsonl"
    """One JSON record per line, always."""
    TEXT = "text"
    """The readable view, always."""


def readable_stdout(output_format: OutputFormat, out: Path | None, stdout_is_terminal: bool) -> bool:
    """Whether stdout gets the readable view instead of JSONL records."""
    if out is not None or output_format is OutputFormat.JSONL:
        return False
    return output_format is OutputFormat.TEXT or stdout_is_terminal


class PublishOptions(BaseModel):
    """The outputs a run asked for, and how it decides failure. The fields a user sets are flags of
    ``rt4 verify`` and ``rt4 report`` (:func:`rt4chart.cli.flags.run_spec`: ``outputs.junit``, ...),
    their docstrings the flags' help, their ``panel`` the flags' ``--help`` panel."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    html: Path | None = Field(default=None, json_schema_extra={"flag": "--report", "panel": HelpPanel.OUTPUTS})
    """Also write a self-contained HTML report here."""
    junit: Path | None = Field(default=None, json_schema_extra={"panel": HelpPanel.OUTPUTS})
    """Also write JUnit XML here (one test case per sample)."""
    github: bool = Field(default=False, json_schema_extra={"flag": "--github", "panel": HelpPanel.OUTPUTS})
    """Print GitHub Actions annotations on the offending input lines."""
    text_view: bool = False
    """Print the readable view of every sample on stdout."""
    input_file: str | None = None
    """The input file as the user named it: what annotations point at."""
    title: str = "rt4chart audit"
    """Title of the HTML report and name of the JUnit test suite."""
    fail_on: FailOn = Field(default=FailOn.HALLUCINATED, json_schema_extra={"panel": HelpPanel.OUTPUTS})
    """Which answers fail the run (exit 1)."""
    max_rate: float = Field(default=0.0, ge=0.0, le=1.0, json_schema_extra={"panel": HelpPanel.OUTPUTS})
    """Fail only when the share of failing answers exceeds R (0: any one)."""
    baseline: Path | None = Field(default=None, json_schema_extra={"panel": HelpPanel.OUTPUTS})
    """An earlier audit of these answers (its --out): --fail-on new|worse gate against it, unchanged lines
    reuse its records without a judge call, and JUnit and annotations warn (rather than fail) on the
    hallucinations it had too."""


def baseline_problem(options: PublishOptions) -> str | None:
    """Why the run's baseline settings cannot work (checked before any work), or ``None``: the
    baseline's records and its manifest are read here, so a truncated or damaged artifact is a
    usage error before any judge call, not a crash after the audit."""
    from rt4chart.records.io import PredictionsError, read_predictions
    from rt4chart.records.manifest import ManifestError, read_manifest

    if options.fail_on in (FailOn.NEW, FailOn.WORSE) and options.baseline is None:
        return f"--fail-on {options.fail_on} compares with an earlier audit: give --baseline BASE.jsonl"
    if options.baseline is not None:
        try:
            read_predictions(options.baseline)
            read_manifest(options.baseline)
        except (PredictionsError, ManifestError) as error:
            return f"--baseline: {error}"
    return None


def baseline_gate_of(
    options: PublishOptions, reports: list[AuditRecord], audit_options: AuditOptions | None = None,
    stderr: Console | None = None,
) -> GateOutcome | None:
    """The baseline gate of a run with ``--baseline`` (``None`` without one); its warnings (any
    difference of judge or prompt version between the two audits) and its verdict are said on
    ``stderr``; ``audit_options`` (this run's) are compared with the baseline manifest's."""
    if options.baseline is None:
        return None
    from rt4chart.analysis.diff import baseline_gate, this_run_config  # numpy and scipy: only with a baseline

    gate = baseline_gate(reports, this_run_config(reports, audit_options, options.input_file),
                         options.baseline, options.fail_on)
    notices = stderr or Console(stderr=True)
    for warning in gate.warnings:
        notices.print(Text.assemble(("warning:", "bold yellow"), " ", warning), highlight=False, soft_wrap=True)
    notices.print(Text(f"baseline {options.baseline}: {gate.reason}"), highlight=False, soft_wrap=True)
    return gate


def gates(options: PublishOptions, gate: GateOutcome | None) -> bool:
    """Whether the baseline gate, rather than the share of failing answers, decides the run
    (``--fail-on new|worse``)."""
    return gate is not None and options.fail_on in (FailOn.NEW, FailOn.WORSE)


def publish(
    options: PublishOptions, audited: list[AuditedSample], stdout: Console, gate: GateOutcome | None = None
) -> None:
    """Write what ``options`` asks for; under a baseline gate (:func:`baseline_gate_of`), what the
    baseline had too is not this change's failure in JUnit and annotations."""
    # Under any other policy (--fail-on hallucinated with a baseline given) every hallucination still fails.
    pre_existing = frozenset(gate.pre_existing_lines) if gate is not None and gates(options, gate) else frozenset()
    if options.text_view:
        print_samples(audited, stdout)
    if options.html is not None:
        from rt4chart.report.html_report import write_html  # Jinja2: loaded only when a report is asked for

        write_html(options.html, audited, options.title)
    if options.junit is not None:
        write_junit(options.junit, audited, options.title, options.fail_on, pre_existing)
    if options.github:
        for command in github_annotations(audited, options.input_file, options.fail_on, pre_existing):
            stdout.print(command, markup=False, highlight=False, emoji=False, soft_wrap=True)
