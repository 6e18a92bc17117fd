"""Everything a finished run writes besides its JSONL records: the readable terminal view, the HTML
report, JUnit XML, GitHub annotations, and the pass/fail decision (``--fail-on``, ``--max-rate``).

``rt4 verify`` (after its audit) and ``rt4 report`` (over an existing results file) both end in
:func:`publish`, so the two commands write the same files and decide failure the same way.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.text import Text

from rt4chart.audited import AuditedSample

# FailOn and ShowOnly live in audited (which applies them, and the reporting modules this one imports use
# them); they are offered from here, the module of the outputs and the pass/fail decision they shape.
from rt4chart.audited import FailOn as FailOn
from rt4chart.audited import ShowOnly as ShowOnly
from rt4chart.ci_formats import github_annotations, run_fails, write_junit
from rt4chart.options import AuditOptions
from rt4chart.terminal_view import print_samples


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
    ``rt4 verify`` and ``rt4 report`` (:func:`rt4chart.cli_flags.run_options`: ``outputs.junit``, ...),
    their docstrings the flags' help."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    html: Path | None = Field(default=None, json_schema_extra={"flag": "--report"})
    """Also write a self-contained HTML report here."""
    junit: Path | None = None
    """Also write JUnit XML here (one test case per sample)."""
    github: bool = Field(default=False, json_schema_extra={"flag": "--github"})
    """Print GitHub Actions annotations on the offending input lines."""
    text_view: bool = False
    """Print the readable view of every sample on stdout."""
    input_file: str | None = None
    """The input file as the user named it: what annotations point at."""
    title: str = "rt4chart audit"
    """Title of the HTML report and name of the JUnit test suite."""
    fail_on: FailOn = FailOn.HALLUCINATED
    """Which answers fail the run (exit 1)."""
    max_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    """Fail only when the share of failing answers exceeds R (0: any one)."""
    baseline: Path | None = None
    """An earlier audit of these answers (its --out): --fail-on new|worse gate against it, unchanged lines
    reuse its records without a judge call, and JUnit and annotations warn (rather than fail) on the
    hallucinations it had too."""


def baseline_problem(options: PublishOptions) -> str | None:
    """Why the run's baseline settings cannot work (checked before any work), or ``None``: the
    baseline's records and its manifest are read here, so a truncated or damaged artifact is a
    usage error before any judge call, not a crash after the audit."""
    from rt4chart.io import PredictionsError, read_predictions
    from rt4chart.manifest import ManifestError, read_manifest

    if options.fail_on in (FailOn.NEW, FailOn.WORSE) and options.baseline is None:
        return f"--fail-on {options.fail_on} compares with an earlier audit: give --baseline BASE.jsonl"
    if options.baseline is not None:
        try:
            read_predictions(options.baseline)
            read_manifest(options.baseline)
        except (PredictionsError, ManifestError) as error:
            return f"--baseline: {error}"
    return None


def publish(
    options: PublishOptions, audited: list[AuditedSample], stdout: Console,
    audit_options: AuditOptions | None = None, stderr: Console | None = None,
) -> bool:
    """Write what ``options`` asks for; return whether the run fails its policy.

    With a baseline, the gate's verdict and any difference of judge or prompt version between the
    two audits are said on ``stderr``; ``audit_options`` (this run's) are compared with the
    baseline manifest's.
    """
    gate = None
    if options.baseline is not None:
        from rt4chart.diff import baseline_gate, this_run_config  # numpy and scipy: only with a baseline

        reports = [item.report for item in audited]
        gate = baseline_gate(reports, this_run_config(reports, audit_options, options.input_file),
                             options.baseline, options.fail_on)
        notices = stderr or Console(stderr=True)
        for warning in gate.warnings:
            notices.print(Text.assemble(("warning:", "bold yellow"), " ", warning), highlight=False, soft_wrap=True)
        notices.print(Text(f"baseline {options.baseline}: {gate.reason}"), highlight=False, soft_wrap=True)
    gated = gate is not None and options.fail_on in (FailOn.NEW, FailOn.WORSE)
    # Under a gate, what the baseline had too is not this change's failure; under any other policy
    # (--fail-on hallucinated with a baseline given) every hallucination still fails.
    pre_existing = frozenset(gate.pre_existing_lines) if gate is not None and gated else frozenset()
    if options.text_view:
        print_samples(audited, stdout)
    if options.html is not None:
        from rt4chart.html_report import write_html  # Jinja2: loaded only when a report is asked for

        write_html(options.html, audited, options.title)
    if options.junit is not None:
        write_junit(options.junit, audited, options.title, options.fail_on, pre_existing)
    if options.github:
        for command in github_annotations(audited, options.input_file, options.fail_on, pre_existing):
            stdout.print(command, markup=False, highlight=False, emoji=False, soft_wrap=True)
    if gate is not None and gated:
        return gate.fails
    return run_fails(audited, options.fail_on, options.max_rate)
