"""Calibration of the embedded verifier's answer-level probability, from saved ``rt4 eval`` records.

    rt4 eval ragtruth-qa --split test --save-predictions --out evals/results
    python evals/embedded/calibration.py --head question \\
        evals/results/ragtruth-qa_test_embedded-<hash>_rt4chart.predictions.jsonl

For every answer, the claims' P(not supported) (each claim's ``score.p_unsupported``, the
probability the record calls calibrated: ``rt4chart.method.settlement.claim_unsupported_score``) gives the answer-level
probability of the shipped head (``Head.answer_probability``). Prints its expected calibration
error (10 equal-width bins), Brier score and AUROC against gold, and writes a reliability plot
(PNG) next to the predictions' result files, under evals/results/.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from sklearn.metrics import brier_score_loss, roc_auc_score

from rt4chart.judges.embedded.model import HeadName, load_model
from rt4chart.method.settlement import claim_unsupported_score
from rt4chart.records.io import read_predictions

RESULTS_DIR = Path(__file__).resolve().parents[1] / "results"
BINS = 10


def answer_probabilities(path: Path, head_name: HeadName) -> tuple[np.ndarray, np.ndarray]:
    """(P(answer hallucinated), gold) for every scored record of a predictions file."""
    head = load_model().heads[head_name]
    probabilities, gold = [], []
    for report in read_predictions(path):
        if report.hallucinated is None or report.gold is None or report.gold.hallucinated is None:
            continue
        scores = [claim_unsupported_score(claim) for claim in report.claims]
        if any(score is None for score in scores):
            raise SystemExit(f"{path}: record {report.id} has a claim without confidence (not an embedded run)")
        probabilities.append(head.answer_probability([s for s in scores if s is not None]))
        gold.append(report.gold.hallucinated)
    return np.array(probabilities), np.array(gold, dtype=float)


def reliability(probabilities: np.ndarray, gold: np.ndarray) -> list[tuple[int, float, float]]:
    """Per equal-width bin with members: (members, mean probability, observed rate)."""
    which = np.minimum((probabilities * BINS).astype(int), BINS - 1)
    return [
        (int((which == b).sum()), float(probabilities[which == b].mean()), float(gold[which == b].mean()))
        for b in range(BINS)
        if (which == b).any()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("predictions", type=Path)
    parser.add_argument("--head", choices=["question", "no_question"], required=True)
    parser.add_argument("--name", default=None, help="plot file stem (default: the predictions' stem)")
    args = parser.parse_args()
    probabilities, gold = answer_probabilities(args.predictions, args.head)
    bins = reliability(probabilities, gold)
    ece = sum(n / len(gold) * abs(rate - mean) for n, mean, rate in bins)
    stem = args.name or args.predictions.name.removesuffix(".predictions.jsonl")
    plot = RESULTS_DIR / f"{stem}.reliability.png"
    figure, axes = plt.subplots(figsize=(4.5, 4.5))
    axes.plot([0, 1], [0, 1], linestyle="--", color="grey", label="perfect calibration")
    axes.plot([m for _, m, _ in bins], [r for _, _, r in bins], marker="o", label="embedded verifier")
    for n, mean, rate in bins:
        axes.annotate(str(n), (mean, rate), textcoords="offset points", xytext=(4, -10), fontsize=7)
    axes.set_xlabel("predicted P(answer hallucinated)")
    axes.set_ylabel("observed share hallucinated")
    axes.set_title(f"{stem}\nECE {ece:.3f} (n={len(gold)}, {BINS} bins)", fontsize=8)
    axes.legend(loc="upper left", fontsize=7)
    figure.tight_layout()
    figure.savefig(plot, dpi=120)
    print(f"command: {shlex.join(['python', 'evals/embedded/calibration.py', *sys.argv[1:]])}")
    print(f"answers: {len(gold)}, hallucinated: {int(gold.sum())}")
    print(f"answer probability: ECE {ece:.4f}, Brier {brier_score_loss(gold, probabilities):.4f}, "
          f"AUROC {roc_auc_score(gold, probabilities):.4f}")
    print("bins (members, mean predicted, observed): " + "; ".join(f"{n} {m:.2f} {r:.2f}" for n, m, r in bins))
    print(f"plot: {plot.relative_to(RESULTS_DIR.parent.parent)}")


if __name__ == "__main__":
    main()
