"""Markdown tables of an ``rt4 agree --json`` report: vs gold per judge, and the kappa matrix.

    python evals/agreement/table.py evals/results/agreement/faithbench_test.json \
        > evals/results/agreement/faithbench_test.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from rt4chart.analysis.agreement import AgreementReport, Statistic
from rt4chart.report.agreement_view import kappa_matrix


def cell(statistic: Statistic) -> str:
    interval = "" if statistic.ci_low is None else f" [{statistic.ci_low:.3f}, {statistic.ci_high:.3f}]"
    return f"{statistic.value:.3f}{interval}" + (" !" if statistic.warnings else "")


def markdown(report: AgreementReport) -> str:
    lines = [
        f"{report.items} items ({report.level} level, {report.scale}); {report.gold_items} with gold; "
        f"95% CIs: {report.resamples} bootstrap resamples of items, seed {report.seed}.",
        "",
        "| judge | n | flagged | sensitivity | specificity | balanced accuracy | kappa vs gold |",
        "|---|---:|---:|---|---|---|---|",
    ]
    for row in report.gold:
        lines.append(
            f"| {row.judge} | {row.n} | {row.predicted_positive_rate:.1%} | {cell(row.sensitivity)} | "
            f"{cell(row.specificity)} | {cell(row.balanced_accuracy)} | {cell(row.kappa)} |"
        )
    lines += [
        "",
        f"Fleiss' kappa {cell(report.fleiss_kappa)}; Krippendorff's alpha {cell(report.krippendorff_alpha)}.",
        "",
        "Cohen's kappa between judges:",
        "",
        "| judge | " + " | ".join(f"[{n}]" for n in range(1, len(report.judges) + 1)) + " |",
        "|---|" + "---:|" * len(report.judges),
    ]
    for number, (judge, row) in enumerate(zip(report.judges, kappa_matrix(report), strict=True), start=1):
        lines.append(f"| [{number}] {judge} | " + " | ".join(f"{v:.2f}" for v in row) + " |")
    warnings = sorted({w for row in report.gold for s in (row.sensitivity, row.specificity) for w in s.warnings})
    if warnings:
        lines += ["", *[f"! {w}" for w in warnings]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(AgreementReport.model_validate_json(Path(sys.argv[1]).read_text(encoding="utf-8"))), end="")
