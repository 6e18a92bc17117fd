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
from rt4chart.cli.flags import AUDIT_FLAGS, OUTPUT_FLAGS, RUN_FLAGS, fail, run_spec, stderr
from rt4chart.options import HelpPanel
from rt4chart.report.outputs import OutputFormat
from rt4chart.runs.spec import RunSpec

if TYPE_CHECKING:
    from rt4chart.records.io import InputLine
    from rt4chart.records.live_sources import LiveSource
    from rt4chart.records.server_reads import SourceRead
    from rt4chart.runs.run import RunOutcome
    from rt4chart.runs.write_back import Target, WriteBackResult

commands = typer.Typer()
SinceOption = Annotated[str | None, typer.Option("--since", help="With a phoenix://HOST:PORT/PROJECT or langfuse://HOST:PORT/PROJECT input: only traces that started this long ago or later (90s, 30m, 24h, 7d); the source's watermark skips those already audited.")]


def _execute(spec: RunSpec, items: Iterable[InputLine], quiet: bool) -> RunOutcome[None]:
    """Run ``spec`` through the run layer with the progress bar on stderr; records without --out go to
    stdout. Records are streamed, not held (the outcome is built from counters)."""
    from rt4chart.report.progress import ProgressObserver
    from rt4chart.runs.run import aexecute

    observer = ProgressObserver(stderr, enabled=not quiet)
    return _run(aexecute(spec, items, observer=observer, stdout=sys.stdout, keep_records=False), spec.out)


def _live_source(input_path: Path) -> LiveSource | None:
    """The tracing server the input names, if it names one; a bad one is a usage error."""
    from rt4chart.records.live_sources import live_source
    from rt4chart.records.traces import TraceError

    try:
        return live_source(str(input_path))
    except TraceError as error:
        raise fail(str(error)) from None


def _read_project(spec: RunSpec, source: LiveSource, since: str | None, mapping_path: Path | None,
                  quiet: bool) -> SourceRead:
    """The traces of a Phoenix or Langfuse project not audited yet; a bad window, mapping, missing or
    refused keys, or an unreadable server is a usage error."""
    from rt4chart.records.server_reads import parse_duration
    from rt4chart.records.traces import TraceError
    from rt4chart.runs.production import read_project, source_mapping

    try:
        window = None if since is None else parse_duration(since)
    except ValueError as error:
        raise fail(f"--since: {error}") from None
    try:
        read = read_project(spec, source, window, source_mapping(source, mapping_path))
    except TraceError as error:
        raise fail(str(error)) from None
    if not quiet:
        earlier = f" ({read.before_window} begun before the window or audited before)" if read.before_window else ""
        stderr.print(f"{source.name}: {len(read.items)} new traces{earlier}", highlight=False, soft_wrap=True)
    return read


def _write_back_target(spec: RunSpec, source: LiveSource | None, input_format: InputFormat) -> Target:
    """Where ``--write-back`` sends verdicts (checked before any work): the Phoenix project read, the
    Langfuse server read, or (a Langfuse export) the Langfuse server of the environment."""
    from rt4chart.records.langfuse_server import LangfuseSource
    from rt4chart.records.live_sources import LIVE_SOURCES
    from rt4chart.runs.write_back import LangfuseTarget, WriteBackError

    if spec.out is None:
        raise fail("--write-back needs --out (the verdicts are written back from its records)")
    if source is not None and not isinstance(source, LangfuseSource):
        return source
    if source is None and input_format is not InputFormat.LANGFUSE:
        raise fail(f"--write-back needs {LIVE_SOURCES} or --input-format langfuse")
    try:
        return LangfuseTarget.from_environment(source)
    except WriteBackError as error:
        raise fail(str(error)) from None


def _write_back(out: Path, target: Target, quiet: bool) -> list[WriteBackResult]:
    """The run's verdicts written back, and what became of each."""
    from rt4chart.runs.write_back import results_path, write_back_records

    results = write_back_records(out, target)
    counts = {status: sum(r.status == status for r in results) for status in ("written", "skipped", "failed")}
    failed = next((r for r in results if r.status == "failed"), None)
    if not quiet or failed:
        line = f"write-back: {counts['written']} written, {counts['skipped']} skipped, {counts['failed']} failed " \
            f"({results_path(out)})" + (f"; first failure: {failed.error}" if failed else "")
        stderr.print(line, style="red" if failed else None, highlight=False, soft_wrap=True)
    return results


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
    since: SinceOption = None,
    write_back: Annotated[bool, typer.Option("--write-back", help="Write each answer's verdict back onto its trace: a Phoenix span annotation (phoenix:// input) or a Langfuse score (langfuse:// input, or --input-format langfuse with LANGFUSE_HOST; LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY); a rerun updates them. Needs --out; each record's outcome in OUT.write-back.jsonl.")] = False,
    *,
    spec: RunSpec,
) -> None:
    """Verify every answer of INPUT.jsonl; one output record per input line, in input order."""
    from rt4chart.records.live_sources import LIVE_SOURCES
    from rt4chart.report.outputs import readable_stdout

    source = _live_source(input_path)
    name = source.name if source else input_path.name
    outputs = spec.outputs.model_copy(update={
        "input_file": source.name if source else str(input_path), "title": f"rt4chart audit of {name}",
        "text_view": readable_stdout(output_format, spec.out, sys.stdout.isatty()),
    })
    spec = spec.model_copy(update={"input_file": None if source else input_path, "outputs": outputs})
    target = _write_back_target(spec, source, input_format) if write_back else None
    if source is not None:
        read = _read_project(spec, source, since, trace_mapping, quiet)
        traces: list[InputLine] | None = read.items
    elif since is not None:
        raise fail(f"--since applies to {LIVE_SOURCES} only")
    else:
        traces = _input_items(input_path, input_format, trace_mapping)
    outcome = _execute(spec, _stream_input(input_path) if traces is None else traces, quiet)
    results = None if target is None or spec.out is None else _write_back(spec.out, target, quiet)
    code = outcome.exit_code
    if results is not None:
        from rt4chart.runs.write_back import exit_code_after

        code = exit_code_after(code, results)
    if source is not None:
        from rt4chart.runs.production import advance_watermark

        if not advance_watermark(spec, source, read, outcome, results) and read.watermark and not quiet:
            stderr.print("the watermark stays: the run did not audit every trace (rerun to audit them)",
                         highlight=False, soft_wrap=True)
    if not quiet:
        from rt4chart.report.progress import print_summary

        print_summary(outcome.summary, stderr)
        _print_reason(outcome)
    else:
        _print_stop(outcome)  # --quiet still says why a run stopped
    raise typer.Exit(code)


@commands.command()
@run_spec("judge", "api_base", "limits.batch", "cache.cache_dir", "cache.cache_url", *AUDIT_FLAGS)
def estimate(
    input_path: InputArgument,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout.")] = False,
    input_format: InputFormatOption = InputFormat.JSONL,
    trace_mapping: TraceMappingOption = None,
    since: SinceOption = None,
    *,
    spec: RunSpec,
) -> None:
    """Calls, tokens and USD an audit of INPUT.jsonl would need (expected and worst case); calls no judge."""
    from rt4chart.records.live_sources import LIVE_SOURCES
    from rt4chart.report.progress import print_estimate
    from rt4chart.runs.planning import estimate as estimate_run

    source = _live_source(input_path)
    if source is not None:  # what the next rt4 verify of it would read; its watermark does not move
        traces: list[InputLine] | None = _read_project(spec, source, since, trace_mapping, quiet=True).items
    elif since is not None:
        raise fail(f"--since applies to {LIVE_SOURCES} only")
    else:
        traces = _input_items(input_path, input_format, trace_mapping)
    items = _read_input(input_path) if traces is None else traces
    with _usage_errors():
        plan = estimate_run(spec, items)
    if as_json:
        print(json.dumps(dataclasses.asdict(plan), indent=2))
    else:
        print_estimate(plan, Console())
