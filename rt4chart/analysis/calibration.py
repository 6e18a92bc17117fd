"""``rt4 calibrate``: a scoring judge's operating point chosen on a team's own claim labels.

Labels: human claim labels, either the reviews of the HTML report (:mod:`rt4chart.analysis.review`; ``unsure``
reviews are left out and counted, a review plan's inclusion probabilities weight each review by its
inverse) or a labelled dataset's gold (``rt4 convert`` output, or the gold the records carry): a claim
is unsupported when its answer span overlaps a gold hallucination span, aligned as ``rt4 eval`` does
(:func:`rt4chart.analysis.metrics.claim_gold_unsupported`).

Scores: the judge's belief that a claim is not entailed, as the metrics read it
(:func:`rt4chart.method.settlement.claim_unsupported_score`):

- the embedded verifier's calibrated ``JudgeScore.p_unsupported``: the written profile's
  ``claim_thresholds`` moves the head's threshold. Claims a guard decided (``decided_by`` other than
  ``head``) keep their verdict whatever the threshold, as the verifier does;
- an LLM judge's stated ``confidence`` of its final claim verdict (``1 -`` it for an entailed claim),
  and a vote's (``vote:A,B,C``): its confidence is the winning label's share of members, so a
  claim's score is that share when the vote called it contradicted or baseless, and ``1 -`` the
  entailed share when it called it entailed. The written profile is a calibrated one (``kind =
  "calibrated"``, ``judge = "<the --judge value>"``, ``claim_threshold``): the pipeline settles each
  final claim verdict at the threshold (:func:`rt4chart.method.settlement.settle_at_threshold`, then the
  AND-join), flagging exactly the claims counted flagged here;
- a cascade's stage confidence: not supported (a record holds only the verdict of the stage that
  settled each claim, not what the next stage would have said).

Either way the figures below are what the written profile does on the same answers.

Held-out figures: the answers are split into ``folds`` folds, answers sharing a context in one fold
(the gold file's contexts, else the records' ``context_sha256``: answers to one context are near
copies of each other's labels, and a fold that saw one would leak into the other); each fold's
threshold is chosen on the other folds' labels only and its claims are flagged with it; precision /
recall / F1 are those of the pooled held-out flags. Their 95% intervals come from
:func:`rt4chart.analysis.metrics.bootstrap_interval` over the fold groups, redoing the whole
cross-validation on each resample (so they carry the choice's variability too). The threshold
written to the profile is the one chosen on all labels.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from rt4chart.analysis.datasets import DatasetError, load_dataset, source_key
from rt4chart.analysis.metrics import (
    JUDGE_SCORE,
    ClaimValidation,
    Estimate,
    auroc,
    bootstrap_interval,
    claim_gold_unsupported,
    claim_rows,
    claim_validation,
    format_estimate,
)
from rt4chart.analysis.review import ReviewFileError, claim_text, read_reviews, record_id, run_key
from rt4chart.judges.embedded.model import HeadName, load_model
from rt4chart.judges.registry import (
    CALIBRATED_MARK,
    JudgeConfigError,
    JudgeProfile,
    load_profiles,
    resolve_judge_for_pricing,
)
from rt4chart.method.settlement import claim_unsupported_score, guard_decided
from rt4chart.records.io import PredictionsError, read_predictions, write_lines_atomically
from rt4chart.types import AuditRecord, ClaimVerdict, Gold, Label

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

TargetKind = Literal["best-f1", "precision", "recall"]
ScoreKind = Literal["p_unsupported", "confidence"]


class CalibrationError(ValueError):
    """The records, labels or target cannot be calibrated on (the message says why)."""


class Target(BaseModel):
    """What the operating point is chosen for."""

    kind: TargetKind
    """``best-f1``, or the highest recall at ``precision >= bound``, or the highest precision at
    ``recall >= bound``."""
    bound: float | None = None
    """The bound of a precision or recall target."""

    def describe(self) -> str:
        return "best-f1" if self.bound is None else f"{self.kind}>={self.bound:g}"


def parse_target(text: str) -> Target:
    """``best-f1``, ``precision>=0.8`` or ``recall>=0.7`` -> :class:`Target`."""
    if text.strip() == "best-f1":
        return Target(kind="best-f1")
    matched = re.fullmatch(r"\s*(precision|recall)\s*>=\s*([0-9.]+)\s*", text)
    bound = float(matched.group(2)) if matched and re.fullmatch(r"\d*\.?\d+", matched.group(2)) else None
    if matched is None or bound is None or not 0.0 < bound <= 1.0:
        raise CalibrationError(f"--target must be best-f1, precision>=P or recall>=R with 0 < P, R <= 1 (got {text!r})")
    kind: TargetKind = "precision" if matched.group(1) == "precision" else "recall"
    return Target(kind=kind, bound=bound)


@dataclass(frozen=True)
class LabelledClaim:
    """One claim with a human label, reduced to what choosing a threshold needs."""

    group: str
    """Its fold group: the answer, or the context its answer was given (answers of one source)."""
    unsupported: bool
    """The human label: not entailed."""
    score: float
    """The judge's unsupported score."""
    fixed: bool | None
    """Whether it is flagged whatever the threshold (a guard of the embedded verifier decided);
    ``None`` when the threshold decides."""
    flagged: bool
    """Whether the judge flagged it at its own operating point (label not entailed)."""
    weight: float = 1.0
    """Inverse inclusion probability of a review plan's pick (1 otherwise)."""
    where: tuple[str, int] = ("", 0)
    """Its record's id and its index in ``record.claims`` (to measure it again for ``--refit``)."""


class FoldPoint(BaseModel):
    """One fold: the threshold chosen without its labels and what it gave on them."""

    fold: int
    threshold: float
    claims: int
    """Held-out claims of the fold."""
    precision: float
    recall: float


class Refit(BaseModel):
    """``--refit``: the embedded verifier's head fitted again on these labels, against the shipped one."""

    measured: int
    """Labelled claims measured again against their context (the global stage's view)."""
    reproduced: int
    """Of them, claims whose shipped-head probability from the new measurement equals the record's
    (to 0.001): how closely the refit sees what the audit saw."""
    c: list[float]
    """The regression's C, chosen inside each fold's training part."""
    shipped_auroc: float | None
    """Claim AUROC of the shipped head's probabilities (as recorded)."""
    refit_auroc: float | None
    """Claim AUROC of the refitted head's out-of-fold probabilities."""
    shipped_log_loss: float
    refit_log_loss: float
    held_out: dict[str, Estimate]
    """The refitted head's held-out precision / recall / F1 at the target, by the same procedure
    (and folds, and resamples) as :attr:`Calibration.held_out` of the shipped head."""
    beat: bool
    """Whether the refit beat the shipped head: a higher AUROC and a higher held-out figure that the
    target maximises (F1; recall at a precision bound; precision at a recall bound)."""


class Calibration(BaseModel):
    """What ``rt4 calibrate`` chose and measured."""

    judge: str
    """The judge named by the records."""
    score: ScoreKind
    """What was thresholded: ``p_unsupported`` (embedded) or ``confidence`` (LLM judge, vote share)."""
    labels: str
    """Where the labels came from."""
    target: str
    """The target, as given."""
    claims: int
    """Claims in the records."""
    labelled: int
    """Claims with a human label and a score (what the figures are over)."""
    unsure: int = 0
    """Reviews marked unsure (left out)."""
    weighted: bool = False
    """Whether a review plan's inclusion probabilities weight the figures."""
    fixed: int
    """Labelled claims whose verdict no threshold moves (decided by a guard)."""
    groups: int
    """Fold groups: contexts (answers to one context share a fold), or answers of records made before
    records carried their context's hash."""
    ungrouped: int = 0
    """Labelled answers whose records carry no context hash: each its own fold group."""
    folds: int
    seed: int
    resamples: int
    threshold: float
    """The operating point chosen on all labels: flag a claim when its score is at or above it."""
    target_reached: bool
    """Whether the target holds at :attr:`threshold` on all labels, the ones it was chosen on: an
    in-sample statement (else the nearest point was taken); :attr:`held_out` is the estimate."""
    warnings: list[str] = []
    """What makes a figure less than a held-out estimate (printed first)."""
    held_out: dict[str, Estimate]
    """``precision``, ``recall``, ``f1`` of the held-out flags, with 95% bootstrap intervals."""
    current: dict[str, Estimate]
    """The same figures of the judge's own verdicts (label not entailed), for comparison."""
    below_judge: bool = False
    """Whether the held-out precision, recall and F1 are all below those of the judge's own verdicts:
    the point (and a profile applying it) would do worse than the judge as it is."""
    fold_points: list[FoldPoint]
    validation: ClaimValidation
    """The verifier-validation table, at the held-out flags."""
    changed: int
    """Labelled claims whose verdict the chosen threshold changes (entailed <-> not entailed)."""
    head: HeadName | None = None
    """The embedded verifier's head the labels calibrate (``None`` for other judges)."""
    profile: str | None = None
    """The judge profile written, if any."""
    refit: Refit | None = None
    """The head refitted on these labels (``--refit``), if asked for."""


THRESHOLDED_SCORE = "score as thresholded, guard-decided claims at 0 / 1"
"""What the validation table ranks claims by here: the score a threshold sees (:func:`_effective`),
not the judge's own score of ``rt4 eval`` (a guard-decided claim's recorded score may disagree with
its verdict), so its AUROC carries this name and never plain "claim AUROC"."""


# --- labels -----------------------------------------------------------------------------------


def _fixed(claim: ClaimVerdict) -> bool | None:
    return claim.label != Label.ENTAILED if guard_decided(claim) else None


def _effective(claim: LabelledClaim) -> float:
    """The score as a threshold sees it: a guard-decided claim is flagged at any threshold (score 1)."""
    return claim.score if claim.fixed is None else float(claim.fixed)


def _labelled(
    claim: ClaimVerdict, unsupported: bool, group: str, where: tuple[str, int], weight: float = 1.0
) -> LabelledClaim | None:
    score = claim_unsupported_score(claim)
    if score is None or claim.label is None:
        return None
    return LabelledClaim(group, unsupported, score, _fixed(claim), claim.label != Label.ENTAILED, weight, where)


def fold_group(record: AuditRecord) -> str:
    """A record's fold group without a gold file: the context it answered (``context_sha256``), so
    answers to one context never sit on both sides of a fold; the answer itself for records made
    before they carried it."""
    return f"context {record.context_sha256}" if record.context_sha256 is not None else f"answer {record_id(record)}"


def gold_claims(records: Sequence[AuditRecord], gold: Path | None) -> list[LabelledClaim]:
    """Claims labelled by gold spans: ``gold`` (``rt4 convert`` output, by id) or, without it, the
    gold the records carry; the folds grouped by context either way (:func:`fold_group`)."""
    by_id: dict[str, tuple[Gold, str]] = {}
    if gold is not None:
        try:
            by_id = {s.id: (s.gold, source_key(s)) for s in load_dataset("generic", gold) if s.gold}
        except DatasetError as error:
            raise CalibrationError(str(error)) from None
    labelled = []
    for record in records:
        found = by_id.get(record.id or "") if gold is not None else (
            (record.gold, fold_group(record)) if record.gold is not None else None
        )
        if found is None:
            continue
        sample_gold, group = found
        for index, claim in enumerate(record.claims):
            unsupported = claim_gold_unsupported(claim, sample_gold)
            where = (record_id(record), index)
            if unsupported is not None and (item := _labelled(claim, unsupported, group, where)) is not None:
                labelled.append(item)
    return labelled


def reviewed_claims(records: Sequence[AuditRecord], reviews: Path) -> tuple[list[LabelledClaim], int]:
    """Claims labelled by reviews (:mod:`rt4chart.analysis.review`) and the number of ``unsure`` reviews."""
    try:
        read = read_reviews(reviews)
    except (OSError, ReviewFileError) as error:
        raise CalibrationError(str(error)) from None
    key = run_key(records)
    by_id = {record_id(record): record for record in records}
    labelled, unsure = [], 0
    for position, review in enumerate(read, start=1):
        record = by_id.get(review.record_id)
        where = f"{reviews} line {position}"
        if review.run != key or record is None or review.claim_index >= len(record.claims):
            raise CalibrationError(f"{where}: the review is of another audit than these records (run {review.run})")
        claim = record.claims[review.claim_index]
        if claim_text(claim) != review.claim:
            raise CalibrationError(f"{where}: claim {review.claim_index} of {review.record_id} reads otherwise here")
        if review.label == "unsure":
            unsure += 1
            continue
        weight = 1.0 / review.inclusion_probability if review.inclusion_probability else 1.0
        located = (review.record_id, review.claim_index)
        item = _labelled(claim, review.label != "entailed", fold_group(record), located, weight)
        if item is not None:
            labelled.append(item)
    return labelled, unsure


# --- choosing and measuring -------------------------------------------------------------------


@dataclass(frozen=True)
class _Columns:
    """The labelled claims as arrays (one row a claim) and each group's rows."""

    score: NDArray[np.float64]
    free: NDArray[np.bool_]
    fixed: NDArray[np.bool_]
    unsupported: NDArray[np.bool_]
    weight: NDArray[np.float64]
    group: NDArray[np.int64]
    group_rows: list[NDArray[np.int64]]


def _columns(claims: Sequence[LabelledClaim]) -> _Columns:
    import numpy as np

    names = sorted({c.group for c in claims})
    index = {name: position for position, name in enumerate(names)}
    group = np.array([index[c.group] for c in claims], dtype=np.int64)
    return _Columns(
        score=np.array([c.score for c in claims], dtype=np.float64),
        free=np.array([c.fixed is None for c in claims], dtype=bool),
        fixed=np.array([bool(c.fixed) for c in claims], dtype=bool),
        unsupported=np.array([c.unsupported for c in claims], dtype=bool),
        weight=np.array([c.weight for c in claims], dtype=np.float64),
        group=group,
        group_rows=[np.flatnonzero(group == g) for g in range(len(names))],
    )


def _ratios(tp: NDArray[np.float64], fp: NDArray[np.float64], positives: float) -> tuple[
    NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]
]:
    import numpy as np

    flagged = tp + fp
    precision = np.divide(tp, flagged, out=np.zeros_like(tp), where=flagged > 0)
    recall = tp / positives if positives > 0 else np.zeros_like(tp)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(tp), where=total > 0)
    return precision, recall, f1


def choose_threshold(columns: _Columns, rows: NDArray[np.int64], target: Target) -> tuple[float, bool]:
    """The threshold ``target`` picks on the labels of ``rows`` only, and whether it reached it there.

    Candidates are the midpoints between neighbouring distinct scores (and one above the highest:
    no claim flagged by its score), so a rounded recorded score never sits on the threshold.
    """
    import numpy as np

    free, fixed = columns.free[rows], columns.fixed[rows]
    gold, weight, score = columns.unsupported[rows], columns.weight[rows], columns.score[rows]
    positives = float(weight[gold].sum())
    always = ~free & fixed
    base_tp, base_fp = float(weight[always & gold].sum()), float(weight[always & ~gold].sum())
    order = np.argsort(-score[free], kind="stable")
    scores, hits, weights = score[free][order], gold[free][order], weight[free][order]
    last = np.flatnonzero(np.r_[scores[1:] != scores[:-1], True]) if len(scores) else np.array([], np.int64)
    tp = np.r_[base_tp, base_tp + np.cumsum(weights * hits)[last]]
    fp = np.r_[base_fp, base_fp + np.cumsum(weights * ~hits)[last]]
    distinct = scores[last]
    # Candidate 0 flags no claim by its score; candidate j flags those at or above the j-th distinct score.
    top = min(1.0, (distinct[0] + 1.0) / 2) if len(distinct) else 1.0
    thresholds = np.r_[top, (distinct + np.r_[distinct[1:], 0.0]) / 2]
    precision, recall, f1 = _ratios(tp, fp, positives)
    if target.kind == "best-f1":
        reached = np.ones(len(f1), dtype=bool)
        primary, secondary = f1, precision
    elif target.kind == "precision":
        reached = (precision >= (target.bound or 0.0)) & (tp > 0)
        primary, secondary = recall, precision
    else:
        reached = recall >= (target.bound or 0.0)
        primary, secondary = precision, recall
    if not reached.any():  # the nearest point: the best of the bounded figure
        bounded = precision if target.kind == "precision" else recall
        primary, secondary, candidates = bounded, primary, np.arange(len(f1))
    else:
        candidates = np.flatnonzero(reached)
    # Best primary, then best secondary, then the highest threshold (fewest claims flagged): the last in
    # lexsort's order, whose last key sorts first.
    best = candidates[np.lexsort((thresholds[candidates], secondary[candidates], primary[candidates]))[-1]]
    return round(float(thresholds[best]), 6), bool(reached.any())


def _flags(columns: _Columns, rows: NDArray[np.int64], threshold: float) -> NDArray[np.bool_]:
    import numpy as np

    return np.where(columns.free[rows], columns.score[rows] >= threshold, columns.fixed[rows])


def _figures(columns: _Columns, rows: NDArray[np.int64], flags: NDArray[np.bool_]) -> tuple[float, float, float]:
    import numpy as np

    gold, weight = columns.unsupported[rows], columns.weight[rows]
    tp = np.array([float(weight[flags & gold].sum())])
    fp = np.array([float(weight[flags & ~gold].sum())])
    precision, recall, f1 = _ratios(tp, fp, float(weight[gold].sum()))
    return float(precision[0]), float(recall[0]), float(f1[0])


def fold_of_groups(groups: int, folds: int, seed: int) -> NDArray[np.int64]:
    """Each group's fold: a seeded shuffle dealt round-robin (folds differ in size by one group at most)."""
    import numpy as np

    fold = np.empty(groups, dtype=np.int64)
    fold[np.random.default_rng(seed).permutation(groups)] = np.arange(groups) % folds
    return fold


def cross_validate(
    columns: _Columns, rows: NDArray[np.int64], fold_of: NDArray[np.int64], target: Target, folds: int
) -> tuple[NDArray[np.bool_], list[FoldPoint]]:
    """Held-out flags of ``rows``: each fold flagged at the threshold chosen on the other folds' rows."""
    import numpy as np

    fold = fold_of[columns.group[rows]]
    flags = np.zeros(len(rows), dtype=bool)
    points = []
    for held in range(folds):
        inside = fold == held
        if not inside.any():
            continue
        threshold, _ = choose_threshold(columns, rows[~inside], target)
        flags[inside] = _flags(columns, rows[inside], threshold)
        precision, recall, _ = _figures(columns, rows[inside], flags[inside])
        points.append(FoldPoint(fold=held, threshold=threshold, claims=int(inside.sum()), precision=precision,
                                recall=recall))
    return flags, points


def _bootstrapped(
    columns: _Columns, figures: Callable[[NDArray[np.int64]], tuple[float, float, float]],
    resamples: int, seed: int,
) -> dict[str, Estimate]:
    """``figures`` (precision, recall, F1) of all rows, with intervals over resampled groups."""
    import numpy as np

    memo: dict[bytes, tuple[float, float, float]] = {}

    def on(indices: NDArray[np.int64]) -> tuple[float, float, float]:
        key = indices.tobytes()
        if key not in memo:
            memo[key] = figures(np.concatenate([columns.group_rows[i] for i in indices]))
        return memo[key]

    def figure(position: int) -> Callable[[NDArray[np.int64]], float]:
        return lambda indices: on(indices)[position]

    whole = figures(np.arange(len(columns.score)))
    estimates = {}
    for position, name in enumerate(("precision", "recall", "f1")):
        low, high = bootstrap_interval(figure(position), len(columns.group_rows), resamples, seed)
        estimates[name] = Estimate(value=whole[position], low=low, high=high)
    return estimates


def _head(records: Sequence[AuditRecord]) -> HeadName | None:
    """The shipped embedded head the records' scored claims came from (told by the threshold in their
    scores); ``None`` when they mix both heads or none matches."""
    model = load_model()
    thresholds = {claim.score.threshold for r in records for claim in r.claims if claim.score is not None}
    names = {name for name, head in model.heads.items() if head.threshold in thresholds}
    return names.pop() if len(names) == 1 and len(thresholds) == 1 else None


def _measured(
    records: Sequence[AuditRecord], labelled: Sequence[LabelledClaim], samples: Path
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Each labelled claim's feature vector, measured as evals/embedded/train.py measures a claim (against
    the full context, the global stage), and the shipped head's probability from it."""
    import numpy as np

    from rt4chart.judges.embedded.model import features
    from rt4chart.judges.embedded.verifier import analyse_request, load_encoder
    from rt4chart.method.tasks import VerifyInput
    from rt4chart.method.text import segment_context

    try:
        by_id = {s.id: s for s in load_dataset("generic", samples)}
    except DatasetError as error:
        raise CalibrationError(str(error)) from None
    wanted: dict[str, set[int]] = {}
    for item in labelled:
        wanted.setdefault(item.where[0], set()).add(item.where[1])
    encoder, model = load_encoder(), load_model()
    vectors: dict[tuple[str, int], tuple[list[float], float]] = {}
    for record in records:
        key = record_id(record)
        if key not in wanted:
            continue
        sample = by_id.get(key)
        if sample is None:
            raise CalibrationError(f"--refit needs the audited answers' contexts: {key} is not in {samples}")
        _, sentences = segment_context(sample.context)
        payload = VerifyInput(stage="global", claims=[c.text for c in record.claims], sentences=sentences,
                              question=sample.question)
        head = model.head(bool(sample.question))
        for index, analysis in enumerate(analyse_request(encoder, payload)):
            if index in wanted[key]:
                vector = features(analysis)
                vectors[(key, index)] = (vector, head.unsupported_probability(vector))
    return (np.array([vectors[c.where][0] for c in labelled]), np.array([vectors[c.where][1] for c in labelled]))


def _log_loss(gold: NDArray[np.bool_], probability: NDArray[np.float64]) -> float:
    import numpy as np

    clipped = np.clip(probability, 1e-6, 1 - 1e-6)
    return float(-np.mean(np.where(gold, np.log(clipped), np.log(1 - clipped))))


def refit_head(
    records: Sequence[AuditRecord], labelled: Sequence[LabelledClaim], samples: Path, fold_of: NDArray[np.int64],
    target: Target, folds: int, resamples: int, seed: int, shipped: dict[str, Estimate],
) -> Refit:
    """Fit the embedded head again on the labelled claims with the shipped head's training code
    (:mod:`rt4chart.judges.embedded.fit`: C by held-out log loss, then a Platt map of the held-out
    logits), fold by fold: each fold's probabilities come from a head fitted on the other folds only
    (C and Platt chosen inside them). Those out-of-fold probabilities then go through the same
    held-out threshold choice as the shipped head's. The shipped head's own figures are in-sample
    for labels it was trained on (RAGTruth QA dev, FaithBench dev), which favours it there."""
    import numpy as np

    from rt4chart.judges.embedded.fit import choose_c, platt, regression

    matrix, reproduced = _measured(records, labelled, samples)
    columns = _columns(labelled)
    gold = columns.unsupported
    fold = fold_of[columns.group]
    probability = np.zeros(len(labelled))
    chosen_c = []
    for held in range(folds):
        outside = np.flatnonzero(fold != held)
        inner = [(np.flatnonzero(fold[outside] != f), np.flatnonzero(fold[outside] == f))
                 for f in range(folds) if f != held and (fold[outside] == f).any()]
        c, inner_logits = choose_c(matrix[outside], gold[outside], inner)
        claim_map = platt(inner_logits, gold[outside])
        logits = regression(c).fit(matrix[outside], gold[outside]).decision_function(matrix[fold == held])
        probability[fold == held] = [claim_map(float(z)) for z in logits]
        chosen_c.append(c)
    refitted = [dataclasses.replace(item, score=float(p)) for item, p in zip(labelled, probability, strict=True)]
    refit_columns = _columns(refitted)

    def held_out(rows: NDArray[np.int64]) -> tuple[float, float, float]:
        flags, _ = cross_validate(refit_columns, rows, fold_of, target, folds)
        return _figures(refit_columns, rows, flags)

    figures = _bootstrapped(refit_columns, held_out, resamples, seed)
    recorded = columns.score
    shipped_auroc, refit_auroc = auroc(gold.tolist(), recorded.tolist()), auroc(gold.tolist(), probability.tolist())
    maximised = {"best-f1": "f1", "precision": "recall", "recall": "precision"}[target.kind]
    higher = (figures[maximised].value or 0.0) > (shipped[maximised].value or 0.0)
    return Refit(
        measured=len(labelled), reproduced=int((np.abs(reproduced - recorded) <= 1e-3).sum()), c=chosen_c,
        shipped_auroc=shipped_auroc, refit_auroc=refit_auroc,
        shipped_log_loss=_log_loss(gold, recorded), refit_log_loss=_log_loss(gold, probability),
        held_out=figures, beat=higher and (refit_auroc or 0.0) > (shipped_auroc or 0.0),
    )


def calibrate(
    records_path: Path, target_text: str, *, gold: Path | None = None, reviews: Path | None = None,
    folds: int = 5, resamples: int = 1000, seed: int = 0, profile: Path | None = None,
    refit: Path | None = None, judge_spec: str | None = None,
) -> Calibration:
    """Choose the operating point for ``target_text`` on the records' labelled claims, measure it on
    held-out folds, and write the judge profile that applies it to ``profile`` (:func:`write_profile`;
    ``judge_spec``: the ``--judge`` value of the records, for a calibrated profile). ``refit`` (the
    audited input, for its contexts) also refits the embedded head on these labels (:func:`refit_head`).

    Raises :class:`CalibrationError` for unusable records, labels, target or judge.
    """
    import numpy as np

    target = parse_target(target_text)
    if gold is not None and reviews is not None:
        raise CalibrationError("give the labels as --gold or --reviews, not both")
    if folds < 2:
        raise CalibrationError(f"--folds must be at least 2 (got {folds})")
    if refit is not None and folds < 3:
        raise CalibrationError("--refit needs --folds 3 or more (C is chosen on folds inside each training part)")
    try:
        records = read_predictions(records_path)
    except PredictionsError as error:
        raise CalibrationError(str(error)) from None
    judges = sorted({r.judge for r in records if r.judge})
    if len(judges) != 1:
        raise CalibrationError(f"the records must name one judge (they name {judges or 'none'})")
    judge = judges[0]
    if CALIBRATED_MARK in judge or (judge.startswith("embedded#") and "+" in judge):
        raise CalibrationError(f"the records were written by a calibrated profile ({judge}): calibrate records of "
                               "the judge's own verdicts (--judge embedded, or the judge the profile names)")
    unsure = 0
    if reviews is not None:
        labelled, unsure = reviewed_claims(records, reviews)
        source = f"reviews {reviews}"
    else:
        labelled = gold_claims(records, gold)
        source = f"gold of {gold}" if gold is not None else "the gold inside the records"
    if judge.startswith("cascade:"):
        raise CalibrationError("a cascade's stage confidence cannot be calibrated from records: they hold only the "
                               "verdict of the stage that settled each claim")
    if judge.startswith("vote:") and any(c.score is not None for r in records for c in r.claims):
        raise CalibrationError("these vote records carry a member's score where the vote's share belongs (written "
                               "before votes recorded their share alone): audit again, then calibrate")
    if not labelled:
        raise CalibrationError(f"no claim of {records_path} has both a label ({source}) and a score from its judge")
    if len({claim.unsupported for claim in labelled}) == 1:
        # Precision and recall need both kinds: on one class they come out 1.000 [1.000, 1.000] or 0,
        # whatever the threshold, and a profile chosen on them would claim a precision never measured.
        kind = "unsupported" if labelled[0].unsupported else "supported"
        raise CalibrationError(f"all {len(labelled)} labelled claims ({source}) are {kind}: an operating point needs "
                               "labels of both kinds (supported and unsupported claims); label some of the other kind")
    columns = _columns(labelled)
    groups = len(columns.group_rows)
    if groups < folds:
        raise CalibrationError(f"{groups} labelled contexts cannot fill {folds} folds: label more, or lower --folds")
    everything = np.arange(len(labelled))
    threshold, reached = choose_threshold(columns, everything, target)
    fold_of = fold_of_groups(groups, folds, seed)
    held_flags, points = cross_validate(columns, everything, fold_of, target, folds)

    def held_out(rows: NDArray[np.int64]) -> tuple[float, float, float]:
        flags, _ = cross_validate(columns, rows, fold_of, target, folds)
        return _figures(columns, rows, flags)

    current_flags = np.array([c.flagged for c in labelled])
    embedded = judge.startswith("embedded#")
    result = Calibration(
        judge=judge, score="p_unsupported" if embedded else "confidence", labels=source, target=target.describe(),
        claims=sum(len(r.claims) for r in records), labelled=len(labelled), unsure=unsure,
        weighted=bool((columns.weight != 1.0).any()), fixed=int((~columns.free).sum()), groups=groups,
        folds=folds, seed=seed, resamples=resamples, threshold=threshold, target_reached=reached,
        held_out=_bootstrapped(columns, held_out, resamples, seed),
        current=_bootstrapped(columns, lambda rows: _figures(columns, rows, current_flags[rows]), resamples, seed),
        fold_points=points,
        validation=claim_validation(
            len(labelled), [c.unsupported for c in labelled], held_flags.tolist(), [_effective(c) for c in labelled],
            THRESHOLDED_SCORE,
        ),
        changed=int((_flags(columns, everything, threshold) != current_flags).sum()),
        head=_head(records) if embedded else None,
    )
    result.ungrouped = len({c.group for c in labelled if c.group.startswith("answer ")})
    result.warnings = in_sample_warnings(result, target)
    result.below_judge = all(
        held.value is not None and own.value is not None and held.value < own.value
        for held, own in ((result.held_out[name], result.current[name]) for name in ("precision", "recall", "f1"))
    )
    if result.below_judge:
        result.warnings.append(
            "held out, the chosen point's precision, recall and F1 are all below the judge's own verdicts': it is "
            "no improvement; keep the judge as it is (or label more claims)"
        )
    if refit is not None:
        if result.score != "p_unsupported" or result.head is None:
            raise CalibrationError("--refit refits the embedded verifier's head: records of the shipped embedded "
                                   "judge, all of one kind (with or without a question)")
        result.refit = refit_head(records, labelled, refit, fold_of, target, folds, resamples, seed, result.held_out)
    if profile is not None:
        write_profile(result, profile, judge_spec)
        result.profile = str(profile)
    return result


def in_sample_warnings(result: Calibration, target: Target) -> list[str]:
    """Where a figure is not a held-out estimate: folds that let answers to one context leak, and a
    target reached only on the labels the point was chosen on."""
    warnings = []
    if result.ungrouped:
        warnings.append(
            f"{result.ungrouped} labelled answers carry no context hash (records made before rt4chart kept "
            "context_sha256): each is its own fold group, so answers to one context can sit on both sides of a "
            "fold and the held-out figures read high; audit again, or give --gold"
        )
    if target.kind != "best-f1" and target.bound is not None:
        held = result.held_out[target.kind].value
        if result.target_reached and held is not None and held < target.bound:
            warnings.append(
                f"the target holds in-sample only (on the labels the point was chosen on): held out, "
                f"{target.kind} is {held:.3f} < {target.bound:g}"
            )
    return warnings


# --- the profile ------------------------------------------------------------------------------


def _toml_value(value: object) -> str:
    # JSON's strings, numbers and booleans are TOML's (a string's escapes included).
    return json.dumps(value)


def write_profile(result: Calibration, path: Path, judge: str | None = None) -> None:
    """Write the judge profile that applies ``result``'s threshold (checked by reading it back): the
    embedded judge's own profile with ``claim_thresholds``, or for any other judge a calibrated
    profile naming ``judge`` (the ``--judge`` value of the records; default: read from their judge's
    name, :func:`judge_of_records`)."""
    if result.score == "p_unsupported":
        calibrated, lines = _embedded_profile(result, path)
    else:
        calibrated, lines = _calibrated_profile(result, path, judge)
    text = "\n".join(lines) + "\n"
    if JudgeProfile.model_validate(tomllib.loads(text)) != calibrated:
        raise AssertionError("the written profile does not read back as the calibrated one")
    write_lines_atomically(path, lines)


def _held_out_words(result: Calibration) -> str:
    held = result.held_out
    return (f"{result.target} on {result.labelled} labelled claims; held-out precision "
            f"{format_estimate(held['precision'])}, recall {format_estimate(held['recall'])}")


def _embedded_profile(result: Calibration, path: Path) -> tuple[JudgeProfile, list[str]]:
    from rt4chart.judges.embedded.verifier import VERSION

    if result.head is None:
        raise CalibrationError("the records mix answers with and without a question (both heads of the embedded "
                               "verifier): calibrate each kind from its own records")
    shipped = load_profiles()["embedded"]
    calibrated = shipped.model_copy(update={
        "name": path.stem,
        "description": f"embedded verifier at P(not entailed) >= {result.threshold:g} ({result.head} head), "
                       + _held_out_words(result),
        "claim_thresholds": {result.head: result.threshold},
    })
    fields = calibrated.model_dump(mode="json", exclude_defaults=True, exclude={"claim_thresholds"})
    fields = dict(sorted(fields.items(), key=lambda item: item[0] not in ("name", "description", "kind")))
    # The verifier's version hashes its code too: a change that moves no score changes it, so it is noted, not enforced.
    lines = [f"# Written by rt4 calibrate from {result.labels}, records of {result.judge} "
             f"(this installation: embedded#{VERSION}).",
             *(f"{name} = {_toml_value(value)}" for name, value in fields.items()),
             "", "[claim_thresholds]", f"{result.head} = {result.threshold!r}"]
    return calibrated, lines


def _calibrated_profile(result: Calibration, path: Path, judge: str | None) -> tuple[JudgeProfile, list[str]]:
    spec, base = judge_of_records(result.judge, judge)
    fields = {
        "name": path.stem, "kind": "calibrated",
        "description": f"{spec} at unsupported score >= {result.threshold:g}, " + _held_out_words(result),
        "judge": spec, "api_base": base, "claim_threshold": result.threshold,
    }
    calibrated = JudgeProfile.model_validate(fields)
    lines = [f"# Written by rt4 calibrate from {result.labels}, records of {result.judge}.",
             *(f"{name} = {_toml_value(value)}" for name, value in fields.items() if value is not None)]
    return calibrated, lines


def judge_of_records(recorded: str, judge: str | None = None) -> tuple[str, str | None]:
    """The ``--judge`` value and base URL that name the judge the records name (``recorded``).

    ``judge`` when given, else read from the name: a scripted judge's rules file loses its hash (so it
    is found from the working directory), and a server's ``@URL`` becomes the base URL. Checked: it
    must resolve (no API key needed) to a judge of exactly that name, or :class:`CalibrationError`
    asks for the ``--judge`` value the records were written with.
    """
    urls = set(re.findall(r"@(https?://[^,]*)", recorded))
    base = urls.pop() if len(urls) == 1 else None
    served = recorded.replace(f"@{base}", "") if base else recorded
    spec = judge or re.sub(r"(scripted:[^,#]*)#[0-9a-f]+", r"\1", served)
    try:
        backend = resolve_judge_for_pricing(spec, api_base=base)
    except JudgeConfigError as error:
        problem = str(error)
    else:
        asyncio.run(backend.aclose())
        if backend.name == recorded:
            return spec, base
        problem = f"--judge {spec} is the judge {backend.name}"
    raise CalibrationError(f"the profile must name the judge the records name ({recorded}), and {problem}: give the "
                           "--judge value they were written with (rt4 calibrate --judge SPEC)")


# --- presentation -----------------------------------------------------------------------------


def calibration_markdown(result: Calibration) -> str:
    """The calibration as a Markdown section: the point, held-out figures, folds, the validation table."""
    held, current = result.held_out, result.current
    note = (" (target reached in-sample: on the labels it was chosen on)" if result.target_reached
            else " (target not reached on these labels: the nearest point)")
    lines = [
        f"### Calibration of {result.judge}: {result.target}", "",
        *(f"- **warning**: {warning}" for warning in result.warnings),
        f"- labels: {result.labels}; {result.labelled} labelled claims of {result.claims}"
        + (f", {result.unsure} unsure left out" if result.unsure else "")
        + (", weighted by the plan's inclusion probabilities" if result.weighted else ""),
        f"- score: {result.score}; {result.fixed} labelled claims decided by a guard (flagged at any threshold: "
        "score 1 in the table below)",
        f"- operating point (chosen on all labels): flag a claim at score >= {result.threshold:g}{note}; "
        f"it changes {result.changed} of the labelled claims' verdicts",
        f"- held out: {result.folds} folds over {result.groups} groups (answers to one context share a fold"
        + (f"; {result.ungrouped} answers without a context hash are groups of their own" if result.ungrouped else "")
        + f"), seed {result.seed}; 95% CIs from "
        f"{result.resamples} bootstrap resamples of the groups (the cross-validation redone on each)",
        "", "| figure | held out, at the chosen point | the judge's own verdicts |", "|---|---|---|",
        *(f"| {name} | {format_estimate(held[name])} | {format_estimate(current[name])} |"
          for name in ("precision", "recall", "f1")),
        "", "| fold | threshold (chosen on the other folds) | held-out claims | precision | recall |",
        "|---:|---:|---:|---:|---:|",
        *(f"| {p.fold} | {p.threshold:g} | {p.claims} | {p.precision:.3f} | {p.recall:.3f} |"
          for p in result.fold_points),
        "", "| verifier validation | value | notes |", "|---|---:|---|",
        *(f"| {name} | {value} | {notes} |"
          for name, value, notes in claim_rows(result.validation, "held-out flags at the chosen point")),
    ]
    if result.refit is not None:
        refit = result.refit
        lines += [
            "", f"Head refitted on these labels (same features and training code as evals/embedded/train.py; C "
            f"{', '.join(f'{c:g}' for c in refit.c)} by fold): it {'BEAT' if refit.beat else 'did not beat'} "
            f"the shipped head. {refit.reproduced} of {refit.measured} claims measured again gave the recorded "
            "probability.", "",
            "| figure | refitted head (out of fold) | shipped head |", "|---|---|---|",
            f"| claim AUROC ({JUDGE_SCORE}: the head's probability) | "
            f"{format_estimate(Estimate(value=refit.refit_auroc))} | "
            f"{format_estimate(Estimate(value=refit.shipped_auroc))} |",
            f"| claim log loss | {refit.refit_log_loss:.4f} | {refit.shipped_log_loss:.4f} |",
            *(f"| held-out {name} at {result.target} | {format_estimate(refit.held_out[name])} | "
              f"{format_estimate(held[name])} |" for name in ("precision", "recall", "f1")),
        ]
    if result.profile and result.below_judge:
        lines += ["", f"wrote {result.profile}, which does worse held out than the judge's own verdicts: not "
                  "recommended (see the warning)"]
    elif result.profile:
        lines += ["", f"wrote {result.profile}: use it with --judge {result.profile}"]
    return "\n".join(lines) + "\n"

