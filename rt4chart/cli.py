"""The ``rt4`` command: a thin shell over the library. Only this module and ``report.py`` print.

Exit codes of ``rt4 verify``: 0 every answer entailed; 1 at least one answer hallucinated;
2 bad input or usage (any invalid input line, unknown judge, missing key, bad flags);
3 stopped early by the budget.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated, TextIO

import typer
from rich.console import Console

from rt4chart.decompose import DecomposerKind
from rt4chart.io import dump_report, read_jsonl
from rt4chart.judges import JudgeConfigError, resolve_judge
from rt4chart.pipeline import Pipeline, PipelineOptions
from rt4chart.report import RunSummary, print_summary

EXIT_OK, EXIT_HALLUCINATED, EXIT_USAGE, EXIT_BUDGET = 0, 1, 2, 3

app = typer.Typer(
    name="rt4",
    help="Audit RAG answers against their context: claim-level verdicts with evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stderr = Console(stderr=True)


@app.callback()
def _commands() -> None:
    """Audit RAG answers against their context: claim-level verdicts with evidence."""


def fail(message: str) -> typer.Exit:
    """Report a usage error and return the exit to raise."""
    stderr.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(EXIT_USAGE)


@app.command()
def verify(
    input_path: Annotated[Path, typer.Argument(metavar="INPUT.jsonl", help="JSONL: id, context, question?, answer.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output JSONL (default: stdout).")] = None,
    judge: Annotated[str | None, typer.Option(help="Judge: profile name, litellm model, cascade:A,B or scripted:RULES.json (default: the embedded offline verifier).")] = None,
    api_base: Annotated[str | None, typer.Option(help="Base URL of an OpenAI-compatible or vLLM server.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Judge calls in flight (default: the judge profile's).")] = None,
    decomposer: Annotated[str, typer.Option(help="judge, rules or auto.")] = "auto",
    window: Annotated[int, typer.Option(help="Context sentences per chunk (W).")] = 25,
    overlap: Annotated[int, typer.Option(help="Sentences shared by consecutive chunks (O < W).")] = 10,
    batch_claims: Annotated[int, typer.Option(help="Claims judged per call; 1 = reference algorithm.")] = 8,
    global_verification: Annotated[bool, typer.Option("--global/--no-global", help="Re-judge claims against the full context.")] = True,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")] = False,
) -> None:
    """Verify every answer of INPUT.jsonl; one output record per input line, in input order."""
    if window < 1 or not 0 <= overlap < window:
        raise fail(f"--overlap must be at least 0 and smaller than --window (got W={window}, O={overlap})")
    if batch_claims < 1:
        raise fail("--batch-claims must be at least 1")
    if decomposer not in ("judge", "rules", "auto"):
        raise fail(f"--decomposer must be judge, rules or auto (got {decomposer!r})")
    if not input_path.is_file():
        raise fail(f"input file not found: {input_path}")
    try:
        backend = resolve_judge(judge, api_base=api_base, concurrency=concurrency)
    except JudgeConfigError as error:
        raise fail(str(error)) from None
    kind: DecomposerKind = decomposer  # type: ignore[assignment]
    options = PipelineOptions(
        window=window,
        overlap=overlap,
        batch_claims=batch_claims,
        global_verification=global_verification,
        decomposer=kind,
    )
    pipeline = Pipeline(backend, options)
    summary = RunSummary()
    sink: TextIO = open(out, "w", encoding="utf-8") if out else sys.stdout
    try:
        asyncio.run(_write_reports(pipeline, input_path, sink, summary))
    finally:
        if out:
            sink.close()
    if not quiet:
        print_summary(summary, stderr)
    if summary.invalid:
        raise typer.Exit(EXIT_USAGE)
    raise typer.Exit(EXIT_HALLUCINATED if summary.hallucinated else EXIT_OK)


async def _write_reports(pipeline: Pipeline, input_path: Path, sink: TextIO, summary: RunSummary) -> None:
    try:
        async for report in pipeline.run(read_jsonl(input_path)):
            sink.write(dump_report(report) + "\n")
            sink.flush()
            summary.add(report)
    finally:
        await pipeline.backend.aclose()


def main() -> None:
    app()
