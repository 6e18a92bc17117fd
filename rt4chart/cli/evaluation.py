"""The commands that measure judges: ``rt4 eval`` (audit a labelled dataset and score it), ``score``
(score existing records), ``convert`` (a labelled dataset as input JSONL), ``calibrate`` (a judge's
operating point on your labels), ``agree`` (agreement between judges, and with gold or reviews) and
``compare`` (every judge verifies one claim set)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from rt4chart.analysis.datasets import DATA_LOCATION_HELP, DATASET_NAMES
from rt4chart.cli.common import (
    InputArgument,
    ResamplesOption,
    SeedOption,
    _guard_outputs,
    _print_reason,
    _print_stop,
    _read_input,
    _run,
)
from rt4chart.cli.flags import AUDIT_FLAGS, CACHE_FLAGS, fail, run_spec, stderr
from rt4chart.options import HelpPanel
from rt4chart.runs.spec import RunSpec

commands = typer.Typer()

DatasetArgument = Annotated[str, typer.Argument(help=f"Dataset: {', '.join(DATASET_NAMES)}.")]
DatasetPathOption = Annotated[
    Path | None,
    typer.Option("--path", help=DATA_LOCATION_HELP),
]
SplitOption = Annotated[str | None, typer.Option(help="dev or test (ragtruth: train or test).")]
LimitOption = Annotated[int | None, typer.Option(help="Only the first N samples of the split.")]


# Not the per-user cache by default: rt4 eval runs are independent unless asked otherwise.
@commands.command("eval")
@run_spec("cache.cache_dir", "judge", "api_base", "limits.concurrency", "limits.batch", "limits.batch_poll_s", "cache.cache_url", *AUDIT_FLAGS,
          per_user_cache=False,
          help_texts={"cache.cache_dir": "Cache judge calls here (default: no cache, so runs are independent)."})
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
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.", rich_help_panel=HelpPanel.OUTPUTS)] = False,
    *,
    spec: RunSpec,
) -> None:
    """Audit a labelled dataset, print every metric with 95% CIs, and record the result."""
    from rt4chart.analysis.datasets import DatasetError
    from rt4chart.report.progress import ProgressObserver, print_metrics
    from rt4chart.runs.evaluation import EvalConfig, aevaluate, load_samples, result_details, write_result

    if (limit is not None and limit < 0) or resamples < 0:
        raise fail("--limit and --resamples must not be negative")
    config = EvalConfig(
        dataset=dataset, path=str(path) if path else None, split=split, limit=limit, resamples=resamples, seed=seed,
        tag=tag, **spec.model_dump(include={"judge", "api_base", "options"}),
    )
    try:
        samples = load_samples(config)
    except DatasetError as error:
        raise fail(str(error)) from None
    outcome = _run(aevaluate(spec, config, samples, observer=ProgressObserver(stderr, enabled=not quiet)),
                   interrupted_note="no result was written (an incomplete evaluation is not a result)")
    result = outcome.payload
    if result is not None:
        title = f"{dataset} {split or 'all'}: {result.judge}, {config.variant}"
        print_metrics(result.metrics, Console(), title, result_details(result))
        written = write_result(result, results_dir, outcome.reports if save_predictions else None)
        stderr.print("wrote " + ", ".join(str(p) for p in written), highlight=False, markup=False, soft_wrap=True)
    _print_reason(outcome, note="an incomplete evaluation is not a result: none was written")
    raise typer.Exit(outcome.exit_code)


@commands.command()
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
        from rt4chart.records.io import write_text_atomically

        write_text_atomically(out, [result.model_dump_json(indent=2) + "\n"])
        stderr.print(f"wrote {out}", highlight=False, markup=False, soft_wrap=True)


@commands.command()
def convert(
    dataset: DatasetArgument,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output JSONL: rt4 verify input lines (gold kept under \"gold\").")],
    path: DatasetPathOption = None,
    split: SplitOption = None,
    limit: LimitOption = None,
) -> None:
    """Convert a labelled dataset to rt4chart input JSONL (gold labels kept under "gold"), or conversations to one
    line per assistant turn."""
    from rt4chart.analysis.datasets import DatasetError, load_dataset
    from rt4chart.runs.evaluation import write_converted

    out = _guard_outputs({"--out": out}, [path])["--out"]
    try:
        samples = load_dataset(dataset, path, split, limit)
    except DatasetError as error:
        raise fail(str(error)) from None
    write_converted(samples, out)
    stderr.print(f"wrote {len(samples)} samples to {out}", highlight=False, markup=False, soft_wrap=True)


@commands.command()
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

@commands.command()
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
        stderr.print(f"wrote {plot}", highlight=False, markup=False, soft_wrap=True)


@commands.command()
@run_spec("api_base", "limits.concurrency", "limits.batch", "limits.batch_poll_s", *CACHE_FLAGS, *AUDIT_FLAGS)
def compare(
    input_path: InputArgument,
    judges_spec: Annotated[str, typer.Option("--judges", help="Judges to compare, comma-separated (profile, litellm model, scripted:RULES.json).", rich_help_panel=HelpPanel.JUDGE)],
    out_dir: Annotated[Path, typer.Option(help="One output JSONL per judge goes here.")],
    decompose_with: Annotated[str | None, typer.Option(help="Judge that decomposes every answer once (default: the rule decomposer).", rich_help_panel=HelpPanel.JUDGE)] = None,
    resamples: ResamplesOption = 1000,
    seed: SeedOption = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress on stderr.")] = False,
    *,
    spec: RunSpec,
) -> None:
    """Decompose each answer once, have every judge verify that same claim set, then report agreement."""
    from rt4chart.report.agreement_view import print_agreement
    from rt4chart.report.progress import ProgressObserver
    from rt4chart.runs.compare import acompare

    names = [name.strip() for name in judges_spec.split(",") if name.strip()]
    items = _read_input(input_path)
    run = acompare(spec.model_copy(update={"input_file": input_path}), names, items, out_dir,
                   decompose_with=decompose_with, resamples=resamples, seed=seed,
                   observer=ProgressObserver(stderr, enabled=not quiet))
    outcome = _run(run, interrupted_note=f"the records finished so far are in {out_dir}; rt4 compare does not "
                   "resume: rerun it")
    comparison = outcome.payload
    stderr.print("wrote " + ", ".join(str(p) for p in comparison.paths), highlight=False, markup=False, soft_wrap=True)
    for judged in comparison.by_judge:
        if judged.reason != outcome.reason:  # the last line says it
            _print_stop(judged)
    console = Console()
    for report in comparison.agreement:
        print_agreement(report, console)
    _print_reason(outcome)
    raise typer.Exit(outcome.exit_code)
