"""``rt4 agree AUDIT.jsonl --reviews REVIEWS.jsonl``: the judge against its reviewers.

Each review (rt4chart/analysis/review.py) is matched to its claim in the audit (by record id and claim index,
its text checked). Figures, over the three labels: Cohen's kappa and observed agreement of judge
and reviewer, and per label the judge's precision (of the claims it gave that label, the share the
reviewer gave it too) and recall (of the claims the reviewer gave that label, the share the judge
found), each with a seeded percentile-bootstrap 95% interval that resamples reviews (the package's
one bootstrap, :func:`rt4chart.analysis.metrics.bootstrap_interval`) and the number of reviews behind it.

Reviews from a plan (``rt4 review-plan``) carry their inclusion probability pi; each then counts
1 / pi times (Horvitz-Thompson): every cell of the judge-by-reviewer table is an unbiased estimate of
that cell's count in the whole audit, so precision, recall and kappa (ratios of those cells)
describe the whole audit, not the claims that happened to be reviewed. Reviews without one (a
person reviewing a report as it came) count once, and the figures describe the reviewed claims.
``unsure`` reviews are left out of every figure and counted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, Field

from rt4chart.analysis.agreement import THREE_WAY, Statistic
from rt4chart.analysis.metrics import bootstrap_interval
from rt4chart.analysis.review import ClaimReview, claim_text, duplicate_record_ids, read_reviews, record_id, run_key
from rt4chart.records.io import read_records
from rt4chart.types import AuditRecord


class ReviewMatchError(ValueError):
    """Reviews that do not fit the audit (a claim it does not have, a mix of planned and unplanned)."""


class LabelFigures(BaseModel):
    """The judge's precision and recall on one label, against the reviewers."""

    label: str
    """The label."""
    precision: Statistic
    """Of the claims the judge gave this label, the (weighted) share the reviewer gave it too; ``n``:
    the reviews behind it (claims the judge gave this label)."""
    recall: Statistic
    """Of the claims the reviewer gave this label, the (weighted) share the judge gave it too; ``n``:
    the reviews behind it (claims the reviewer gave this label)."""


class ReviewAgreement(BaseModel):
    """``rt4 agree --reviews``: the judge against human reviews of its claims."""

    judge: str
    """The judge the audit records name."""
    run: str
    """The audit's run key."""
    weighted: bool
    """Reviews carry inclusion probabilities (from a plan) and count 1 / pi each: the figures estimate
    the whole audit; ``False``: every review counts once and the figures describe the reviewed claims."""
    reviews: int
    """Reviews read."""
    used: int
    """Reviews behind the figures (not unsure, on a claim the judge labelled)."""
    unsure: int
    """Reviews marked unsure: left out, counted."""
    without_judge_label: int
    """Reviews of claims the judge gave no label: left out, counted."""
    kappa: Statistic
    """Cohen's kappa of judge and reviewer over the three labels, from the (weighted) table."""
    agreement: Statistic
    """Observed agreement: the (weighted) share of claims where judge and reviewer agree."""
    labels: list[LabelFigures]
    """Precision and recall per label."""
    confusion: list[list[float]]
    """The (weighted) table: rows the judge's label, columns the reviewer's, in the labels' order."""
    warnings: list[str] = Field(default_factory=list)
    """What may make the figures mean less than they seem (another run's reviews, a changed verdict)."""


TableFigure = Callable[[NDArray[np.float64]], float | None]
"""A figure of a weighted judge-by-reviewer table (``None`` where undefined)."""


def _table(judge: NDArray[np.int64], reviewer: NDArray[np.int64], weight: NDArray[np.float64]) -> NDArray[np.float64]:
    k = len(THREE_WAY)
    counts: NDArray[np.float64] = np.bincount(judge * k + reviewer, weights=weight, minlength=k * k).astype(float)
    return counts.reshape(k, k)


def _share(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def _kappa(table: NDArray[np.float64]) -> float | None:
    total = float(table.sum())
    if total <= 0:
        return None
    shares = table / total
    expected = float(shares.sum(axis=1) @ shares.sum(axis=0))
    if expected >= 1.0:
        return None
    return (float(np.trace(shares)) - expected) / (1.0 - expected)


def _statistic(value: float | None, n: int, warning: str, interval: tuple[float | None, float | None]) -> Statistic:
    if value is None:
        return Statistic(value=0.0, n=n, warnings=[warning])
    low, high = interval
    warnings = []
    if low is not None and low == high and n > 0:
        # Every resample agreed (all reviews on one side): the percentile interval has no width,
        # though the truth may be up to 1 - 0.05^(1/n) away (the exact one-sided 95% bound when none
        # of n trials goes the other way; the rule of three's 3/n approximates it for large n only,
        # and passes 1 below n = 4).
        bound = 1 - 0.05 ** (1 / n)
        warnings.append(f"an interval of zero width from {n} reviews understates the uncertainty (the truth may be "
                        f"up to {bound:.2f} away: 1 - 0.05^(1/{n}), the exact form of the rule of three)")
    return Statistic(value=value, ci_low=low, ci_high=high, n=n, warnings=warnings)


def estimate_agreement(
    judge: NDArray[np.int64],
    reviewer: NDArray[np.int64],
    weight: NDArray[np.float64],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[Statistic, Statistic, list[LabelFigures], NDArray[np.float64]]:
    """Kappa, observed agreement, per-label precision/recall with intervals, and the weighted table,
    from aligned label codes (indices into ``THREE_WAY``) and weights (1 / pi, or ones)."""
    n = int(judge.size)

    def on(indices: NDArray[np.int64]) -> NDArray[np.float64]:
        return _table(judge[indices], reviewer[indices], weight[indices])

    def interval(figure: TableFigure) -> tuple[float | None, float | None]:
        return bootstrap_interval(lambda indices: figure(on(indices)), n, resamples, seed)

    table = _table(judge, reviewer, weight)

    def agreement_of(t: NDArray[np.float64]) -> float | None:
        return _share(float(np.trace(t)), float(t.sum()))

    kappa = _statistic(_kappa(table), n, "no reviews, or one label throughout: kappa undefined, reported as 0",
                       interval(_kappa))
    agreement = _statistic(agreement_of(table), n, "no reviews: agreement undefined, reported as 0",
                           interval(agreement_of))
    labels: list[LabelFigures] = []
    for k, label in enumerate(THREE_WAY):
        def precision_of(t: NDArray[np.float64], k: int = k) -> float | None:
            return _share(float(t[k, k]), float(t[k, :].sum()))

        def recall_of(t: NDArray[np.float64], k: int = k) -> float | None:
            return _share(float(t[k, k]), float(t[:, k].sum()))

        labels.append(
            LabelFigures(
                label=label,
                precision=_statistic(precision_of(table), int((judge == k).sum()),
                                     f"no reviewed claim judged {label}: precision undefined, reported as 0",
                                     interval(precision_of)),
                recall=_statistic(recall_of(table), int((reviewer == k).sum()),
                                  f"no reviewer labelled a claim {label}: recall undefined, reported as 0",
                                  interval(recall_of)),
            )
        )
    return kappa, agreement, labels, table


def _judge_name(records: Sequence[AuditRecord]) -> str:
    names = sorted({record.judge for record in records if record.judge})
    return ", ".join(names) or "unknown judge"


def review_agreement(
    records: Sequence[AuditRecord], reviews: Sequence[ClaimReview], *, resamples: int = 1000, seed: int = 0
) -> ReviewAgreement:
    """The judge of ``records`` against ``reviews`` of their claims (see the module's docstring)."""
    if not reviews:
        raise ReviewMatchError("the review file holds no review")
    if duplicated := sorted(duplicate_record_ids(records)):
        raise ReviewMatchError(f"record ids that are not unique cannot be matched: {', '.join(duplicated[:5])}")
    planned = {review.inclusion_probability is not None for review in reviews}
    if len(planned) > 1:
        raise ReviewMatchError(
            "some reviews come from a review plan (they carry an inclusion probability) and some do not: "
            "weighted and unweighted reviews cannot be pooled; give the plan's reviews only"
        )
    by_id = {record_id(record): record for record in records}
    run = run_key(records)
    warnings: list[str] = []
    if other := sorted({review.run for review in reviews} - {run}):
        warnings.append(f"reviews made on another rendering of the audit (run {', '.join(other)}; this audit is {run})"
                        ": their claims were matched by text")
    latest: dict[tuple[str, int], ClaimReview] = {}
    for review in reviews:
        record = by_id.get(review.record_id)
        if record is None or review.claim_index >= len(record.claims):
            raise ReviewMatchError(f"a review names claim {review.claim_index} of record {review.record_id!r}, "
                                   "which the audit does not have: give the audit the reviews were made on")
        if (audited := claim_text(record.claims[review.claim_index])) != review.claim:
            raise ReviewMatchError(f"the review of claim {review.claim_index} of record {review.record_id!r} is of "
                                   f"{review.claim!r}, the audit's claim is {audited!r}")
        latest[(review.record_id, review.claim_index)] = review  # a claim reviewed twice: the later review counts
    if len(latest) < len(reviews):
        warnings.append(f"{len(reviews) - len(latest)} claims reviewed more than once: the last review of each counts")
    changed = unsure = unlabelled = 0
    judge, reviewer, weight = [], [], []
    for (identifier, index), review in latest.items():
        label = by_id[identifier].claims[index].label
        changed += (label.value if label else None) != review.judge_label
        if review.label == "unsure":
            unsure += 1
        elif label is None:
            unlabelled += 1
        else:
            judge.append(THREE_WAY.index(label.value))
            reviewer.append(THREE_WAY.index(review.label))
            weight.append(1.0 / review.inclusion_probability if review.inclusion_probability else 1.0)
    if changed:
        warnings.append(f"{changed} reviewed claims have another judge label in the audit than in their review: "
                        "the audit's label is the one compared")
    kappa, agreement, labels, table = estimate_agreement(
        np.array(judge, dtype=np.int64), np.array(reviewer, dtype=np.int64), np.array(weight, dtype=float),
        resamples=resamples, seed=seed,
    )
    return ReviewAgreement(
        judge=_judge_name(records), run=run, weighted=planned == {True}, reviews=len(reviews), used=len(judge),
        unsure=unsure, without_judge_label=unlabelled, kappa=kappa, agreement=agreement, labels=labels,
        confusion=[[float(x) for x in row] for row in table], warnings=warnings,
    )


def review_agreement_files(audit: Path, reviews: Path, *, resamples: int = 1000, seed: int = 0) -> ReviewAgreement:
    """:func:`review_agreement` of an audit's records file and a review file; a line that is neither a
    record nor a review is a :class:`ReviewMatchError` (or :class:`rt4chart.analysis.review.ReviewFileError`)."""
    records: list[AuditRecord] = []
    for line in read_records(audit):
        if line.report is None:
            raise ReviewMatchError(f"{audit} line {line.number}: {line.problem}")
        records.append(line.report)
    return review_agreement(records, read_reviews(reviews), resamples=resamples, seed=seed)
