"""Agreement between judges, and of each judge with gold: pure functions over verdict tables.

A verdict table holds, for each judge, one label per item (an answer, or a claim) or ``None``
where that judge has no verdict (a failed record). Statistics:

- observed agreement and Cohen's kappa per pair of judges (over the items both labelled), with
  the pair's confusion matrix;
- Fleiss' kappa over the items every judge labelled, Krippendorff's alpha (nominal) over all
  items with at least two labels;
- per judge: the label distribution, and against gold (positive = hallucinated) sensitivity,
  specificity, balanced accuracy and Cohen's kappa;
- seeded percentile-bootstrap 95% intervals that resample items.

Degenerate inputs never give NaN and never raise: a statistic that is undefined (no items in
common; chance agreement of 1, as when both judges give one and the same label throughout; no gold
positives) takes the documented fallback value and says so in ``warnings``. Kappa and alpha fall
back to 0 ("no evidence of agreement beyond chance"), a rate with no denominator to 0 (as
scikit-learn's ``zero_division=0``), balanced accuracy to the mean of the rates that are defined.

Formulas: Cohen (1960) kappa = (p_o - p_e) / (1 - p_e); Fleiss (1971) kappa from the item-by-label
count matrix; Krippendorff's alpha = 1 - (n - 1) * sum_{c!=k} o_ck / sum_{c!=k} n_c n_k over the
coincidence matrix o (Krippendorff 2011, "Computing Krippendorff's Alpha-Reliability").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, Field

from rt4chart.analysis.metrics import (
    balanced_accuracy,
    binary_prf,
    bootstrap_interval,
    claim_gold_unsupported,
    sensitivity_specificity,
)
from rt4chart.method.joins import and_join
from rt4chart.types import AuditRecord, ClaimVerdict, Gold, Label

Level = Literal["answer", "claim"]
"""What an item is: one output record, or one claim of it."""
Scale = Literal["hallucinated", "label"]
"""What is compared: hallucinated yes/no, or the three-way label."""

HALLUCINATED, FAITHFUL = "hallucinated", "faithful"
"""The two values of the ``hallucinated`` scale (positive first)."""
THREE_WAY = [Label.ENTAILED.value, Label.CONTRADICTED.value, Label.BASELESS.value]
"""The values of the ``label`` scale."""

Column = Sequence[str | None]
"""One judge's labels, one per item; ``None`` where the judge gave none."""


class AgreementInputError(ValueError):
    """Output files that cannot be compared (different records, no records, not rt4chart output)."""


class Statistic(BaseModel):
    """One figure with its bootstrap interval and why it may not mean what it seems."""

    value: float
    """The figure on all items (a documented fallback when it is undefined, never NaN)."""
    ci_low: float | None = None
    """2.5th percentile over bootstrap resamples; ``None`` without resampling."""
    ci_high: float | None = None
    """97.5th percentile over bootstrap resamples; ``None`` without resampling."""
    n: int = 0
    """Items the figure is computed on."""
    warnings: list[str] = Field(default_factory=list)
    """Why the figure is a fallback or fragile (undefined statistic, too few items)."""


class PairAgreement(BaseModel):
    """How two judges agree."""

    first: str
    """One judge."""
    second: str
    """The other judge."""
    observed: Statistic
    """Share of items both labelled on which they gave the same label."""
    kappa: Statistic
    """Cohen's kappa over those items."""
    confusion: list[list[int]]
    """Counts: rows = ``first``'s label, columns = ``second``'s, in the report's label order."""


class JudgeDistribution(BaseModel):
    """How often one judge gave each label."""

    judge: str
    """The judge."""
    counts: dict[str, int]
    """Items per label, in the report's label order."""
    missing: int
    """Items the judge gave no label (failed records, claims that could not be aligned)."""


class GoldComparison(BaseModel):
    """One judge against the human labels; positive = hallucinated (or, for claims, unsupported)."""

    judge: str
    """The judge."""
    n: int
    """Items with both a gold label and the judge's label."""
    predicted_positive_rate: float
    """Share of those items the judge flagged."""
    sensitivity: Statistic
    """Gold positives the judge flagged (recall)."""
    specificity: Statistic
    """Gold negatives the judge left unflagged."""
    balanced_accuracy: Statistic
    """Mean of sensitivity and specificity."""
    kappa: Statistic
    """Cohen's kappa between the judge and gold."""


class AgreementReport(BaseModel):
    """Everything ``rt4 agree`` reports for one level and scale."""

    level: Level
    """Answers or claims."""
    scale: Scale
    """hallucinated yes/no, or the three-way label."""
    labels: list[str]
    """Label order of confusion matrices and distributions."""
    judges: list[str]
    """Judges, in the order given."""
    items: int
    """Items compared (answers, or aligned claims)."""
    unaligned: int = 0
    """Claims left out because they could not be aligned across judges."""
    alignment: str = ""
    """How claims were aligned (``shared claim set`` or ``by answer sentence``); empty for answers."""
    pairs: list[PairAgreement]
    """Every pair of judges."""
    fleiss_kappa: Statistic
    """Fleiss' kappa over items every judge labelled."""
    krippendorff_alpha: Statistic
    """Krippendorff's alpha (nominal) over items with at least two labels."""
    distributions: list[JudgeDistribution]
    """Label counts per judge."""
    gold: list[GoldComparison] = Field(default_factory=list)
    """Each judge against gold (empty without gold)."""
    gold_items: int = 0
    """Items that carry a gold label."""
    resamples: int = 0
    """Bootstrap resamples behind the intervals."""
    seed: int = 0
    """Bootstrap seed."""


# --- statistics on label columns -------------------------------------------------------------


def _codes(column: Column, labels: Sequence[str]) -> NDArray[np.int64]:
    """Label indices, -1 where missing (a label outside ``labels`` is a caller error)."""
    position = {label: index for index, label in enumerate(labels)}
    return np.array([-1 if value is None else position[value] for value in column], dtype=np.int64)


def _both(first: NDArray[np.int64], second: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    keep = (first >= 0) & (second >= 0)
    return first[keep], second[keep]


def _confusion(first: NDArray[np.int64], second: NDArray[np.int64], k: int) -> NDArray[np.int64]:
    return np.bincount(first * k + second, minlength=k * k).reshape(k, k)


def confusion_matrix(first: Column, second: Column, labels: Sequence[str]) -> list[list[int]]:
    """Counts of (first's label, second's label) over the items both labelled."""
    a, b = _both(_codes(first, labels), _codes(second, labels))
    return [[int(x) for x in row] for row in _confusion(a, b, len(labels))]


def _observed(a: NDArray[np.int64], b: NDArray[np.int64]) -> tuple[float, list[str]]:
    if a.size == 0:
        return 0.0, ["no items labelled by both: agreement undefined, reported as 0"]
    return float(np.mean(a == b)), []


def _kappa(a: NDArray[np.int64], b: NDArray[np.int64], k: int) -> tuple[float, list[str]]:
    if a.size == 0:
        return 0.0, ["no items labelled by both: kappa undefined, reported as 0"]
    table = _confusion(a, b, k) / a.size
    observed = float(np.trace(table))
    expected = float(table.sum(axis=1) @ table.sum(axis=0))
    if expected >= 1.0:
        return 0.0, ["both gave one and the same label throughout: kappa undefined, reported as 0"]
    return (observed - expected) / (1.0 - expected), []


def observed_agreement(first: Column, second: Column, labels: Sequence[str]) -> Statistic:
    """Share of items (labelled by both) that got the same label."""
    a, b = _both(_codes(first, labels), _codes(second, labels))
    value, warnings = _observed(a, b)
    return Statistic(value=value, n=int(a.size), warnings=warnings)


def cohen_kappa(first: Column, second: Column, labels: Sequence[str]) -> Statistic:
    """Cohen's kappa over the items both labelled (scikit-learn's ``cohen_kappa_score``)."""
    a, b = _both(_codes(first, labels), _codes(second, labels))
    value, warnings = _kappa(a, b, len(labels))
    return Statistic(value=value, n=int(a.size), warnings=warnings)


def _matrix(columns: Sequence[Column], labels: Sequence[str]) -> NDArray[np.int64]:
    """Items x judges label codes, -1 where missing."""
    return np.stack([_codes(column, labels) for column in columns], axis=1)


def _fleiss(codes: NDArray[np.int64], k: int) -> tuple[float, int, list[str]]:
    complete = codes[(codes >= 0).all(axis=1)]
    items, raters = complete.shape
    if raters < 2:
        return 0.0, items, ["Fleiss' kappa needs at least two judges; reported as 0"]
    if items == 0:
        return 0.0, 0, ["no items labelled by every judge: Fleiss' kappa undefined, reported as 0"]
    counts = np.stack([(complete == label).sum(axis=1) for label in range(k)], axis=1)
    per_item = ((counts * counts).sum(axis=1) - raters) / (raters * (raters - 1))
    shares = counts.sum(axis=0) / (items * raters)
    expected = float(shares @ shares)
    if expected >= 1.0:
        return 0.0, items, ["every judge gave one and the same label: Fleiss' kappa undefined, reported as 0"]
    return (float(per_item.mean()) - expected) / (1.0 - expected), items, []


def fleiss_kappa(columns: Sequence[Column], labels: Sequence[str]) -> Statistic:
    """Fleiss' kappa over the items every judge labelled (statsmodels' ``fleiss_kappa``)."""
    value, items, warnings = _fleiss(_matrix(columns, labels), len(labels))
    return Statistic(value=value, n=items, warnings=warnings)


def _alpha(codes: NDArray[np.int64], k: int) -> tuple[float, int, list[str]]:
    counts = np.stack([(codes == label).sum(axis=1) for label in range(k)], axis=1).astype(float)
    per_item = counts.sum(axis=1)
    pairable = per_item >= 2
    counts, per_item = counts[pairable], per_item[pairable]
    if counts.shape[0] == 0:
        return 0.0, 0, ["no item has two labels: Krippendorff's alpha undefined, reported as 0"]
    # Coincidences: each ordered pair of values within an item, weighted 1 / (m_u - 1).
    weighted = counts / (per_item - 1.0)[:, None]
    coincidence = weighted.T @ counts - np.diag(weighted.sum(axis=0))
    marginals = coincidence.sum(axis=1)
    total = float(marginals.sum())
    disagreement = total - float(np.trace(coincidence))
    expected = total * total - float(marginals @ marginals)
    if expected <= 0.0:
        return 0.0, int(counts.shape[0]), ["one label only: Krippendorff's alpha undefined, reported as 0"]
    return 1.0 - (total - 1.0) * disagreement / expected, int(counts.shape[0]), []


def krippendorff_alpha(columns: Sequence[Column], labels: Sequence[str]) -> Statistic:
    """Krippendorff's alpha for nominal data; missing labels allowed."""
    value, items, warnings = _alpha(_matrix(columns, labels), len(labels))
    return Statistic(value=value, n=items, warnings=warnings)


def label_distribution(judge: str, column: Column, labels: Sequence[str]) -> JudgeDistribution:
    """How often ``judge`` gave each label."""
    return JudgeDistribution(
        judge=judge,
        counts={label: sum(value == label for value in column) for label in labels},
        missing=sum(value is None for value in column),
    )


def _rates(gold: NDArray[np.int64], predicted: NDArray[np.int64]) -> tuple[float, float, float, list[str]]:
    """Sensitivity, specificity, balanced accuracy of binary codes (1 = positive), undefined ones
    reported as 0 with a warning (the figures are :mod:`rt4chart.analysis.metrics`' own)."""
    warnings: list[str] = []
    positive, flagged = (gold == 1).tolist(), (predicted == 1).tolist()
    sensitivity, specificity = sensitivity_specificity(positive, flagged)
    balanced = balanced_accuracy(positive, flagged)
    if sensitivity is None:
        warnings.append("no gold positives: sensitivity undefined, reported as 0")
    if specificity is None:
        warnings.append("no gold negatives: specificity undefined, reported as 0")
    if balanced is None:
        warnings.append("no items: balanced accuracy undefined, reported as 0")
    return sensitivity or 0.0, specificity or 0.0, balanced or 0.0, warnings


def versus_gold(
    gold: Sequence[bool | None], predicted: Sequence[bool | None]
) -> tuple[Statistic, Statistic, Statistic]:
    """Sensitivity, specificity and balanced accuracy over items with both labels."""
    g, p = _both(_bool_codes(gold), _bool_codes(predicted))
    sensitivity, specificity, balanced, warnings = _rates(g, p)
    n = int(g.size)
    return (
        Statistic(value=sensitivity, n=n, warnings=[w for w in warnings if "sensitivity" in w]),
        Statistic(value=specificity, n=n, warnings=[w for w in warnings if "specificity" in w]),
        Statistic(value=balanced, n=n, warnings=[w for w in warnings if "balanced" in w]),
    )


def _bool_codes(values: Sequence[bool | None]) -> NDArray[np.int64]:
    return np.array([-1 if v is None else int(v) for v in values], dtype=np.int64)


# --- the bootstrap -----------------------------------------------------------------------------


PairFunction = Callable[[NDArray[np.int64], NDArray[np.int64]], float]
"""A statistic of two aligned code columns."""


def _on_resample(
    function: PairFunction, a: NDArray[np.int64], b: NDArray[np.int64]
) -> Callable[[NDArray[np.int64]], float]:
    """``function`` of the two columns restricted to resampled item indices."""

    def statistic(indices: NDArray[np.int64]) -> float:
        return function(a[indices], b[indices])

    return statistic


def _with_interval(
    figure: Statistic, statistic: Callable[[NDArray[np.int64]], float], n: int, resamples: int, seed: int
) -> Statistic:
    low, high = bootstrap_interval(statistic, n, resamples, seed)
    return figure.model_copy(update={"ci_low": low, "ci_high": high})


# --- verdict tables from output records ------------------------------------------------------


class VerdictTable(BaseModel):
    """Labels of several judges on the same items, and gold where known."""

    level: Level
    """Answers or claims."""
    scale: Scale
    """hallucinated yes/no, or the three-way label."""
    judges: list[str]
    """Judge names, one per column."""
    items: list[str]
    """Item keys (``id@line``, ``id@line#claim`` or ``id@line/sentence``)."""
    columns: list[list[str | None]]
    """Per judge, one label per item (``None`` = no verdict)."""
    gold: list[bool | None] | None = None
    """Gold hallucinated / unsupported per item, when gold is known."""
    unaligned: int = 0
    """Claims that could not be aligned across judges (left out)."""
    alignment: str = ""
    """How claims were aligned."""

    @property
    def labels(self) -> list[str]:
        return [HALLUCINATED, FAITHFUL] if self.scale == "hallucinated" else list(THREE_WAY)


def _scaled(label: Label | None, scale: Scale) -> str | None:
    if label is None:
        return None
    if scale == "label":
        return label.value
    return FAITHFUL if label == Label.ENTAILED else HALLUCINATED


def check_aligned(runs: Sequence[tuple[str, Sequence[AuditRecord]]]) -> None:
    """Raise :class:`AgreementInputError` unless every file holds the same records (id and line)."""
    for source, reports in runs:
        if not reports:
            raise AgreementInputError(f"{source}: no output records")
    reference_source, reference = runs[0]
    for source, reports in runs[1:]:
        for position, (mine, theirs) in enumerate(zip(reference, reports, strict=False), start=1):
            if (mine.id, mine.line) != (theirs.id, theirs.line):
                raise AgreementInputError(
                    f"{source} differs from {reference_source} at record {position}: "
                    f"id {theirs.id!r} line {theirs.line} vs id {mine.id!r} line {mine.line}"
                )
        if len(reports) != len(reference):
            raise AgreementInputError(
                f"{source} has {len(reports)} records, {reference_source} has {len(reference)}"
            )


def recorded_judge(source: str, reports: Sequence[AuditRecord]) -> str:
    """The judge a file's records name (the file name when none does)."""
    return next((r.judge for r in reports if r.judge), None) or source


def judge_names(runs: Sequence[tuple[str, Sequence[AuditRecord]]]) -> list[str]:
    """A column name per file: the judge it records, made unique with the file name when needed."""
    recorded = [recorded_judge(source, reports) for source, reports in runs]
    return [
        f"{name} ({source})" if recorded.count(name) > 1 else name
        for name, (source, _) in zip(recorded, runs, strict=True)
    ]


def answer_table(
    runs: Sequence[tuple[str, Sequence[AuditRecord]]], gold: Sequence[Gold | None] | None, scale: Scale
) -> VerdictTable:
    """One item per record; runs must be aligned (see :func:`check_aligned`)."""
    reference = runs[0][1]
    gold_column = None
    if gold is not None:
        gold_column = [g.hallucinated if g is not None else None for g in gold]
    return VerdictTable(
        level="answer",
        scale=scale,
        judges=judge_names(runs),
        items=[f"{r.id}@{r.line}" for r in reference],
        columns=[[_scaled(r.label, scale) for r in reports] for _, reports in runs],
        gold=gold_column,
    )


def claim_table(
    runs: Sequence[tuple[str, Sequence[AuditRecord]]], gold: Sequence[Gold | None] | None, scale: Scale
) -> VerdictTable:
    """One item per claim when every judge verified the same claims of a record (``rt4 compare``);
    else one item per answer sentence (the AND-join of its claims), and claims of sentences not
    every judge has (or holistic claims, tied to no sentence) are counted as unaligned."""
    items: list[str] = []
    columns: list[list[str | None]] = [[] for _ in runs]
    gold_column: list[bool | None] = []
    unaligned = 0
    by_sentence = 0
    for position, reference in enumerate(runs[0][1]):
        records = [reports[position] for _, reports in runs]
        sample_gold = gold[position] if gold is not None else None
        key = f"{reference.id}@{reference.line}"
        claim_sets = [[c.text for c in r.claims] for r in records]
        if all(claims == claim_sets[0] for claims in claim_sets):
            for index, claim in enumerate(reference.claims):
                items.append(f"{key}#{index}")
                for column, record in zip(columns, records, strict=True):
                    column.append(_scaled(record.claims[index].label, scale))
                gold_column.append(claim_gold_unsupported(claim, sample_gold) if sample_gold else None)
            continue
        by_sentence += 1
        grouped = [_by_sentence(r.claims) for r in records]
        shared = set.intersection(*(set(g) for g in grouped))
        unaligned += sum(len(claims) for g in grouped for s, claims in g.items() if s not in shared)
        unaligned += sum(1 for r in records for c in r.claims if c.sentence_index is None)
        for sentence in sorted(shared):
            items.append(f"{key}/{sentence}")
            for column, g in zip(columns, grouped, strict=True):
                column.append(_scaled(and_join(c.label for c in g[sentence]), scale))
            first = grouped[0][sentence][0]
            gold_column.append(claim_gold_unsupported(first, sample_gold) if sample_gold else None)
    alignment = "shared claim set" if by_sentence == 0 else f"by answer sentence in {by_sentence} records"
    return VerdictTable(
        level="claim",
        scale=scale,
        judges=judge_names(runs),
        items=items,
        columns=columns,
        gold=gold_column if gold is not None else None,
        unaligned=unaligned,
        alignment=alignment,
    )


def _by_sentence(claims: Sequence[ClaimVerdict]) -> dict[int, list[ClaimVerdict]]:
    grouped: dict[int, list[ClaimVerdict]] = {}
    for claim in claims:
        if claim.sentence_index is not None:
            grouped.setdefault(claim.sentence_index, []).append(claim)
    return grouped


# --- the report --------------------------------------------------------------------------------


def agreement_report(table: VerdictTable, *, resamples: int = 1000, seed: int = 0) -> AgreementReport:
    """Every pairwise and overall statistic of ``table``, with bootstrap intervals."""
    labels = table.labels
    k = len(labels)
    codes = _matrix(table.columns, labels)
    n = codes.shape[0]
    pairs = []
    for i, j in combinations(range(len(table.judges)), 2):
        a, b = codes[:, i], codes[:, j]
        pairs.append(
            PairAgreement(
                first=table.judges[i],
                second=table.judges[j],
                observed=_with_interval(
                    observed_agreement(table.columns[i], table.columns[j], labels),
                    _on_resample(lambda x, y: _observed(*_both(x, y))[0], a, b),
                    n, resamples, seed,
                ),
                kappa=_with_interval(
                    cohen_kappa(table.columns[i], table.columns[j], labels),
                    _on_resample(lambda x, y: _kappa(*_both(x, y), k)[0], a, b),
                    n, resamples, seed,
                ),
                confusion=confusion_matrix(table.columns[i], table.columns[j], labels),
            )
        )
    def fleiss_on(indices: NDArray[np.int64]) -> float:
        return _fleiss(codes[indices], k)[0]

    def alpha_on(indices: NDArray[np.int64]) -> float:
        return _alpha(codes[indices], k)[0]

    fleiss = _with_interval(fleiss_kappa(table.columns, labels), fleiss_on, n, resamples, seed)
    alpha = _with_interval(krippendorff_alpha(table.columns, labels), alpha_on, n, resamples, seed)
    return AgreementReport(
        level=table.level,
        scale=table.scale,
        labels=labels,
        judges=table.judges,
        items=n,
        unaligned=table.unaligned,
        alignment=table.alignment,
        pairs=pairs,
        fleiss_kappa=fleiss,
        krippendorff_alpha=alpha,
        distributions=[label_distribution(j, c, labels) for j, c in zip(table.judges, table.columns, strict=True)],
        gold=_gold_comparisons(table, resamples, seed) if table.gold is not None else [],
        gold_items=sum(g is not None for g in table.gold) if table.gold is not None else 0,
        resamples=resamples,
        seed=seed,
    )


def _flagged(column: Column) -> list[bool | None]:
    """Whether each label is a hallucination (any label but entailed / faithful)."""
    return [None if v is None else v not in (FAITHFUL, Label.ENTAILED.value) for v in column]


def _gold_comparisons(table: VerdictTable, resamples: int, seed: int) -> list[GoldComparison]:
    assert table.gold is not None
    gold = _bool_codes(table.gold)
    comparisons = []
    for judge, column in zip(table.judges, table.columns, strict=True):
        predicted = _bool_codes(_flagged(column))
        g, p = _both(gold, predicted)
        n = int(g.size)
        sensitivity, specificity, balanced = versus_gold(table.gold, _flagged(column))
        kappa_value, kappa_warnings = _kappa(g, p, 2)
        comparisons.append(
            GoldComparison(
                judge=judge,
                n=n,
                predicted_positive_rate=float(p.mean()) if n else 0.0,
                sensitivity=_with_interval(sensitivity, _on_resample(_sensitivity, g, p), n, resamples, seed),
                specificity=_with_interval(specificity, _on_resample(_specificity, g, p), n, resamples, seed),
                balanced_accuracy=_with_interval(balanced, _on_resample(_balanced, g, p), n, resamples, seed),
                kappa=_with_interval(
                    Statistic(value=kappa_value, n=n, warnings=kappa_warnings),
                    _on_resample(lambda x, y: _kappa(x, y, 2)[0], g, p),
                    n, resamples, seed,
                ),
            )
        )
    return comparisons


# --- repeated runs: is a difference real? ----------------------------------------------------


class RunFigures(BaseModel):
    """One judge's figure over its repeated runs."""

    mean: float
    """Mean over runs."""
    std: float
    """Sample standard deviation over runs (0 for a single run)."""
    low: float
    """Lowest run."""
    high: float
    """Highest run."""
    runs: list[float]
    """The figure of each run, in the order given."""


class JudgeRuns(BaseModel):
    """A judge's answer-level figures over its repeated runs."""

    judge: str
    """The judge."""
    files: list[str]
    """Its run files."""
    f1: RunFigures
    """Answer-level F1 (positive = hallucinated)."""
    balanced_accuracy: RunFigures
    """Answer-level balanced accuracy."""


class RunDifference(BaseModel):
    """Judge ``first`` minus judge ``second`` on the same samples."""

    first: str
    """One judge."""
    second: str
    """The other judge."""
    metric: Literal["f1", "balanced_accuracy"]
    """Which figure."""
    difference: Statistic
    """Mean over runs of ``first`` minus mean over runs of ``second``, with a paired bootstrap
    interval (both judges' runs resampled on the same samples)."""
    welch_t: float | None
    """Welch's t statistic over the per-run figures; ``None`` when undefined."""
    welch_p: float | None
    """Its two-sided p-value; ``None`` when undefined (a single run, or no run-to-run variation)."""
    warnings: list[str] = Field(default_factory=list)
    """Why the t-test is undefined or fragile."""


class RunsReport(BaseModel):
    """What ``rt4 agree --runs`` reports."""

    samples: int
    """Samples with gold that every run judged."""
    judges: list[JudgeRuns]
    """Per judge."""
    differences: list[RunDifference]
    """Every pair of judges, for F1 and balanced accuracy."""
    flag_everything_f1: float | None = None
    """The trivial baseline: answer F1 of flagging every one of the samples hallucinated (its
    balanced accuracy is 0.5 by definition)."""
    resamples: int
    """Bootstrap resamples."""
    seed: int
    """Bootstrap seed."""


def _run_figures(values: list[float]) -> RunFigures:
    return RunFigures(
        mean=float(np.mean(values)),
        std=float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
        low=min(values),
        high=max(values),
        runs=values,
    )


def _f1(gold: NDArray[np.int64], predicted: NDArray[np.int64]) -> float:
    return binary_prf(gold.astype(bool).tolist(), predicted.astype(bool).tolist()).f1


def _sensitivity(gold: NDArray[np.int64], predicted: NDArray[np.int64]) -> float:
    return _rates(gold, predicted)[0]


def _specificity(gold: NDArray[np.int64], predicted: NDArray[np.int64]) -> float:
    return _rates(gold, predicted)[1]


def _balanced(gold: NDArray[np.int64], predicted: NDArray[np.int64]) -> float:
    return _rates(gold, predicted)[2]


METRICS: dict[str, Callable[[NDArray[np.int64], NDArray[np.int64]], float]] = {
    "f1": _f1,
    "balanced_accuracy": _balanced,
}
"""Run-level figures of ``--runs`` (gold codes, predicted codes) -> value."""


def welch_test(first: Sequence[float], second: Sequence[float]) -> tuple[float | None, float | None, list[str]]:
    """Welch's t-test (scipy) over per-run figures; ``None`` where it is undefined."""
    if len(first) < 2 or len(second) < 2:
        return None, None, ["Welch's t-test needs at least two runs per judge"]
    # Identical runs: np.var of three copies of 0.7 is 1e-32, not 0, and scipy then divides by it
    # (t = 5e15 and a RuntimeWarning); the range of equal figures is exactly 0.
    if np.ptp(first) == 0.0 and np.ptp(second) == 0.0:
        return None, None, ["no run-to-run variation in either judge: Welch's t-test undefined"]
    # scipy.stats takes most of a second to import: every `rt4 verify` imports this module, few test runs.
    from scipy import stats

    result = stats.ttest_ind(first, second, equal_var=False)
    return float(result.statistic), float(result.pvalue), []


def runs_report(
    judges: Sequence[tuple[str, Sequence[tuple[str, Sequence[bool | None]]]]],
    gold: Sequence[bool | None],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> RunsReport:
    """Figures per judge over runs and their paired differences.

    ``judges``: per judge, its runs as (file, hallucinated per sample); every run is aligned with
    ``gold``. Samples without gold, or that some run did not judge, are left out everywhere, so
    every figure is on the same samples.
    """
    gold_codes = _bool_codes(gold)
    keep = gold_codes >= 0
    predicted: list[NDArray[np.int64]] = []  # judges x (runs, samples)
    for _, runs in judges:
        matrix = np.stack([_bool_codes(values) for _, values in runs])
        keep &= (matrix >= 0).all(axis=0)
        predicted.append(matrix)
    g = gold_codes[keep]
    predicted = [matrix[:, keep] for matrix in predicted]
    per_judge = [
        JudgeRuns(
            judge=name,
            files=[file for file, _ in runs],
            f1=_run_figures([_f1(g, run) for run in matrix]),
            balanced_accuracy=_run_figures([_balanced(g, run) for run in matrix]),
        )
        for (name, runs), matrix in zip(judges, predicted, strict=True)
    ]
    differences = []
    for i, j in combinations(range(len(judges)), 2):
        for metric, function in METRICS.items():
            a, b = predicted[i], predicted[j]

            def difference(idx: NDArray[np.int64], a: NDArray[np.int64] = a, b: NDArray[np.int64] = b,
                           function: Callable[..., float] = function) -> float:
                return float(np.mean([function(g[idx], run[idx]) for run in a])
                             - np.mean([function(g[idx], run[idx]) for run in b]))

            first_runs = getattr(per_judge[i], metric).runs
            second_runs = getattr(per_judge[j], metric).runs
            t, p, warnings = welch_test(first_runs, second_runs)
            value = float(np.mean(first_runs) - np.mean(second_runs))
            differences.append(
                RunDifference(
                    first=per_judge[i].judge,
                    second=per_judge[j].judge,
                    metric=metric,  # type: ignore[arg-type]
                    difference=_with_interval(
                        Statistic(value=value, n=int(g.size)), difference, int(g.size), resamples, seed
                    ),
                    welch_t=t,
                    welch_p=p,
                    warnings=warnings,
                )
            )
    return RunsReport(
        samples=int(g.size), judges=per_judge, differences=differences,
        flag_everything_f1=_f1(g, np.ones_like(g)) if g.size else None, resamples=resamples, seed=seed,
    )


# --- reading output files ----------------------------------------------------------------------


def read_outputs(paths: Sequence[Path]) -> list[tuple[str, list[AuditRecord]]]:
    """Read ``rt4 verify`` outputs; raise :class:`AgreementInputError` unless they are aligned."""
    from rt4chart.records.io import PredictionsError, read_predictions

    runs = []
    for path in paths:
        try:
            runs.append((str(path), read_predictions(path)))
        except PredictionsError as error:
            raise AgreementInputError(str(error)) from None
        except (UnicodeDecodeError, OSError) as error:
            raise AgreementInputError(f"{path}: cannot read ({error})") from None
    check_aligned(runs)
    return runs


def gold_column(reports: Sequence[AuditRecord], gold_path: Path | None) -> list[Gold | None] | None:
    """Gold per record: from ``gold_path`` (matched by sample id), else carried in the records."""
    if gold_path is None:
        carried = [r.gold for r in reports]
        return carried if any(g is not None for g in carried) else None
    from rt4chart.analysis.datasets import DatasetError, load_dataset

    try:
        samples = load_dataset("generic", gold_path)
    except DatasetError as error:
        raise AgreementInputError(str(error)) from None
    by_id = {s.id: s.gold for s in samples}
    matched = [by_id.get(r.id or "") for r in reports]
    if not any(g is not None for g in matched):
        raise AgreementInputError(f"{gold_path}: no gold label for any record id (first: {reports[0].id!r})")
    return matched
