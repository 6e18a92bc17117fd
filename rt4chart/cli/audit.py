"""``rt4 verify`` (audit every answer of an input file: the run layer's run, its progress and summary)
and ``rt4 estimate`` (what that audit would cost, calling no judge)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from rt4chart.cli.common import (
    InputArgument,
    InputFormat,
    InputFormatOption,
    TraceMappingOption,
    _input_items,
    _print_reason,
    _print_stop,
    _read_input,
    _run,
    _usage_errors,
)
from rt4chart.cli.flags import AUDIT_FLAGS, OUTPUT_FLAGS, RUN_FLAGS, run_spec, stderr
from rt4chart.options import HelpPanel
from rt4chart.report.outputs import OutputFormat
from rt4chart.runs.spec import RunSpec

if TYPE_CHECKING:
    from rt4chart.records.io import InputLine
    from rt4chart.runs.run import RunOutcome

commands = typer.Typer()


def _execute(spec: RunSpec, items: Iterable[InputLine], quiet: bool) -> RunOutcome[None]:
    """Run ``spec`` through the run layer with the progress bar on stderr; records without --out go to
    stdout. Records are streamed, not held (the outcome is built from counters)."""
    from rt4chart.report.progress import ProgressObserver
    from rt4chart.runs.run import aexecute

    observer = ProgressObserver(stderr, enabled=not quiet)
    return _run(aexecute(spec, items, observer=observer, stdout=sys.stdout, keep_records=False), spec.out)


def _stream_input(input_path: Path) -> Iterable[InputLine]:
    """The input read as the run goes (a file; stdin, which cannot be read twice, is read whole)."""
    from rt4chart.records.io import STDIN, InputFile

    if str(input_path) == STDIN or not input_path.is_file() or not InputFile(input_path):
        return _read_input(input_path)  # its checks name what is wrong
    return InputFile(input_path)


@commands.command()
@run_spec(*RUN_FLAGS, *OUTPUT_FLAGS, *AUDIT_FLAGS)
def verify(
    input_path: InputArgument,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no summary on stderr.", rich_help_panel=HelpPanel.OUTPUTS)] = False,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="stdout without --out: auto = readable on a terminal, JSONL elsewhere.", rich_help_panel=HelpPanel.OUTPUTS)] = OutputFormat.AUTO,
    input_format: InputFormatOption = InputFormat.JSONL,
    trace_mapping: TraceMappingOption = None,
    *,
    spec: RunSpec,
) -> None:
    """Verify every answer of INPUT.jsonl; one output record per input line, in input order."""
    from rt4chart.report.outputs import readable_stdout

    outputs = spec.outputs.model_copy(update={
        "input_file": str(input_path), "title": f"rt4chart audit of {input_path.name}",
        "text_view": readable_stdout(output_format, spec.out, sys.stdout.isatty()),
    })
    spec = spec.model_copy(update={"input_file": input_path, "outputs": outputs})
    traces = _input_items(input_path, input_format, trace_mapping)
    outcome = _execute(spec, _stream_input(input_path) if traces is None else traces, quiet)
    if not quiet:
        from rt4chart.report.progress import print_summary

        print_summary(outcome.summary, stderr)
        _print_reason(outcome)
    else:
        _print_stop(outcome)  # --quiet still says why a run stopped
    raise typer.Exit(outcome.exit_code)


@commands.command()
@run_spec("judge", "api_base", "limits.batch", "cache.cache_dir", "cache.cache_url", *AUDIT_FLAGS)
def estimate(
    input_path: InputArgument,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout.")] = False,
    input_format: InputFormatOption = InputFormat.JSONL,
    trace_mapping: TraceMappingOption = None,
    *,
    spec: RunSpec,
) -> None:
    """Calls, tokens and USD an audit of INPUT.jsonl would need (expected and worst case); calls no judge."""
    from rt4chart.report.progress import print_estimate
    from rt4chart.runs.planning import estimate as estimate_run

    traces = _input_items(input_path, input_format, trace_mapping)
    items = _read_input(input_path) if traces is None else traces
    with _usage_errors():
        plan = estimate_run(spec, items)
    if as_json:
        print(json.dumps(dataclasses.asdict(plan), indent=2))
    else:
        print_estimate(plan, Console())
