"""Terminal tables and plots of agreement reports (``rt4 agree``). A reporting module: it prints."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rt4chart.analysis.agreement import AgreementReport, RunsReport, Statistic
from rt4chart.analysis.review_agreement import ReviewAgreement
from rt4chart.report.layout import print_rows


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed (the ``plot`` extra)."""


def _value(statistic: Statistic) -> str:
    mark = " !" if statistic.warnings else ""
    return f"{statistic.value:.3f}{mark}"


def _interval(statistic: Statistic) -> str:
    if statistic.ci_low is None or statistic.ci_high is None:
        return ""
    return f"[{statistic.ci_low:.3f}, {statistic.ci_high:.3f}]"


def kappa_matrix(report: AgreementReport) -> list[list[float]]:
    """Judges x judges Cohen's kappa, 1 on the diagonal."""
    position = {judge: index for index, judge in enumerate(report.judges)}
    matrix = [[1.0 if i == j else 0.0 for j in range(len(report.judges))] for i in range(len(report.judges))]
    for pair in report.pairs:
        i, j = position[pair.first], position[pair.second]
        matrix[i][j] = matrix[j][i] = pair.kappa.value
    return matrix


def print_agreement(report: AgreementReport, console: Console) -> None:
    """The kappa matrix, pairwise agreement, label distributions and the vs-gold table."""
    what = f"{report.level} level, {'hallucinated yes/no' if report.scale == 'hallucinated' else '3-way label'}"
    console.print(f"[bold]Agreement[/bold] ({what}): {report.items} items", highlight=False)
    if report.level == "claim":
        console.print(
            f"claims aligned {report.alignment}; {report.unaligned} claims could not be aligned", highlight=False
        )
    # Tables when they fit the console whole, else lists (layout.print_rows): no judge name is split.
    numbers = [f"[{number}]" for number in range(1, len(report.judges) + 1)]
    print_rows(console, ["judge", *numbers], [
        [escape(f"{number} {judge}"), *[f"{value:.2f}" for value in row]]
        for number, judge, row in zip(numbers, report.judges, kappa_matrix(report), strict=True)
    ], title="Cohen's kappa (rows x columns)", right=numbers)
    figures = ["n", "observed", "kappa", "kappa 95% CI"]
    print_rows(console, ["judge", "judge", *figures], [
        [escape(pair.first), escape(pair.second), str(pair.kappa.n), _value(pair.observed), _value(pair.kappa),
         _interval(pair.kappa)]
        for pair in report.pairs
    ], title="pairs", right=figures)
    overall = (("Fleiss' kappa", report.fleiss_kappa), ("Krippendorff's alpha", report.krippendorff_alpha))
    for name, statistic in overall:
        console.print(f"{name} {_value(statistic)} {_interval(statistic)} (n={statistic.n})", highlight=False)
    counted = [*report.labels, "missing"]
    print_rows(console, ["judge", *counted], [
        [escape(d.judge), *[str(d.counts[label]) for label in report.labels], str(d.missing)]
        for d in report.distributions
    ], title="labels per judge", right=counted)
    if report.gold:
        against = ["n", "flagged", "sensitivity", "specificity", "balanced acc.", "kappa"]
        print_rows(console, ["judge", *against], [
            [escape(comparison.judge), str(comparison.n), f"{comparison.predicted_positive_rate:.1%}",
             *[f"{_value(s)} {_interval(s)}" for s in (comparison.sensitivity, comparison.specificity,
                                                         comparison.balanced_accuracy, comparison.kappa)]]
            for comparison in report.gold
        ], title=f"against gold ({report.gold_items} items with gold; positive = hallucinated)", right=against)
    warnings = sorted({w for s in _statistics(report) for w in s.warnings})
    if warnings:
        console.print("! " + "\n! ".join(warnings), highlight=False)
    if report.resamples:
        console.print(f"95% CIs: {report.resamples} bootstrap resamples of items, seed {report.seed}", highlight=False)


def _statistics(report: AgreementReport) -> list[Statistic]:
    figures = [report.fleiss_kappa, report.krippendorff_alpha]
    for pair in report.pairs:
        figures += [pair.observed, pair.kappa]
    for row in report.gold:
        figures += [row.sensitivity, row.specificity, row.balanced_accuracy, row.kappa]
    return figures


def print_runs(report: RunsReport, console: Console) -> None:
    """Per-judge figures over repeated runs and the paired differences between judges."""
    console.print(f"[bold]Repeated runs[/bold]: {report.samples} samples with gold judged by every run")
    rows = [
        [judge.judge, str(len(judge.files)),
         *[f"{f.mean:.3f} ± {f.std:.3f} [{f.low:.3f}, {f.high:.3f}]" for f in (judge.f1, judge.balanced_accuracy)]]
        for judge in report.judges
    ]
    if report.flag_everything_f1 is not None:
        rows.append(["baseline: flag every answer", "-", f"{report.flag_everything_f1:.3f}", "0.500"])
    figures = ["runs", "answer F1", "balanced accuracy"]
    print_rows(console, ["judge", *figures], rows, title="per judge over runs: mean ± sd [lowest, highest]",
               right=figures)
    if not report.differences:
        return
    differences = [
        [row.first, row.second, row.metric, f"{row.difference.value:+.3f}", _interval(row.difference),
         "-" if row.welch_t is None else f"{row.welch_t:.2f}", "-" if row.welch_p is None else f"{row.welch_p:.3g}"]
        for row in report.differences
    ]
    numbers = ["difference", "95% CI", "Welch t", "p"]
    print_rows(console, ["first", "second", "metric", *numbers], differences,
               title="first minus second (paired bootstrap over samples; Welch's t over runs)", right=numbers)
    warnings = sorted({w for row in report.differences for w in row.warnings})
    if warnings:
        console.print("! " + "\n! ".join(warnings), highlight=False)


def plot_agreement(report: AgreementReport, path: Path) -> None:
    """A kappa heatmap and, with gold, each judge's sensitivity against its specificity, as one PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise PlotUnavailableError(
            f"--plot needs matplotlib ({error}); pip install 'rt4chart[plot]'"
        ) from None
    size = len(report.judges)
    panels = 2 if report.gold else 1
    figure, axes = plt.subplots(1, panels, figsize=(5 + 0.45 * size + 5 * (panels - 1), 4 + 0.35 * size),
                                squeeze=False)
    heat = axes[0][0]
    image = heat.imshow(kappa_matrix(report), vmin=-1.0, vmax=1.0, cmap="RdBu")
    heat.set_xticks(range(size), [str(n) for n in range(1, size + 1)])
    heat.set_yticks(range(size), [f"[{n}] {judge[:40]}" for n, judge in enumerate(report.judges, start=1)])
    for i, row in enumerate(kappa_matrix(report)):
        for j, value in enumerate(row):
            heat.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
    heat.set_title(f"Cohen's kappa, {report.level} level ({report.items} items)")
    figure.colorbar(image, ax=heat, shrink=0.8)
    if report.gold:
        rates = axes[0][1]
        for number, comparison in enumerate(report.gold, start=1):
            point = (comparison.specificity.value, comparison.sensitivity.value)
            rates.scatter(*point)
            rates.annotate(str(number), point,
                           textcoords="offset points", xytext=(4, 4), fontsize=8)
        rates.plot([0, 1], [1, 0], linestyle=":", color="grey")  # balanced accuracy 0.5
        rates.set_xlim(-0.02, 1.02)
        rates.set_ylim(-0.02, 1.02)
        rates.set_xlabel("specificity")
        rates.set_ylabel("sensitivity")
        rates.set_title("against gold (dotted: balanced accuracy 0.5)")
    figure.tight_layout()
    figure.savefig(path, dpi=120, format="png")  # the named file, never NAME.png beside it
    plt.close(figure)


def print_review_agreement(report: ReviewAgreement, console: Console) -> None:
    """The judge against its reviewers: kappa, then precision and recall per label, each with the
    reviews behind it, and what was left out."""
    scope = "weighted by the plan's inclusion probabilities: estimates for the whole audit" if report.weighted else (
        "unweighted: figures describe the reviewed claims only (no review plan)"
    )
    console.print(f"[bold]{report.judge} against {report.used} reviews[/bold] ({scope})", highlight=False)
    console.print(
        f"left out: {report.unsure} unsure, {report.without_judge_label} on claims without a judge label "
        f"({report.reviews} reviews read)",
        highlight=False,
    )
    overall = Table(title="judge vs reviewer (3-way label)", title_justify="left")
    for column in ("figure", "value", "95% CI", "reviews"):
        overall.add_column(column, justify="left" if column == "figure" else "right")
    for name, statistic in (("Cohen's kappa", report.kappa), ("observed agreement", report.agreement)):
        overall.add_row(name, _value(statistic), _interval(statistic), str(statistic.n))
    console.print(overall)
    table = Table(title="per label (the judge's label against the reviewer's)", title_justify="left")
    for column in ("label", "precision", "95% CI", "reviews", "recall", "95% CI ", "reviews "):
        table.add_column(column, justify="left" if column == "label" else "right")
    for figures in report.labels:
        table.add_row(
            figures.label,
            _value(figures.precision), _interval(figures.precision), str(figures.precision.n),
            _value(figures.recall), _interval(figures.recall), str(figures.recall.n),
        )
    console.print(table)
    named = [(f"{name}: ", statistic) for name, statistic in _review_statistics(report)]
    for warning in report.warnings + [name + w for name, statistic in named for w in statistic.warnings]:
        console.print(f"! {warning}", highlight=False, markup=False)


def _review_statistics(report: ReviewAgreement) -> list[tuple[str, Statistic]]:
    per_label = [
        (f"{name} {figures.label}", statistic)
        for figures in report.labels
        for name, statistic in (("precision", figures.precision), ("recall", figures.recall))
    ]
    return [("kappa", report.kappa), ("agreement", report.agreement), *per_label]
