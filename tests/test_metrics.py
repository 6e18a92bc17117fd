"""Metrics against scikit-learn and against examples worked by hand."""

from __future__ import annotations

import random

import pytest
from sklearn.metrics import (
    balanced_accuracy_score,
    f1_score,
    precision_score,
    recall_score,
    roc_auc_score,
)

from rt4chart.analysis.agreement import FAITHFUL, HALLUCINATED, VerdictTable, agreement_report
from rt4chart.analysis.metrics import (
    auroc,
    balanced_accuracy,
    binary_prf,
    bootstrap,
    claim_gold_unsupported,
    iou,
    metric_rows,
    metrics_markdown,
    score_reports,
    span_prf,
    validate_claims,
)
from rt4chart.types import AuditRecord, ClaimVerdict, Evidence, Gold, GoldAnnotation, Label, Span


def _spans(*pairs: tuple[int, int]) -> list[Span]:
    return [Span(start=a, end=b) for a, b in pairs]


def _random_labels(seed: int, n: int) -> tuple[list[bool], list[bool], list[float]]:
    rng = random.Random(seed)
    gold = [rng.random() < 0.3 for _ in range(n)]
    predicted = [rng.random() < 0.4 for _ in range(n)]
    # Scores on a coarse grid so that ties occur and the tie handling is exercised.
    scores = [round(rng.random() * 10) / 10 for _ in range(n)]
    return gold, predicted, scores


@pytest.mark.parametrize("seed", range(6))
def test_binary_prf_and_balanced_accuracy_match_sklearn(seed: int) -> None:
    gold, predicted, _ = _random_labels(seed, 57)
    ours = binary_prf(gold, predicted)
    assert ours.precision == pytest.approx(precision_score(gold, predicted, zero_division=0))
    assert ours.recall == pytest.approx(recall_score(gold, predicted, zero_division=0))
    assert ours.f1 == pytest.approx(f1_score(gold, predicted, zero_division=0))
    assert balanced_accuracy(gold, predicted) == pytest.approx(balanced_accuracy_score(gold, predicted))


def test_prf_zero_division_is_zero_like_sklearn() -> None:
    gold, predicted = [False, False, True], [False, False, False]
    ours = binary_prf(gold, predicted)
    assert (ours.precision, ours.recall, ours.f1) == (0.0, 0.0, 0.0)
    assert ours.precision == precision_score(gold, predicted, zero_division=0)


@pytest.mark.parametrize("seed", range(6))
def test_auroc_matches_sklearn_with_ties(seed: int) -> None:
    gold, _, scores = _random_labels(seed, 80)
    assert auroc(gold, scores) == pytest.approx(roc_auc_score(gold, scores))


def test_auroc_undefined_with_one_class_and_worked_example() -> None:
    assert auroc([True, True], [0.1, 0.9]) is None
    # Positives 0.8, 0.4; negatives 0.4, 0.1: pairs won 1 + 1 + 0.5 (tie) + 1 = 3.5 of 4.
    assert auroc([True, True, False, False], [0.8, 0.4, 0.4, 0.1]) == pytest.approx(0.875)


def test_span_micro_prf_hand_worked_with_overlaps_and_empty_samples() -> None:
    pairs = [
        # Gold [0,10) ; predicted [5,15) and [8,12) overlapping: P chars 5..14 (10), TP 5, FP 5, FN 5.
        (_spans((0, 10)), _spans((5, 15), (8, 12))),
        # Nothing gold, nothing predicted: contributes nothing.
        ([], []),
        # Gold [0,4) missed entirely: FN 4.
        (_spans((0, 4)), []),
        # Predicted [2,3) where nothing is gold: FP 1.
        ([], _spans((2, 3))),
    ]
    result = span_prf(pairs)
    assert (result.tp, result.fp, result.fn) == (5, 6, 9)
    assert result.precision == pytest.approx(5 / 11)
    assert result.recall == pytest.approx(5 / 14)
    assert result.f1 == pytest.approx(2 * (5 / 11) * (5 / 14) / (5 / 11 + 5 / 14))


def test_span_prf_of_nothing_is_zero() -> None:
    result = span_prf([([], [])])
    assert (result.precision, result.recall, result.f1) == (0.0, 0.0, 0.0)


def test_iou_hand_worked() -> None:
    assert iou([], []) == 1.0
    assert iou(_spans((0, 5)), []) == 0.0
    assert iou([], _spans((0, 5))) == 0.0
    # Gold 0..9 (10 chars); predicted 5..14 plus overlapping 12..15 -> 5..15 (11 chars); inter 5, union 16.
    assert iou(_spans((0, 10)), _spans((5, 15), (12, 16))) == pytest.approx(5 / 16)
    # Overlapping gold spans count each character once.
    assert iou(_spans((0, 4), (2, 6)), _spans((0, 6))) == 1.0


def test_eval_and_agree_give_one_seed_the_same_interval() -> None:
    # One balanced accuracy, bootstrapped by rt4 eval's path (items) and rt4 agree's (code columns).
    rng = random.Random(3)
    gold = [rng.random() < 0.4 for _ in range(80)]
    flagged = [g if rng.random() < 0.8 else not g for g in gold]
    pairs = list(zip(gold, flagged, strict=True))
    evaluated = bootstrap(pairs, lambda s: balanced_accuracy([g for g, _ in s], [p for _, p in s]), 200, seed=0)
    comparisons = agreement_report(
        VerdictTable(level="answer", scale="hallucinated", judges=["judge"], items=[str(i) for i in range(80)],
                     columns=[[HALLUCINATED if f else FAITHFUL for f in flagged]], gold=list(gold)),
        resamples=200, seed=0,
    ).gold
    agreed = comparisons[0].balanced_accuracy
    assert evaluated.value == pytest.approx(agreed.value)
    assert (evaluated.low, evaluated.high) == pytest.approx((agreed.ci_low, agreed.ci_high))
    assert evaluated.low is not None and evaluated.low < evaluated.value


def test_balanced_accuracy_matches_scikit_learn_with_one_class_absent() -> None:
    assert balanced_accuracy([True, True], [True, False]) == pytest.approx(0.5)
    assert balanced_accuracy([], []) is None


def test_bootstrap_is_seeded_and_brackets_the_value() -> None:
    items = [1.0] * 30 + [0.0] * 70

    def mean(sample: list[float] | tuple[float, ...]) -> float:
        return sum(sample) / len(sample)

    first = bootstrap(items, mean, resamples=300, seed=7)
    again = bootstrap(items, mean, resamples=300, seed=7)
    assert first == again
    # Seeds draw different resamples (on values where different resamples give different bounds).
    spread = [random.Random(1).random() * n for n in range(100)]
    assert bootstrap(spread, mean, resamples=300, seed=7) != bootstrap(spread, mean, resamples=300, seed=8)
    assert first.value == pytest.approx(0.3)
    assert first.low is not None and first.high is not None
    assert first.low < 0.3 < first.high
    assert first.low > 0.15 and first.high < 0.45


def _claim(index: int, span: tuple[int, int] | None, label: Label, confidence: float | None) -> ClaimVerdict:
    return ClaimVerdict(
        index=index,
        text=f"claim {index}",
        sentence_index=index,
        answer_span=Span(start=span[0], end=span[1]) if span else None,
        label=label,
        confidence=confidence,
    )


def test_claim_alignment_rules() -> None:
    gold = Gold(hallucinated=True, spans=_spans((10, 20)))
    assert claim_gold_unsupported(_claim(0, (0, 10), Label.ENTAILED, None), gold) is False
    assert claim_gold_unsupported(_claim(1, (15, 30), Label.ENTAILED, None), gold) is True
    assert claim_gold_unsupported(_claim(2, None, Label.ENTAILED, None), gold) is None
    no_offsets = Gold(hallucinated=True)
    assert claim_gold_unsupported(_claim(0, (0, 10), Label.ENTAILED, None), no_offsets) is None


def test_validate_claims_counts_operating_point_and_auroc() -> None:
    report = AuditRecord(
        id="a",
        line=1,
        claims=[
            _claim(0, (0, 10), Label.ENTAILED, 0.9),  # gold supported, score 0.1
            _claim(1, (10, 20), Label.CONTRADICTED, 0.8),  # gold unsupported, score 0.8
            _claim(2, (20, 30), Label.BASELESS, 0.6),  # gold supported (no overlap), score 0.6
            _claim(3, None, Label.BASELESS, None),  # holistic: unaligned
        ],
    )
    result = validate_claims([(report, Gold(hallucinated=True, spans=_spans((12, 18))))])
    assert (result.claims, result.aligned, result.unaligned, result.gold_unsupported) == (4, 3, 1, 1)
    operating = result.at_operating_point
    assert (operating.tp, operating.fp, operating.fn) == (1, 1, 0)
    assert result.scored == 3
    assert result.auroc == pytest.approx(roc_auc_score([False, True, False], [0.1, 0.8, 0.6]))


def _report(
    id_: str, hallucinated: bool | None, spans: list[Span], gold: Gold, claims: list[ClaimVerdict]
) -> AuditRecord:
    label = None if hallucinated is None else (Label.BASELESS if hallucinated else Label.ENTAILED)
    return AuditRecord(
        id=id_, line=1, label=label, hallucinated=hallucinated, spans=spans, claims=claims, gold=gold
    )


def test_score_reports_end_to_end() -> None:
    evidence = Evidence(start=0, end=5, text="abcde", sentence_ids=[0])
    contradicted = _claim(0, (0, 10), Label.CONTRADICTED, 0.9).model_copy(update={"evidence": [evidence]})
    reports = [
        _report("tp", True, _spans((0, 10)),
                Gold(hallucinated=True, spans=_spans((5, 10)), task_type="QA", evidence=_spans((0, 10)),
                     typed=True, annotations=[_annotation((5, 10), "contradiction", evidence=(0, 10))]),
                [contradicted]),
        _report("tn", False, [], Gold(hallucinated=False, task_type="QA"),
                [_claim(0, (0, 8), Label.ENTAILED, 0.7)]),
        _report("fn", False, [], Gold(hallucinated=True, spans=_spans((0, 4)), task_type="Summary"),
                [_claim(0, (0, 8), Label.ENTAILED, 0.6)]),
        _report("bad", None, [], Gold(hallucinated=True), []),
    ]
    metrics = score_reports(reports, resamples=200, seed=1)
    assert (metrics.samples, metrics.scored, metrics.invalid, metrics.missing) == (4, 3, 1, 0)
    assert (metrics.answer.tp, metrics.answer.fp, metrics.answer.fn) == (1, 0, 1)
    assert metrics.by_task_type["QA"].f1 == 1.0 and metrics.by_task_type["Summary"].recall == 0.0
    assert (metrics.span.tp, metrics.span.fp, metrics.span.fn) == (5, 5, 4)
    assert metrics.headline["mean_iou"].value == pytest.approx((5 / 10 + 1.0 + 0.0) / 3)
    assert metrics.headline["auroc"].value == pytest.approx(roc_auc_score([1, 0, 1], [0.9, 0.3, 0.4]))
    assert metrics.headline["balanced_accuracy"].value == pytest.approx(0.75)
    assert metrics.evidence is not None
    assert (metrics.evidence.tp, metrics.evidence.fp, metrics.evidence.fn) == (5, 0, 5)
    answer_f1 = metrics.headline["answer_f1"]
    assert answer_f1.low is not None and answer_f1.high is not None and answer_f1.low <= answer_f1.high


def test_score_reports_with_separate_gold_counts_missing_predictions() -> None:
    gold = {"a": Gold(hallucinated=True, spans=_spans((0, 3))), "b": Gold(hallucinated=False)}
    reports = [_report("a", True, _spans((0, 3)), Gold(), [])]
    metrics = score_reports(reports, gold, resamples=50)
    assert (metrics.samples, metrics.scored, metrics.missing) == (2, 1, 1)
    assert metrics.answer.f1 == 1.0
    # An answer without claims has nothing unsupported: score 0, not "unknown".
    assert metrics.headline["auroc"].value is None  # only one gold class scored


def _annotation(span: tuple[int, int], kind: str, evidence: tuple[int, int] | None = None) -> GoldAnnotation:
    return GoldAnnotation.model_validate({
        "span": {"start": span[0], "end": span[1]}, "label": kind, "kind": kind,
        "evidence": {"start": evidence[0], "end": evidence[1]} if evidence else None,
    })


def _typed_report(id_: str, labels: list[Label], annotations: list[GoldAnnotation]) -> AuditRecord:
    gold = Gold(hallucinated=bool(annotations), spans=[a.span for a in annotations if a.span], typed=True,
                annotations=annotations)
    claims = [_claim(i, (10 * i, 10 * i + 10), label, 0.8) for i, label in enumerate(labels)]
    return _report(id_, any(label != Label.ENTAILED for label in labels), [], gold, claims)


def test_contradiction_and_baseless_detection_count_samples_by_gold_type() -> None:
    reports = [
        _typed_report("contradiction found", [Label.CONTRADICTED], [_annotation((0, 5), "contradiction")]),
        _typed_report("contradiction called baseless", [Label.BASELESS], [_annotation((0, 5), "contradiction")]),
        _typed_report("baseless found", [Label.ENTAILED, Label.BASELESS], [_annotation((12, 15), "baseless")]),
        _typed_report("clean, flagged contradicted", [Label.CONTRADICTED], []),
        _typed_report("clean", [Label.ENTAILED], []),
        # An annotation without a type: this sample's type figures are unknown, not negative.
        _typed_report("untyped", [Label.BASELESS], [GoldAnnotation(label="Unwanted")]),
    ]
    metrics = score_reports(reports, resamples=20)
    assert metrics.typed == 5
    assert metrics.contradiction is not None and metrics.baseless is not None
    assert (metrics.contradiction.tp, metrics.contradiction.fp, metrics.contradiction.fn) == (1, 1, 1)
    assert (metrics.baseless.tp, metrics.baseless.fp, metrics.baseless.fn) == (1, 1, 0)
    assert metrics.headline["contradiction_f1"].value == pytest.approx(0.5)
    assert metrics.headline["baseless_f1"].value == pytest.approx(2 / 3)
    untyped = score_reports([_report("x", True, [], Gold(hallucinated=True), [])], resamples=0)
    assert untyped.contradiction is None and untyped.headline["contradiction_f1"].value is None


def test_evidence_is_scored_only_on_correctly_detected_alignable_contradictions() -> None:
    cited = Evidence(start=0, end=6, text="abcdef", sentence_ids=[0])
    claim = _claim(0, (0, 10), Label.CONTRADICTED, 0.9).model_copy(update={"evidence": [cited]})
    elsewhere = claim.model_copy(update={"answer_span": Span(start=20, end=30)})
    baseless_claim = claim.model_copy(update={"label": Label.BASELESS})

    def gold(*annotations: GoldAnnotation) -> Gold:
        return Gold(hallucinated=True, spans=[a.span for a in annotations if a.span], typed=True,
                    annotations=list(annotations))

    reports = [
        _report("aligned", True, [], gold(_annotation((2, 8), "contradiction", evidence=(3, 9))), [claim]),
        # A contradiction flagged on another part of the answer is not a correct detection.
        _report("misplaced", True, [], gold(_annotation((2, 8), "contradiction", evidence=(3, 9))), [elsewhere]),
        # The right part, but called baseless: not a detected contradiction.
        _report("mislabelled", True, [], gold(_annotation((2, 8), "contradiction", evidence=(3, 9))),
                [baseless_claim]),
        # A detected contradiction whose gold cites no context: not alignable.
        _report("no gold evidence", True, [], gold(_annotation((2, 8), "contradiction")), [claim]),
    ]
    metrics = score_reports(reports, resamples=0)
    assert metrics.evidence_samples == 1
    assert metrics.evidence is not None
    assert (metrics.evidence.tp, metrics.evidence.fp, metrics.evidence.fn) == (3, 3, 3)


def test_holistic_decomposition_reports_span_metrics_as_not_applicable() -> None:
    report = _typed_report("a", [Label.CONTRADICTED], [_annotation((0, 5), "contradiction", evidence=(0, 4))])
    metrics = score_reports([report], resamples=0, spans=False)
    assert metrics.span is None and metrics.evidence is None and metrics.evidence_samples == 0
    for name in ("span_precision", "span_recall", "span_f1", "mean_iou", "evidence_f1"):
        assert metrics.headline[name].value is None
    assert metrics.headline["answer_f1"].value == 1.0 and metrics.headline["contradiction_f1"].value == 1.0


def _judged_or_not(gold_flags: list[bool], predicted: list[bool | None]) -> list[AuditRecord]:
    return [
        _report(f"s{i}", flag, [], Gold(hallucinated=gold), [])
        for i, (gold, flag) in enumerate(zip(gold_flags, predicted, strict=True))
    ]


def test_unjudged_samples_are_scored_both_ways() -> None:
    # Six gold-labelled samples; the judge left two unjudged (one hallucinated, one faithful).
    reports = _judged_or_not([True, True, False, False, True, False], [True, False, False, True, None, None])
    metrics = score_reports(reports, resamples=10)
    assert (metrics.scored, metrics.invalid) == (4, 2)
    assert (metrics.answer.tp, metrics.answer.fp, metrics.answer.fn) == (1, 1, 1)
    misses = metrics.answer_unjudged_as_misses
    assert misses is not None and (misses.tp, misses.fp, misses.fn) == (1, 2, 2)
    assert misses.f1 < metrics.answer.f1, "a run that failed on the hard samples no longer scores better"
    rows = dict((name, value) for name, value, _ in metric_rows(metrics))
    assert rows["answer P / R / F1, unjudged as misses"] == "0.333 / 0.333 / 0.333"
    every = score_reports(_judged_or_not([True, False], [True, False]), resamples=10)
    assert every.answer_unjudged_as_misses is None
    assert "answer P / R / F1, unjudged as misses" not in {name for name, _, _ in metric_rows(every)}


def test_the_flag_everything_baselines_sit_beside_every_table() -> None:
    gold = Gold(hallucinated=True, spans=_spans((0, 5)))
    claims = [_claim(0, (0, 10), Label.BASELESS, 0.9), _claim(1, (11, 20), Label.ENTAILED, 0.8)]
    reports = [
        _report("a", True, _spans((0, 10)), gold, claims),
        _report("b", False, [], Gold(hallucinated=False, spans=[]), [_claim(0, (0, 8), Label.ENTAILED, 0.9)]),
    ]
    metrics = score_reports(reports, resamples=10)
    everything = metrics.flag_everything
    assert everything is not None and (everything.tp, everything.fp, everything.fn) == (1, 1, 0)
    span = metrics.flag_everything_span
    # Flagging every sentence: sample a's 19 sentence characters (5 gold) and sample b's 8.
    assert span is not None and (span.tp, span.fp, span.fn) == (5, 14 + 8, 0)
    names = [name for name, _, _ in metric_rows(metrics)]
    assert "baseline: flag every answer, P / R / F1" in names
    assert "baseline: flag every sentence, span P / R / F1" in names
    assert f"| baseline: flag every answer, P / R / F1 | {everything.precision:.3f} / 1.000 / " in metrics_markdown(
        metrics, "t"
    )


def test_verifier_validation_reports_flagged_claims_a_sweep_and_the_best_f1_threshold() -> None:
    gold = Gold(hallucinated=True, spans=_spans((0, 5), (30, 35)))
    # Unsupported scores 0.9 and 0.7 for the claims on gold spans, 0.6 and 0.6 for the others.
    claims = [
        _claim(0, (0, 10), Label.BASELESS, 0.9),
        _claim(1, (11, 20), Label.ENTAILED, 0.4),
        _claim(2, (21, 29), Label.BASELESS, 0.6),
        _claim(3, (30, 40), Label.ENTAILED, 0.3),
    ]
    validation = validate_claims([(_report("a", True, [], gold, claims), gold)])
    assert validation.flagged == 2
    assert [p.threshold for p in validation.sweep] == [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]
    at_half = validation.sweep[4]
    assert (at_half.flagged, at_half.precision, at_half.recall) == (4, 0.5, 1.0)
    best = validation.best_f1
    assert best is not None and best.threshold == 0.7 and best.f1 == 1.0
    assert all(point.f1 <= best.f1 for point in validation.sweep)
