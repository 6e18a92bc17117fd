"""Detection metrics against human gold labels, with seeded bootstrap confidence intervals.

Positive = hallucinated, everywhere. Definitions follow the benchmarks' reference protocols:

- answer level: precision / recall / F1 and balanced accuracy of ``AuditRecord.hallucinated``;
- span level (RAGTruth overlap protocol): hallucinated answer characters, micro-summed over
  samples: TP = |G and P|, FP = |P minus G|, FN = |G minus P|;
- IoU (Mu-SHROOM): per sample |G and P| / |G or P| over characters, 1 when both are empty,
  averaged over samples;
- AUROC of a detector score (Mann-Whitney, ties counted half);
- contradiction / baseless detection (the paper's per-type figures, on datasets that type their
  annotations): a sample is gold positive for a type when annotators marked a hallucination of
  that type, predicted positive when any claim got that label; precision / recall / F1 over the
  samples whose type labels are known;
- evidence grounding (as the paper scores it): only on correctly detected contradictions with
  alignable gold evidence, i.e. contradicted claims whose answer span overlaps a gold contradiction
  annotation that cites a context span; their quoted context characters against those cited
  spans, micro-summed;
- claim level (verifier validation): a claim whose answer span overlaps a gold hallucination span
  is gold-unsupported; precision / recall of "not entailed" and AUROC of the judge's score.

A ratio with a zero denominator is 0.0, as scikit-learn reports it (``zero_division=0``).
Bootstrap CIs resample samples with replacement (seeded) and take the 2.5 / 97.5 percentiles.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel, Field

from rt4chart.method.settlement import claim_unsupported_score
from rt4chart.types import AuditRecord, ClaimVerdict, Gold, GoldKind, Label, Span

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

T = TypeVar("T")


class PRF(BaseModel):
    """Precision, recall and F1 with the counts they come from."""

    precision: float
    """TP / (TP + FP); 0 when nothing was predicted positive."""
    recall: float
    """TP / (TP + FN); 0 when nothing is gold positive."""
    f1: float
    """Harmonic mean of precision and recall; 0 when both are 0."""
    tp: int
    """True positives (samples, characters or claims)."""
    fp: int
    """False positives."""
    fn: int
    """False negatives."""


class Estimate(BaseModel):
    """A headline figure with its bootstrap 95% confidence interval."""

    value: float | None
    """The figure on the full evaluation set; ``None`` when undefined (e.g. AUROC with one class)."""
    low: float | None = None
    """2.5th percentile of the bootstrap distribution."""
    high: float | None = None
    """97.5th percentile of the bootstrap distribution."""


class SweepPoint(BaseModel):
    """Claim-level figures at one threshold on the unsupported score."""

    threshold: float
    flagged: int
    precision: float
    recall: float
    f1: float


JUDGE_SCORE = "judge's score"
"""The claim score of ``rt4 eval``: :func:`claim_unsupported_score` as recorded."""


class ClaimValidation(BaseModel):
    """Claim-level validation of the verifier against gold hallucination spans."""

    claims: int
    """Claims in the scored reports."""
    aligned: int
    """Claims with a gold label: they have an answer span and their sample's gold has spans or is clean."""
    unaligned: int
    """Claims without a gold label (holistic claims, or gold positive without span offsets)."""
    gold_unsupported: int
    """Aligned claims that overlap a gold hallucination span."""
    at_operating_point: PRF
    """Predicted unsupported (label not entailed) against gold unsupported, over aligned claims."""
    scored: int
    """Aligned claims for which the judge reported a confidence."""
    auroc: float | None
    """AUROC of :attr:`score_name` over scored claims; ``None`` without both classes."""
    score_name: str = JUDGE_SCORE
    """What :attr:`auroc` and the sweep rank claims by (its printed name says it: one name per
    definition): the judge's own unsupported score (``rt4 eval``), or the score as ``rt4 calibrate``
    thresholds it, guard-decided claims at 0 or 1."""
    flag_everything: PRF | None = None
    """The trivial baseline: every aligned claim flagged unsupported."""
    flagged: int = 0
    """Aligned claims the verifier flagged (label not entailed)."""
    sweep: list[SweepPoint] = Field(default_factory=list)
    """Claim precision / recall / F1 of "unsupported score >= threshold" over scored claims, for
    thresholds 0.1 to 0.9 (what a different operating point would give)."""
    best_f1: SweepPoint | None = None
    """The threshold of the sweep (every distinct score tried, not only the tenths) with the best
    F1: an upper bound, chosen on the evaluated data itself."""


class EvaluationMetrics(BaseModel):
    """Every metric of one evaluation run."""

    samples: int
    """Gold samples evaluated."""
    scored: int
    """Samples with both a valid prediction and a gold answer label."""
    invalid: int
    """Samples whose prediction has no label (invalid input or a failed audit); left out of the scores."""
    missing: int
    """Gold samples without any prediction record; left out of the scores."""
    gold_positive: int
    """Scored samples that annotators marked hallucinated."""
    predicted_positive: int
    """Scored samples the detector flagged."""
    headline: dict[str, Estimate]
    """Headline figures with bootstrap 95% CIs, keyed by metric name."""
    answer: PRF
    """Answer-level precision / recall / F1 over the judged (scored) samples."""
    answer_unjudged_as_misses: PRF | None = None
    """Answer-level figures with every gold-labelled sample the judge left unjudged (``hallucinated:
    null``) counted as a miss: a false negative when gold says hallucinated, a false positive when
    it says faithful. ``None`` when every sample was judged (both readings are the same)."""
    flag_everything: PRF | None = None
    """The baseline that flags every answer, over the scored samples (beside every table: a
    detector below it at F1 is no better than flagging all)."""
    flag_everything_span: PRF | None = None
    """The span baseline that flags every answer sentence (every claim's sentence span)."""
    by_task_type: dict[str, PRF]
    """Answer-level precision / recall / F1 per gold task type."""
    span: PRF | None
    """Character-level micro precision / recall / F1 over hallucinated spans; ``None`` (n/a) when
    the claims have no answer spans (holistic decomposition)."""
    typed: int = 0
    """Scored samples whose gold types every annotation (contradiction vs baseless)."""
    contradiction: PRF | None = None
    """Contradiction detection over the typed samples; ``None`` when there are none."""
    flag_everything_contradiction: PRF | None = None
    """The trivial baseline of :attr:`contradiction`: every typed sample flagged contradicted."""
    baseless: PRF | None = None
    """Baseless-information detection over the typed samples; ``None`` when there are none."""
    flag_everything_baseless: PRF | None = None
    """The trivial baseline of :attr:`baseless`: every typed sample flagged baseless."""
    flag_everything_by_task_type: dict[str, PRF] = Field(default_factory=dict)
    """The trivial baseline of :attr:`by_task_type`: every answer of the task type flagged."""
    evidence_samples: int = 0
    """Samples with a correctly detected contradiction that has alignable gold evidence."""
    evidence: PRF | None
    """Evidence grounding on those samples (see the module docstring); ``None`` when there are none."""
    claims: ClaimValidation
    """Claim-level validation of the verifier."""
    bootstrap_resamples: int
    """Resamples behind each confidence interval."""
    seed: int
    """Seed of the bootstrap."""


def prf(tp: int, fp: int, fn: int) -> PRF:
    """Precision, recall and F1 from counts (0 for a zero denominator)."""
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return PRF(precision=precision, recall=recall, f1=f1, tp=tp, fp=fp, fn=fn)


def binary_prf(gold: Sequence[bool], predicted: Sequence[bool]) -> PRF:
    """Precision / recall / F1 of binary predictions, positive = True."""
    _same_length(gold, predicted)
    tp = sum(g and p for g, p in zip(gold, predicted, strict=True))
    fp = sum(p and not g for g, p in zip(gold, predicted, strict=True))
    fn = sum(g and not p for g, p in zip(gold, predicted, strict=True))
    return prf(tp, fp, fn)


def sensitivity_specificity(gold: Sequence[bool], predicted: Sequence[bool]) -> tuple[float | None, float | None]:
    """Recall of the positive class (sensitivity) and of the negative class (specificity); ``None``
    for a class ``gold`` does not hold."""
    import numpy as np  # here: the quick commands that import this module need no numpy

    _same_length(gold, predicted)
    g, p = np.asarray(gold, dtype=bool), np.asarray(predicted, dtype=bool)
    positives, negatives = int(g.sum()), int((~g).sum())
    sensitivity = float((p & g).sum() / positives) if positives else None
    specificity = float((~p & ~g).sum() / negatives) if negatives else None
    return sensitivity, specificity


def balanced_accuracy(gold: Sequence[bool], predicted: Sequence[bool]) -> float | None:
    """Mean recall over the classes present in ``gold`` (the defined ones of sensitivity and
    specificity); ``None`` for no samples. ``rt4 eval`` and ``rt4 agree`` both use this one."""
    defined = [rate for rate in sensitivity_specificity(gold, predicted) if rate is not None]
    return sum(defined) / len(defined) if defined else None


def auroc(gold: Sequence[bool], scores: Sequence[float]) -> float | None:
    """Area under the ROC curve of ``scores`` for positives ``gold``; ``None`` without both classes.

    Computed as the Mann-Whitney statistic with average ranks for ties.
    """
    _same_length(gold, scores)
    positives = sum(gold)
    negatives = len(gold) - positives
    if not positives or not negatives:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    position = 0
    while position < len(order):
        tied_end = position
        while tied_end + 1 < len(order) and scores[order[tied_end + 1]] == scores[order[position]]:
            tied_end += 1
        average_rank = (position + tied_end) / 2 + 1
        for k in range(position, tied_end + 1):
            ranks[order[k]] = average_rank
        position = tied_end + 1
    positive_rank_sum = sum(rank for rank, g in zip(ranks, gold, strict=True) if g)
    return (positive_rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def characters(spans: Iterable[Span]) -> set[int]:
    """The character offsets covered by ``spans`` (overlaps counted once)."""
    covered: set[int] = set()
    for span in spans:
        covered.update(range(span.start, span.end))
    return covered


def span_counts(gold: Iterable[Span], predicted: Iterable[Span]) -> tuple[int, int, int]:
    """Character TP, FP, FN of one sample."""
    gold_chars, predicted_chars = characters(gold), characters(predicted)
    return (
        len(gold_chars & predicted_chars),
        len(predicted_chars - gold_chars),
        len(gold_chars - predicted_chars),
    )


def span_prf(pairs: Iterable[tuple[Iterable[Span], Iterable[Span]]]) -> PRF:
    """Micro precision / recall / F1 over characters of (gold, predicted) span lists, summed over samples."""
    tp = fp = fn = 0
    for gold, predicted in pairs:
        sample_tp, sample_fp, sample_fn = span_counts(gold, predicted)
        tp, fp, fn = tp + sample_tp, fp + sample_fp, fn + sample_fn
    return prf(tp, fp, fn)


def iou(gold: Iterable[Span], predicted: Iterable[Span]) -> float:
    """Intersection over union of hallucinated characters; 1 when both are empty (Mu-SHROOM)."""
    gold_chars, predicted_chars = characters(gold), characters(predicted)
    union = gold_chars | predicted_chars
    return len(gold_chars & predicted_chars) / len(union) if union else 1.0


def bootstrap_interval(
    statistic: Callable[[NDArray[np.int64]], float | None], n: int, resamples: int, seed: int
) -> tuple[float | None, float | None]:
    """Percentile 95% interval of ``statistic(indices)`` over ``resamples`` resamples of ``n`` items
    with replacement; resamples on which the statistic is undefined (``None``) are skipped.

    Every bootstrap of the package draws its resamples here (numpy's default generator seeded with
    ``seed``), so one seed gives the same resamples, and for one statistic the same interval, in
    ``rt4 eval`` and ``rt4 agree``.
    """
    import numpy as np  # here: the quick commands that import this module need no numpy

    if resamples <= 0 or n == 0:
        return None, None
    rng = np.random.default_rng(seed)
    draws = [value for _ in range(resamples) if (value := statistic(rng.integers(0, n, size=n))) is not None]
    if not draws:
        return None, None
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)


def bootstrap(
    items: Sequence[T],
    statistic: Callable[[Sequence[T]], float | None],
    resamples: int = 1000,
    seed: int = 0,
) -> Estimate:
    """``statistic`` on ``items`` with a percentile bootstrap 95% CI over resampled items
    (:func:`bootstrap_interval`).

    The figure is undefined (``None``) without items; resamples on which the statistic is
    undefined are skipped.
    """
    value = statistic(items) if items else None
    if value is None or resamples < 1:
        return Estimate(value=value)
    low, high = bootstrap_interval(
        lambda indices: statistic([items[i] for i in indices]), len(items), resamples, seed
    )
    return Estimate(value=value, low=low, high=high)


def answer_score(report: AuditRecord) -> float | None:
    """Answer-level hallucination score: the highest claim unsupported score.

    ``None`` when any claim lacks a score; 0 for an answer without claims (nothing unsupported).
    """
    scores = [claim_unsupported_score(c) for c in report.claims]
    if any(s is None for s in scores):
        return None
    return max((s for s in scores if s is not None), default=0.0)


@dataclass(frozen=True)
class ScoredSample:
    """One sample's prediction paired with its gold, reduced to what the metrics need."""

    gold: bool
    predicted: bool
    score: float | None
    task_type: str
    span_tp: int
    span_fp: int
    span_fn: int
    all_span: tuple[int, int, int]
    """Span TP, FP, FN when every answer sentence is flagged (the flag-everything baseline)."""
    iou: float
    evidence: tuple[int, int, int] | None
    contradiction: tuple[bool, bool] | None
    """(gold, predicted) contradiction detection; ``None`` when the gold type is unknown."""
    baseless: tuple[bool, bool] | None
    """(gold, predicted) baseless detection; ``None`` when the gold type is unknown."""


def _overlaps(first: Span, second: Span) -> bool:
    return first.start < second.end and second.start < first.end


def evidence_counts(report: AuditRecord, gold: Gold) -> tuple[int, int, int] | None:
    """Character TP, FP, FN of the evidence of correctly detected contradictions against the gold
    evidence they align with; ``None`` when the sample has no such contradiction."""
    alignable = [
        a for a in gold.annotations
        if a.kind == "contradiction" and a.span is not None and a.evidence is not None
    ]
    cited: list[Span] = []
    expected: list[Span] = []
    for claim in report.claims:
        if claim.label != Label.CONTRADICTED or claim.answer_span is None:
            continue
        matched = [a for a in alignable if a.span is not None and _overlaps(a.span, claim.answer_span)]
        if matched:
            cited.extend(Span(start=e.start, end=e.end) for e in claim.evidence)
            expected.extend(a.evidence for a in matched if a.evidence is not None)
    return span_counts(expected, cited) if expected else None


def _detection(report: AuditRecord, gold: Gold, kind: GoldKind, label: Label) -> tuple[bool, bool] | None:
    expected = gold.has_kind(kind)
    if expected is None:
        return None
    return expected, any(claim.label == label for claim in report.claims)


def score_sample(report: AuditRecord, gold: Gold) -> ScoredSample | None:
    """Pair a valid prediction with its gold; ``None`` when either has no answer label."""
    if report.hallucinated is None or gold.hallucinated is None:
        return None
    tp, fp, fn = span_counts(gold.spans, report.spans)
    return ScoredSample(
        gold=gold.hallucinated,
        predicted=report.hallucinated,
        score=answer_score(report),
        task_type=gold.task_type or "unknown",
        span_tp=tp,
        span_fp=fp,
        span_fn=fn,
        all_span=span_counts(gold.spans, [c.answer_span for c in report.claims if c.answer_span is not None]),
        iou=iou(gold.spans, report.spans),
        evidence=evidence_counts(report, gold),
        contradiction=_detection(report, gold, "contradiction", Label.CONTRADICTED),
        baseless=_detection(report, gold, "baseless", Label.BASELESS),
    )


def _answer(samples: Sequence[ScoredSample]) -> PRF:
    return binary_prf([s.gold for s in samples], [s.predicted for s in samples])


def _span(samples: Sequence[ScoredSample]) -> PRF:
    return prf(
        sum(s.span_tp for s in samples), sum(s.span_fp for s in samples), sum(s.span_fn for s in samples)
    )


def _evidence(samples: Sequence[ScoredSample]) -> PRF | None:
    counts = [s.evidence for s in samples if s.evidence is not None]
    if not counts:
        return None
    return prf(sum(c[0] for c in counts), sum(c[1] for c in counts), sum(c[2] for c in counts))


def _typed_prf(samples: Sequence[ScoredSample], kind: GoldKind, flag_everything: bool = False) -> PRF | None:
    """Detection of ``kind`` over the samples with typed gold; with ``flag_everything``, the trivial
    detector that flags every one of them."""
    pairs = [s.contradiction if kind == "contradiction" else s.baseless for s in samples]
    known = [pair for pair in pairs if pair is not None]
    if not known:
        return None
    return binary_prf([gold for gold, _ in known], [flag_everything or predicted for _, predicted in known])


def _auroc(samples: Sequence[ScoredSample]) -> float | None:
    if any(s.score is None for s in samples):
        return None
    return auroc([s.gold for s in samples], [s.score or 0.0 for s in samples])


def _mean_iou(samples: Sequence[ScoredSample]) -> float | None:
    return sum(s.iou for s in samples) / len(samples) if samples else None


def _optional_f1(result: PRF | None) -> float | None:
    return result.f1 if result is not None else None


def _optional_precision(result: PRF | None) -> float | None:
    return result.precision if result is not None else None


def _optional_recall(result: PRF | None) -> float | None:
    return result.recall if result is not None else None


SPAN_STATISTICS = frozenset({"span_precision", "span_recall", "span_f1", "mean_iou", "evidence_f1"})
"""Headline figures that need claims mapped to answer spans: n/a for holistic decomposition."""


HEADLINE_STATISTICS: dict[str, Callable[[Sequence[ScoredSample]], float | None]] = {
    "answer_precision": lambda s: _answer(s).precision,
    "answer_recall": lambda s: _answer(s).recall,
    "answer_f1": lambda s: _answer(s).f1,
    "balanced_accuracy": lambda s: balanced_accuracy([x.gold for x in s], [x.predicted for x in s]),
    "auroc": _auroc,
    "span_precision": lambda s: _span(s).precision,
    "span_recall": lambda s: _span(s).recall,
    "span_f1": lambda s: _span(s).f1,
    "mean_iou": _mean_iou,
    "evidence_f1": lambda s: _optional_f1(_evidence(s)),
    "contradiction_precision": lambda s: _optional_precision(_typed_prf(s, "contradiction")),
    "contradiction_recall": lambda s: _optional_recall(_typed_prf(s, "contradiction")),
    "contradiction_f1": lambda s: _optional_f1(_typed_prf(s, "contradiction")),
    "baseless_f1": lambda s: _optional_f1(_typed_prf(s, "baseless")),
}
"""Headline metric name -> statistic over scored samples (what the bootstrap recomputes)."""


def claim_gold_unsupported(claim: ClaimVerdict, gold: Gold) -> bool | None:
    """Gold label of a claim: True when its answer span overlaps a gold hallucination span.

    ``None`` (cannot align) when the claim has no answer span, or the sample is gold hallucinated
    but its gold carries no span offsets.
    """
    if claim.answer_span is None or gold.hallucinated is None or (gold.hallucinated and not gold.spans):
        return None
    span = claim.answer_span
    return any(g.start < span.end and span.start < g.end for g in gold.spans)


def validate_claims(pairs: Iterable[tuple[AuditRecord, Gold]]) -> ClaimValidation:
    """Verifier validation: claims aligned to gold spans, scored at the operating point and by AUROC."""
    total = 0
    gold_labels: list[bool] = []
    predicted: list[bool] = []
    scores: list[float | None] = []
    for report, gold in pairs:
        for claim in report.claims:
            total += 1
            gold_unsupported = claim_gold_unsupported(claim, gold)
            if gold_unsupported is None:
                continue
            gold_labels.append(gold_unsupported)
            predicted.append(claim.label != Label.ENTAILED)
            scores.append(claim_unsupported_score(claim))
    return claim_validation(total, gold_labels, predicted, scores)


def claim_validation(
    claims: int, gold: Sequence[bool], predicted: Sequence[bool], scores: Sequence[float | None],
    score_name: str = JUDGE_SCORE,
) -> ClaimValidation:
    """The validation of ``claims`` claims of which these are aligned: each one's gold (unsupported or
    not), whether the verifier flagged it at its operating point, and its unsupported score (``None``:
    the judge gave none). ``rt4 eval`` (gold spans) and ``rt4 calibrate`` (a team's labels) share it."""
    scored = [(g, s) for g, s in zip(gold, scores, strict=True) if s is not None]
    scored_gold = [g for g, _ in scored]
    known = [s for _, s in scored]
    return ClaimValidation(
        claims=claims,
        aligned=len(gold),
        unaligned=claims - len(gold),
        gold_unsupported=sum(gold),
        at_operating_point=binary_prf(gold, predicted),
        scored=len(known),
        auroc=auroc(scored_gold, known),
        score_name=score_name,
        flag_everything=binary_prf(gold, [True] * len(gold)) if gold else None,
        flagged=sum(predicted),
        sweep=[_sweep_point(scored_gold, known, t / 10) for t in range(1, 10)] if known else [],
        best_f1=max(
            (_sweep_point(scored_gold, known, t) for t in sorted(set(known))), key=lambda p: p.f1, default=None
        ),
    )


def _sweep_point(gold: Sequence[bool], scores: Sequence[float], threshold: float) -> SweepPoint:
    flagged = [score >= threshold for score in scores]
    result = binary_prf(gold, flagged)
    return SweepPoint(
        threshold=round(threshold, 4), flagged=sum(flagged), precision=result.precision, recall=result.recall,
        f1=result.f1,
    )


def score_reports(
    reports: Sequence[AuditRecord],
    gold: dict[str, Gold] | None = None,
    *,
    resamples: int = 1000,
    seed: int = 0,
    spans: bool = True,
) -> EvaluationMetrics:
    """Score predictions against gold: from ``gold`` keyed by sample id, else each report's own gold.

    With a ``gold`` mapping, every gold sample counts: one without a prediction is ``missing``.
    ``spans=False`` (holistic decomposition: claims are not tied to answer sentences) reports the
    span figures as n/a instead of scoring spans no method step produced.
    """
    by_id = {r.id: r for r in reports if r.id is not None}
    if gold is None:
        pairs = [(r, r.gold) for r in reports if r.gold is not None]
        samples, missing = len(pairs), 0
    else:
        pairs = [(by_id[i], g) for i, g in gold.items() if i in by_id]
        samples, missing = len(gold), len(gold) - len(pairs)
    scored: list[ScoredSample] = []
    invalid = 0
    unjudged_gold: list[bool] = []
    for report, sample_gold in pairs:
        if report.hallucinated is None:
            invalid += 1
            if sample_gold.hallucinated is not None:
                unjudged_gold.append(sample_gold.hallucinated)
            continue
        result = score_sample(report, sample_gold)
        if result is not None:
            scored.append(result)
    by_task: dict[str, list[ScoredSample]] = {}
    for sample in scored:
        by_task.setdefault(sample.task_type, []).append(sample)
    return EvaluationMetrics(
        samples=samples,
        scored=len(scored),
        invalid=invalid,
        missing=missing,
        gold_positive=sum(s.gold for s in scored),
        predicted_positive=sum(s.predicted for s in scored),
        headline={
            name: bootstrap(scored, statistic, resamples, seed)
            if spans or name not in SPAN_STATISTICS else Estimate(value=None)
            for name, statistic in HEADLINE_STATISTICS.items()
        },
        answer=_answer(scored),
        answer_unjudged_as_misses=_with_misses(_answer(scored), unjudged_gold) if unjudged_gold else None,
        flag_everything=binary_prf([x.gold for x in scored], [True] * len(scored)) if scored else None,
        flag_everything_span=prf(*(sum(x.all_span[i] for x in scored) for i in range(3))) if spans and scored else None,
        by_task_type={task: _answer(members) for task, members in sorted(by_task.items())},
        span=_span(scored) if spans else None,
        typed=sum(s.contradiction is not None for s in scored),
        contradiction=_typed_prf(scored, "contradiction"),
        flag_everything_contradiction=_typed_prf(scored, "contradiction", flag_everything=True),
        baseless=_typed_prf(scored, "baseless"),
        flag_everything_baseless=_typed_prf(scored, "baseless", flag_everything=True),
        flag_everything_by_task_type={
            task: binary_prf([m.gold for m in members], [True] * len(members))
            for task, members in sorted(by_task.items())
        },
        evidence_samples=sum(s.evidence is not None for s in scored) if spans else 0,
        evidence=_evidence(scored) if spans else None,
        claims=validate_claims((r, g) for r, g in pairs if r.hallucinated is not None),
        bootstrap_resamples=resamples,
        seed=seed,
    )


def _with_misses(judged: PRF, unjudged_gold: Sequence[bool]) -> PRF:
    """``judged`` with each unjudged sample a miss: FN when gold hallucinated, FP when faithful."""
    positives = sum(unjudged_gold)
    return prf(judged.tp, judged.fp + len(unjudged_gold) - positives, judged.fn + positives)


def _same_length(first: Sequence[object], second: Sequence[object]) -> None:
    if len(first) != len(second):
        raise ValueError(f"length mismatch: {len(first)} gold vs {len(second)} predicted")


# --- presentation: the rows every metrics table shows (terminal, Markdown) ---------------------

HEADLINE_NAMES = {
    "answer_precision": "answer precision",
    "answer_recall": "answer recall",
    "answer_f1": "answer F1",
    "balanced_accuracy": "balanced accuracy",
    "auroc": "AUROC (answer score)",
    "span_precision": "span precision (chars)",
    "span_recall": "span recall (chars)",
    "span_f1": "span F1 (chars)",
    "mean_iou": "mean IoU",
    "evidence_f1": "evidence F1 (chars)",
    "contradiction_precision": "contradiction precision",
    "contradiction_recall": "contradiction recall",
    "contradiction_f1": "contradiction F1",
    "baseless_f1": "baseless F1",
}
"""Display names of the headline metrics, in display order."""


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _interval(estimate: Estimate) -> str:
    if estimate.low is None or estimate.high is None:
        return ""
    return f"[{estimate.low:.3f}, {estimate.high:.3f}]"


def format_estimate(estimate: Estimate | None) -> str:
    """``value [low, high]`` for a table cell; ``n/a`` when there is no value."""
    if estimate is None or estimate.value is None:
        return "n/a"
    interval = _interval(estimate)
    return f"{_figure(estimate.value)} {interval}" if interval else _figure(estimate.value)


def metric_rows(metrics: EvaluationMetrics) -> list[tuple[str, str, str]]:
    """(metric, value, 95% CI or counts) rows shared by the terminal and Markdown tables."""
    rows = [
        ("samples scored", str(metrics.scored), f"of {metrics.samples}; {metrics.invalid} invalid, "
         f"{metrics.missing} missing"),
        ("gold / predicted hallucinated", f"{metrics.gold_positive} / {metrics.predicted_positive}", ""),
    ]
    for key, name in HEADLINE_NAMES.items():
        estimate = metrics.headline.get(key)
        if estimate is not None:
            rows.append((name, _figure(estimate.value), _interval(estimate)))
    answer, span = metrics.answer, metrics.span
    rows.append(("answer TP / FP / FN", f"{answer.tp} / {answer.fp} / {answer.fn}", ""))
    if metrics.answer_unjudged_as_misses is not None:
        rows.append(("answer P / R / F1, unjudged as misses", _prf_cells(metrics.answer_unjudged_as_misses),
                     f"the {metrics.invalid} unjudged samples scored as wrong (the figures above leave them out)"))
    if metrics.flag_everything is not None:
        rows.append(("baseline: flag every answer, P / R / F1", _prf_cells(metrics.flag_everything),
                     "a detector below this F1 is no better than flagging all"))
    if metrics.flag_everything_span is not None:
        rows.append(("baseline: flag every sentence, span P / R / F1", _prf_cells(metrics.flag_everything_span),
                     "characters of every answer sentence"))
    rows.append(("span chars TP / FP / FN", f"{span.tp} / {span.fp} / {span.fn}" if span else "n/a",
                 "" if span else "claims are not mapped to answer spans (holistic decomposition)"))
    for name, typed, trivial in (("contradiction", metrics.contradiction, metrics.flag_everything_contradiction),
                                 ("baseless", metrics.baseless, metrics.flag_everything_baseless)):
        rows.append((f"{name} TP / FP / FN", f"{typed.tp} / {typed.fp} / {typed.fn}" if typed else "n/a",
                     f"over {metrics.typed} samples with typed gold"))
        if trivial is not None:
            rows.append((f"baseline: flag every answer {name}, P / R / F1", _prf_cells(trivial),
                         f"a {name} F1 below this is no better than calling every typed answer {name}"))
    rows.append(("evidence samples", str(metrics.evidence_samples),
                 "correctly detected contradictions with alignable gold evidence"))
    if len(metrics.by_task_type) > 1:
        for task, result in metrics.by_task_type.items():
            rows.append((f"answer F1 [{task}]", _figure(result.f1), f"P {result.precision:.3f}, R {result.recall:.3f}"))
            if (trivial := metrics.flag_everything_by_task_type.get(task)) is not None:
                rows.append((f"baseline [{task}]: flag every answer, P / R / F1", _prf_cells(trivial), ""))
    return rows + claim_rows(metrics.claims)


def claim_rows(claims: ClaimValidation, operating_point: str = "label != entailed") -> list[tuple[str, str, str]]:
    """The verifier-validation rows of a metrics table (claims aligned, P/R/F1 at the operating
    point, AUROC, flagged, the sweep, the best-F1 threshold); ``operating_point`` says what flags a claim."""
    rows = [("claims aligned / unaligned", f"{claims.aligned} / {claims.unaligned}",
             f"{claims.gold_unsupported} gold unsupported")]
    operating = claims.at_operating_point
    rows.append(("claim precision / recall / F1",
                 f"{operating.precision:.3f} / {operating.recall:.3f} / {operating.f1:.3f}", operating_point))
    if claims.flag_everything is not None:
        rows.append(("baseline: flag every claim, P / R / F1", _prf_cells(claims.flag_everything),
                     "a claim F1 below this is no better than flagging all"))
    rows.append((f"claim AUROC ({claims.score_name})", _figure(claims.auroc), f"{claims.scored} claims with a score"))
    rows.append(("claims flagged", f"{claims.flagged} of {claims.aligned}", operating_point))
    for point in claims.sweep:
        rows.append((f"claim sweep: score >= {point.threshold:g}", _prf_cells(point), f"{point.flagged} flagged"))
    if claims.best_f1 is not None:
        best = claims.best_f1
        rows.append(("claim best-F1 threshold", f"{best.threshold:g}",
                     f"P / R / F1 {_prf_cells(best)}; chosen on these data, an upper bound"))
    return rows


def _prf_cells(result: PRF | SweepPoint) -> str:
    return f"{result.precision:.3f} / {result.recall:.3f} / {result.f1:.3f}"


def metrics_markdown(metrics: EvaluationMetrics, title: str, details: dict[str, str] | None = None) -> str:
    """An evaluation's provenance and metrics as a Markdown section."""
    lines = [f"### {title}", ""]
    for key, value in (details or {}).items():
        lines.append(f"- {key}: {value}")
    lines += [
        "",
        f"| metric | value | 95% CI ({metrics.bootstrap_resamples} bootstrap resamples, seed {metrics.seed}) / notes |",
        "|---|---:|---|",
    ]
    lines += [f"| {name} | {value} | {note} |" for name, value, note in metric_rows(metrics)]
    return "\n".join(lines) + "\n"
