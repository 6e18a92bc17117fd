"""What the commands of ``rt4`` share: the command group whose ``--help`` shows no type beside a flag,
reading an input file, guarding outputs, run-layer refusals as usage errors, and saying why a run
stopped. Its names with an underscore are the :mod:`rt4chart.cli.app` package's own (every command module
uses them), not an API.
"""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine, Iterator, Sequence
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.text import Text
from typer.core import TyperGroup, TyperOption

from rt4chart.cli.flags import fail, stderr

if TYPE_CHECKING:
    from rt4chart.records.io import InputLine
    from rt4chart.runs.run import RunOutcome

OutcomeT = TypeVar("OutcomeT")


def _hide_flag_types(command: Any, ctx: Any) -> None:
    """No type beside a flag in ``--help``: typer 0.29 prints ``<bool>`` for options that take no value."""
    for param in command.get_params(ctx):
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""


class _ReadableGroup(TyperGroup):
    """A command group whose ``--help`` and whose commands' ``--help`` show no type beside a flag."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:  # typer's vendored click types are private
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _hide_flag_types(command, ctx)
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _hide_flag_types(self, ctx)
        super().format_help(ctx, formatter)


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    """A run that cannot start as asked (:class:`rt4chart.runs.run.RunUsageError`) is a usage error."""
    from rt4chart.runs.run import RunUsageError

    try:
        yield
    except RunUsageError as error:
        raise fail(str(error)) from None


def _run(run: Coroutine[Any, Any, OutcomeT], out: Path | None = None, *, interrupted_note: str | None = None) -> OutcomeT:
    """A command's run, through the run layer's one synchronous entry (:func:`rt4chart.runs.run.run_sync`):
    a run that cannot start is a usage error; SIGINT or SIGTERM exit 130 saying what was kept (in
    ``out``, how to resume; else ``interrupted_note``, for a run that does not resume)."""
    from rt4chart.report.progress import print_interrupted
    from rt4chart.runs.run import RunInterrupted, run_sync

    try:
        with _usage_errors():
            return run_sync(run, out)
    except RunInterrupted as interrupted:
        if interrupted_note is None:
            print_interrupted(interrupted.out, interrupted.records, stderr)
        else:
            stderr.print(Text(f"interrupted: {interrupted_note}", style="yellow"), highlight=False, soft_wrap=True)
        raise typer.Exit(interrupted.exit_code) from None


RESUME_NOTE = "records already written are kept; rerun with --resume once the judge is reachable"
"""What a run stopped by an unreachable judge keeps, and how to go on."""


def _print_reason(outcome: RunOutcome[Any], note: str = RESUME_NOTE) -> None:
    """The run's last line: why it passed or failed (the run layer's reason), ``note`` after a stop
    by an unreachable judge (the endpoint is named, never a key)."""
    from rt4chart.runs.run import RunStatus

    unreachable = outcome.status is RunStatus.JUDGE_UNAVAILABLE
    text = f"{outcome.reason} ({note})" if unreachable else outcome.reason
    style = "green" if outcome.status is RunStatus.PASSED else "red"
    stderr.print(Text(text, style=style), highlight=False, soft_wrap=True)


def _print_stop(outcome: RunOutcome[Any], note: str = RESUME_NOTE) -> None:
    """Say why a run stopped when its judge could not be reached, or why its verdicts were left open
    (the commands whose own result is not the audit's pass or fail)."""
    from rt4chart.runs.run import RunStatus

    if outcome.status in (RunStatus.JUDGE_UNAVAILABLE, RunStatus.INCOMPLETE):
        _print_reason(outcome, note)


def _guard_outputs(outputs: dict[str, Path | None], inputs: Sequence[Path | None]) -> dict[str, Path]:
    """:func:`rt4chart.records.io.guard_outputs`, its refusal a usage error (before any work)."""
    from rt4chart.records.io import OutputError, guard_outputs

    try:
        return guard_outputs(outputs, inputs)
    except OutputError as error:
        raise fail(str(error)) from None


def _read_input(input_path: Path) -> list[InputLine]:
    from rt4chart.records.io import STDIN, read_jsonl

    if str(input_path) != STDIN and not input_path.exists():
        raise fail(f"input file not found: {input_path}")
    if str(input_path) != STDIN and input_path.is_dir():
        raise fail(f"the input {input_path} is a directory, not a JSONL file")
    items = list(read_jsonl(input_path))
    if not items:
        raise fail(f"the input {'on stdin' if str(input_path) == STDIN else input_path} holds no record (it is empty or blank)")
    return items


class InputFormat(StrEnum):
    """How the input file holds the answers to audit (``--input-format``)."""

    JSONL = "jsonl"
    OTLP = "otlp"
    LANGFUSE = "langfuse"


def _read_traces(input_path: Path, input_format: InputFormat, mapping_path: Path | None) -> list[InputLine]:
    """The items of a trace export (OTLP/JSON or Langfuse), one per trace; a file that is no such export,
    or a bad mapping, is a usage error."""
    from rt4chart.records.langfuse import LangfuseMapping, read_langfuse_traces
    from rt4chart.records.traces import TraceError, TraceMapping, load_mapping, read_otlp_traces

    if not input_path.is_file():
        raise fail(f"trace file not found: {input_path}" if not input_path.exists() else f"{input_path} is not a file")
    try:
        if input_format is InputFormat.LANGFUSE:
            items = list(read_langfuse_traces(input_path, load_mapping(mapping_path, LangfuseMapping)))
        else:
            items = list(read_otlp_traces(input_path, load_mapping(mapping_path, TraceMapping)))
    except TraceError as error:
        raise fail(str(error)) from None
    if not items:
        raise fail(f"the trace export {input_path} holds no span")
    return items


def _input_items(input_path: Path, input_format: InputFormat, mapping_path: Path | None) -> list[InputLine] | None:
    """The items of a trace export (``--input-format otlp|langfuse``); ``None`` for JSONL, which the command
    reads its own way (streamed or whole)."""
    if input_format is not InputFormat.JSONL:
        return _read_traces(input_path, input_format, mapping_path)
    if mapping_path is not None:
        raise fail("--trace-mapping applies to --input-format otlp or langfuse only")
    return None


InputArgument = Annotated[Path, typer.Argument(metavar="INPUT.jsonl", help="JSONL: id, context, question?, answer ('-': stdin); with --input-format otlp, an OTLP trace export (JSON, or protobuf: .pb / .binpb); with langfuse, a Langfuse trace export.")]
InputFormatOption = Annotated[InputFormat, typer.Option("--input-format", help="jsonl: one answer per line; otlp: an OTLP trace export (JSON or protobuf), one answer per trace (OpenInference / GenAI spans); langfuse: Langfuse traces with their observations (its public API's JSON).")]
TraceMappingOption = Annotated[Path | None, typer.Option("--trace-mapping", help="TOML or JSON file overriding which spans and attributes hold documents, answer and question (--input-format otlp).")]
MAX_RESAMPLES = 100_000
"""Bootstrap resamples are bounded: beyond this the intervals do not move, the run only takes longer."""
ResamplesOption = Annotated[int, typer.Option(min=0, max=MAX_RESAMPLES, help="Bootstrap resamples for the 95% confidence intervals (0 to 100,000).")]
SeedOption = Annotated[int, typer.Option(help="Bootstrap seed.")]
