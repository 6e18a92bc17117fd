"""The commands that read an audit's records: ``rt4 report`` (HTML, JUnit, GitHub annotations and the
exit of rt4 verify, from existing records), ``export`` (the records as a CSV table), ``show`` (the records
on a terminal), ``diff`` (what changed between two audits) and ``review-plan`` (which claims to review)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from rt4chart.cli.common import SeedOption, _guard_outputs, _print_reason, _read_input
from rt4chart.cli.flags import OUTPUT_FLAGS, fail, run_spec, stderr
from rt4chart.options import FailOn, HelpPanel, ShowOnly
from rt4chart.runs.spec import RunSpec

if TYPE_CHECKING:
    from rt4chart.report.audited import AuditedSample

commands = typer.Typer()

ResultsArgument = Annotated[Path, typer.Argument(metavar="RESULTS.jsonl", help="Output of rt4 verify.")]
ResultsInputOption = Annotated[
    Path | None,
    typer.Option("--input", help="The input file the results audit: shows answers and contexts, and lets annotations point at its lines."),
]


def _read_audited(results: Path, input_path: Path | None) -> list[AuditedSample]:
    from rt4chart.report.audited import ResultsError, read_results

    items = _read_input(input_path) if input_path is not None else None
    try:
        return read_results(results, items)
    except ResultsError as error:
        raise fail(str(error)) from None


@commands.command()
@run_spec(*OUTPUT_FLAGS[1:])
def report(
    results: ResultsArgument,
    input_path: ResultsInputOption = None,
    html: Annotated[Path | None, typer.Option(help="Write the self-contained HTML report here.", rich_help_panel=HelpPanel.OUTPUTS)] = None,
    *,
    spec: RunSpec,
) -> None:
    """Turn existing results into an HTML report, JUnit XML or GitHub annotations; exit as rt4 verify would."""
    from rt4chart.report.outputs import baseline_problem
    from rt4chart.runs.run import report_records

    junit, github = spec.outputs.junit, spec.outputs.github
    if html is None and junit is None and not github:
        raise fail("nothing to write: give --html FILE, --junit FILE or --github")
    guarded = _guard_outputs({"--html": html, "--junit": junit}, [results, input_path])
    html, junit = guarded.get("--html"), guarded.get("--junit")
    audited = _read_audited(results, input_path)
    outputs = spec.outputs.model_copy(update={
        "html": html, "junit": junit, "input_file": str(input_path) if input_path else None,
        "title": f"rt4chart audit of {(input_path or results).name}",
    })
    if problem := baseline_problem(outputs):
        raise fail(problem)
    outcome = report_records(outputs, audited, Console())
    written = [str(path) for path in (html, junit) if path is not None]
    if written:
        stderr.print("wrote " + ", ".join(written), highlight=False, markup=False, soft_wrap=True)
    _print_reason(outcome)
    raise typer.Exit(outcome.exit_code)


@commands.command()
def export(
    results: ResultsArgument,
    csv_path: Annotated[Path | None, typer.Option("--csv", metavar="FILE.csv", help="Write the records as CSV here (columns: README, 'Export').")] = None,
    level: Annotated[str, typer.Option(metavar="claim|answer", help="One row per claim (claim) or per answer (answer).")] = "claim",
) -> None:
    """Export existing results as a table: CSV, one row per claim or per answer."""
    from rt4chart.records.io import PredictionsError, read_predictions
    from rt4chart.report.tables import TableLevel, write_csv

    if csv_path is None:
        raise fail("nothing to write: give --csv FILE.csv")
    if level not in set(TableLevel):
        raise fail(f"--level must be one of {', '.join(TableLevel)} (got {level!r})")
    csv_path = _guard_outputs({"--csv": csv_path}, [results])["--csv"]
    try:
        records = read_predictions(results)
    except PredictionsError as error:
        raise fail(str(error)) from None
    write_csv(csv_path, records, level)
    stderr.print(f"wrote {csv_path} ({len(records)} answers, one row per {level})", highlight=False, markup=False,
                 soft_wrap=True)


@commands.command()
def diff(
    base: Annotated[Path, typer.Argument(metavar="BASE.jsonl", help="The earlier audit (e.g. the main branch's artifact).")],
    new: Annotated[Path, typer.Argument(metavar="NEW.jsonl", help="The audit to compare with it.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole diff as JSON on stdout.")] = False,
    markdown: Annotated[Path | None, typer.Option(help="Write a Markdown summary here (a PR comment, $GITHUB_STEP_SUMMARY).")] = None,
    html: Annotated[Path | None, typer.Option(help="Write the self-contained HTML diff here.")] = None,
    resamples: Annotated[int, typer.Option(min=1, help="Paired bootstrap resamples of the rate difference's 95% CI.")] = 10_000,
    seed: SeedOption = 0,
) -> None:
    """What changed between two audits of the same answers, and whether the change of the hallucination rate is real."""
    from rt4chart.analysis.diff import DiffError, diff_files
    from rt4chart.report.diff_view import diff_markdown, print_diff, write_diff_html

    guarded = _guard_outputs({"--markdown": markdown, "--html": html}, [base, new])
    try:
        result = diff_files(base, new, resamples=resamples, seed=seed)
    except DiffError as error:
        raise fail(str(error)) from None
    title = f"rt4chart diff: {base.name} -> {new.name}"
    if "--markdown" in guarded:
        from rt4chart.records.io import write_text_atomically

        write_text_atomically(guarded["--markdown"], [diff_markdown(result, title)])
    if "--html" in guarded:
        write_diff_html(guarded["--html"], result, title)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        print_diff(result, Console())


@commands.command()
def show(
    results: ResultsArgument,
    input_path: ResultsInputOption = None,
    sample_id: Annotated[str | None, typer.Option("--id", help="Only the sample with this id.")] = None,
    only: Annotated[ShowOnly | None, typer.Option(help="Only the samples failing this --fail-on policy.")] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Every sample in full (past 10 samples, passing ones take one line).")] = False,
) -> None:
    """Print results readably: each answer with its claims coloured by label, and their evidence."""
    from rt4chart.report.terminal_view import print_samples

    audited = _read_audited(results, input_path)
    if sample_id is not None:
        audited = [item for item in audited if item.report.id == sample_id]
        if not audited:
            raise fail(f"no sample with id {sample_id!r} in {results}")
    if only is not None:
        audited = [item for item in audited if item.fails(FailOn(only.value))]
    print_samples(audited, Console(), show_all=show_all)


@commands.command("review-plan")
def review_plan(
    results: ResultsArgument,
    input_path: ResultsInputOption = None,
    n: Annotated[int, typer.Option("--n", min=1, help="Claims to review.")] = 60,
    seed: Annotated[int, typer.Option(help="Seed of the draw (the same audit, --n and seed give the same plan).")] = 0,
    report: Annotated[Path | None, typer.Option(help="Write an HTML report of the planned claims, with review controls.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the planned claims as JSONL (with their inclusion probabilities).")] = None,
) -> None:
    """Pick claims to review so the judge's precision and recall per label can be estimated from few reviews."""
    from rt4chart.report.review_plan import ReviewPlanError, print_plan, write_review_plan

    if report is None and out is None:
        raise fail("nothing to write: give --report FILE.html and/or --out FILE.jsonl")
    guarded = _guard_outputs({"--report": report, "--out": out}, [results, input_path])
    try:
        plan = write_review_plan(_read_audited(results, input_path), n, seed, guarded.get("--report"), guarded.get("--out"))
    except ReviewPlanError as error:
        raise fail(str(error)) from None
    print_plan(plan, Console(stderr=True))
    stderr.print("wrote " + ", ".join(str(path) for path in guarded.values()), highlight=False, markup=False, soft_wrap=True)
