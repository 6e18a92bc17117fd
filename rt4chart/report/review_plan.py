"""``rt4 review-plan``: which claims of an audit a person should review, so that the judge's
precision and recall per label can be estimated from few reviews, and without bias for the whole
audit.

The plan is a stratified random sample without replacement. Strata: the judge's label, then, within
a label, up to three bands of the judge's confidence in that label (tertiles of the label's claims;
claims with no stated confidence form their own band). Allocation, in two steps, both by one rule
(:func:`allocate`):

1. **Equal per judge label** (leftovers of a label with too few claims go to the others). The
   precision of a label is a proportion over the claims judged so; its interval's width falls as
   one over the square root of the reviews behind it, so equal shares minimise the widest interval
   (exactly when the labels' precisions are alike, roughly otherwise).
   Proportional allocation (a simple random sample) would leave the rare labels, usually the
   contradicted and baseless flags a team acts on, with a handful of reviews.
2. **Neyman within a label** (Neyman 1934): band h gets n_h proportional to N_h * S_h, with
   S_h = sqrt(c_h (1 - c_h)) the anticipated spread of "the judge is right" at the band's mean
   confidence c_h (0.5, the largest, for claims with no confidence), so bands where the judge is
   unsure get more reviews. The integers are found greedily by the largest fall of the estimate's
   variance sum N_h^2 S_h^2 / n_h, which is the exact integer optimum.

Every stratum keeps at least two reviews (or all its claims): every claim of the audit with a judge
label then has a known inclusion probability pi = n_h / N_h > 0, which is what makes the
Horvitz-Thompson estimates of ``rt4 agree --reviews`` unbiased for the whole audit. Claims without a
judge label (failed calls) have nothing to validate and are left out (counted).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

from rt4chart.analysis.review import PlannedClaim, duplicate_record_ids, record_id, run_key
from rt4chart.records.io import write_lines_atomically
from rt4chart.report.audited import AuditedSample
from rt4chart.types import ClaimVerdict, Label

STRATUM_FLOOR = 2
"""Reviews every stratum keeps at least (or all its claims): pi > 0 for every claim."""
CONFIDENCE_BANDS = 3
"""Most confidence bands per judge label."""
NO_CONFIDENCE_SPREAD = 0.5
"""S_h of a band whose claims state no confidence: the largest a proportion can have."""


class ReviewPlanError(ValueError):
    """An audit with nothing to plan (no claim with a judge label), or a plan size below 1."""


class Stratum(BaseModel):
    """One stratum of a plan: its claims in the audit, those drawn, and their inclusion probability."""

    name: str
    """Judge label and confidence band, e.g. ``contradicted, confidence 0.62-0.91``."""
    judge_label: str
    """The judge's label on every claim of the stratum."""
    size: int
    """N_h: claims of the audit in the stratum."""
    sample: int
    """n_h: claims drawn from it."""
    inclusion_probability: float
    """n_h / N_h."""


class ReviewPlan(BaseModel):
    """A review plan: the claims to review and how they were drawn."""

    run: str
    """The audit's run key (:func:`rt4chart.analysis.review.run_key`)."""
    requested: int
    """The ``--n`` asked for (the plan holds fewer when the audit has fewer claims)."""
    seed: int
    """The seed of the draw: the same audit, n and seed give the same plan."""
    strata: list[Stratum]
    """Every stratum, in label then band order."""
    claims: list[PlannedClaim]
    """The claims to review, in the audit's order."""
    without_judge_label: int = Field(default=0)
    """Claims left out because the judge gave them no label."""


def label_confidence(claim: ClaimVerdict) -> float | None:
    """The judge's confidence in the label it gave: a scoring judge's ``p_unsupported`` read for the
    label's side, else its stated ``confidence``; ``None`` when it states neither."""
    if claim.score is not None:
        unsupported = claim.score.p_unsupported
        return 1.0 - unsupported if claim.label == Label.ENTAILED else unsupported
    return claim.confidence


def allocate(sizes: Sequence[int], weights: Sequence[float], total: int, floor: int = STRATUM_FLOOR) -> list[int]:
    """Integers n_h <= sizes[h] summing to ``min(total, sum(sizes))``, at least ``min(floor, size)``
    each, minimising sum weights[h]^2 / n_h: one at a time to the stratum whose variance falls most
    (Neyman allocation when weights are N_h * S_h; equal shares when the weights are equal)."""
    counts = [min(size, floor) for size in sizes]
    left = min(total, sum(sizes)) - sum(counts)
    # The fall of w^2 / n when n grows by one is w^2 / (n (n + 1)); a stratum at 0 falls infinitely.
    def fall(h: int) -> float:
        return float("inf") if counts[h] == 0 else weights[h] ** 2 / (counts[h] * (counts[h] + 1))

    queue = [(-fall(h), h) for h in range(len(sizes)) if counts[h] < sizes[h]]
    heapq.heapify(queue)
    while left > 0 and queue:
        _, h = heapq.heappop(queue)
        counts[h] += 1
        left -= 1
        if counts[h] < sizes[h]:
            heapq.heappush(queue, (-fall(h), h))
    return counts


def _bands(confidences: list[float | None], reviews: int) -> list[tuple[str, list[int]]]:
    """The claims of one label (positions into ``confidences``) split into confidence bands: up to
    :data:`CONFIDENCE_BANDS` tertile bands of those with a confidence (fewer when ``reviews`` cannot
    give each band its floor), and one band of those without."""
    stated = [i for i, value in enumerate(confidences) if value is not None]
    unstated = [i for i, value in enumerate(confidences) if value is None]
    bands: list[tuple[str, list[int]]] = []
    count = max(1, min(CONFIDENCE_BANDS, reviews // STRATUM_FLOOR - bool(unstated), len(stated)))
    if stated:
        values = np.array([confidences[i] for i in stated], dtype=float)
        edges = np.unique(np.quantile(values, np.linspace(0, 1, count + 1)[1:-1]))
        which = np.searchsorted(edges, values, side="right")
        for band in range(len(edges) + 1):
            members = [stated[i] for i in np.flatnonzero(which == band)]
            if members:
                low, high = min(confidences[i] for i in members), max(confidences[i] for i in members)  # type: ignore[type-var]
                bands.append((f"confidence {low:.2f}-{high:.2f}", members))
    if unstated:
        bands.append(("no confidence", unstated))
    return bands


def _spread(confidences: list[float | None]) -> float:
    """S_h: the anticipated standard deviation of "the judge is right" in a band."""
    stated = [value for value in confidences if value is not None]
    if not stated:
        return NO_CONFIDENCE_SPREAD
    mean = min(max(float(np.mean(stated)), 0.0), 1.0)
    return max(float(np.sqrt(mean * (1.0 - mean))), 0.05)  # a band of sure verdicts still gets its share


def plan_reviews(audited: Sequence[AuditedSample], n: int, seed: int = 0) -> ReviewPlan:
    """Draw a review plan of ``n`` claims from an audit's records (see the module's docstring)."""
    if n < 1:
        raise ReviewPlanError(f"--n must be at least 1 (got {n})")
    records = [item.report for item in audited]
    if duplicated := sorted(duplicate_record_ids(records)):
        raise ReviewPlanError(f"record ids that are not unique name no claim for a review: {', '.join(duplicated[:5])}")
    run = run_key(records)
    by_label: dict[str, list[tuple[int, int]]] = {label.value: [] for label in Label}
    without = 0
    for position, record in enumerate(records):
        for index, claim in enumerate(record.claims):
            if claim.label is None:
                without += 1
            else:
                by_label[claim.label.value].append((position, index))
    labels = [label for label, members in by_label.items() if members]
    if not labels:
        raise ReviewPlanError("the audit has no claim with a judge label: nothing to review")
    per_label = allocate([len(by_label[label]) for label in labels], [1.0] * len(labels), n)
    rng = np.random.default_rng(seed)
    strata: list[Stratum] = []
    chosen: list[PlannedClaim] = []
    for label, reviews in zip(labels, per_label, strict=True):
        members = by_label[label]
        confidences = [label_confidence(records[p].claims[i]) for p, i in members]
        bands = _bands(confidences, reviews)
        sizes = [len(band) for _, band in bands]
        weights = [len(band) * _spread([confidences[i] for i in band]) for _, band in bands]
        for (band_name, band), size, drawn in zip(bands, sizes, allocate(sizes, weights, reviews), strict=True):
            name = f"{label}, {band_name}"
            probability = drawn / size
            strata.append(
                Stratum(name=name, judge_label=label, size=size, sample=drawn, inclusion_probability=probability)
            )
            for pick in rng.choice(size, size=drawn, replace=False):
                position, index = members[band[int(pick)]]
                record, claim = records[position], records[position].claims[index]
                chosen.append(
                    PlannedClaim(
                        run=run, record_id=record_id(record), claim_index=index, claim=claim.text,
                        judge_label=label, confidence=confidences[band[int(pick)]],  # type: ignore[arg-type]
                        stratum=name, stratum_size=size, stratum_sample=drawn, inclusion_probability=probability,
                    )
                )
    order = {record_id(record): position for position, record in enumerate(records)}
    chosen.sort(key=lambda claim: (order[claim.record_id], claim.claim_index))
    return ReviewPlan(run=run, requested=n, seed=seed, strata=strata, claims=chosen, without_judge_label=without)


def write_review_plan(
    audited: Sequence[AuditedSample], n: int, seed: int, report: Path | None, out: Path | None
) -> ReviewPlan:
    """Draw the plan and write its report (only the records holding a planned claim, review
    controls on those claims) and/or its claims as JSONL."""
    plan = plan_reviews(audited, n, seed)
    if report is not None:
        from rt4chart.report.html_report import write_html  # Jinja2: loaded only when a report is asked for

        holding = {claim.record_id for claim in plan.claims}
        shown = [item for item in audited if record_id(item.report) in holding]
        title = f"rt4chart review plan: {len(plan.claims)} claims of run {plan.run}"
        write_html(report, list(shown), title, run=plan.run, plan=plan.claims)
    if out is not None:
        write_lines_atomically(out, (claim.model_dump_json() for claim in plan.claims))
    return plan


def print_plan(plan: ReviewPlan, console: Console) -> None:
    """The plan's strata as a table, and what the draw left out."""
    table = Table(title=f"review plan of run {plan.run}: {len(plan.claims)} claims (seed {plan.seed})")
    for column in ("stratum", "claims", "to review", "inclusion probability"):
        table.add_column(column, justify="left" if column == "stratum" else "right")
    for stratum in plan.strata:
        table.add_row(stratum.name, str(stratum.size), str(stratum.sample), f"{stratum.inclusion_probability:.3f}")
    console.print(table)
    if plan.without_judge_label:
        console.print(f"{plan.without_judge_label} claims without a judge label left out", highlight=False)
