"""Agreement statistics: checked against scikit-learn, statsmodels and a hand-worked example."""

from __future__ import annotations

import random
import re
import warnings

import numpy as np
import pytest
from sklearn.metrics import cohen_kappa_score
from statsmodels.stats.inter_rater import aggregate_raters
from statsmodels.stats.inter_rater import fleiss_kappa as statsmodels_fleiss

from rt4chart.analysis.agreement import (
    THREE_WAY,
    VerdictTable,
    agreement_report,
    claim_table,
    cohen_kappa,
    confusion_matrix,
    fleiss_kappa,
    krippendorff_alpha,
    label_distribution,
    observed_agreement,
    runs_report,
    versus_gold,
    welch_test,
)
from rt4chart.analysis.review_agreement import estimate_agreement
from rt4chart.types import AuditRecord, ClaimVerdict, Gold, Label, Span

LABELS = ["a", "b", "c"]


def random_columns(seed: int, raters: int, items: int, labels: list[str]) -> list[list[str | None]]:
    rng = random.Random(seed)
    truth = [rng.choice(labels) for _ in range(items)]
    # Raters agree with a hidden truth 60% of the time, so kappa is neither 0 nor 1.
    return [[t if rng.random() < 0.6 else rng.choice(labels) for t in truth] for _ in range(raters)]


@pytest.mark.parametrize("seed", range(20))
def test_cohen_kappa_equals_scikit_learn(seed: int) -> None:
    first, second = random_columns(seed, 2, 5 + seed * 7, LABELS)
    expected = cohen_kappa_score(first, second, labels=LABELS)
    assert cohen_kappa(first, second, LABELS).value == pytest.approx(expected, abs=1e-9)


def test_cohen_kappa_skips_missing_labels_as_scikit_learn_would_on_the_rest() -> None:
    first: list[str | None] = ["a", "b", None, "a", "c", "b", "a"]
    second: list[str | None] = ["a", "a", "b", None, "c", "b", "b"]
    kept = [(x, y) for x, y in zip(first, second, strict=True) if x is not None and y is not None]
    statistic = cohen_kappa(first, second, LABELS)
    assert statistic.n == 5
    expected = cohen_kappa_score([x for x, _ in kept], [y for _, y in kept], labels=LABELS)
    assert statistic.value == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("seed", range(20))
def test_fleiss_kappa_equals_statsmodels(seed: int) -> None:
    raters = 2 + seed % 5
    columns = random_columns(seed, raters, 10 + seed * 5, LABELS)
    codes = np.array([[LABELS.index(v) for v in row] for row in zip(*columns, strict=True)])  # type: ignore[arg-type]
    counts, _ = aggregate_raters(codes, n_cat=len(LABELS))
    expected = statsmodels_fleiss(counts, method="fleiss")
    assert fleiss_kappa(columns, LABELS).value == pytest.approx(expected, abs=1e-9)


def test_fleiss_kappa_uses_only_items_every_judge_labelled() -> None:
    columns: list[list[str | None]] = [["a", "b", "a", None], ["a", "b", "b", "a"], ["a", "a", "b", "a"]]
    statistic = fleiss_kappa(columns, LABELS)
    counts, _ = aggregate_raters(np.array([[0, 0, 0], [1, 1, 0], [0, 1, 1]]), n_cat=3)
    assert statistic.n == 3
    assert statistic.value == pytest.approx(statsmodels_fleiss(counts), abs=1e-9)


def test_krippendorff_alpha_on_krippendorffs_own_example() -> None:
    """Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", nominal data with missing
    values: 4 observers, 12 units (unit 12 has one value and is not pairable).

    Worked by hand: 40 pairable values; coincidence marginals n_1..n_5 = 9, 13, 10, 5, 3; only
    units 2 (2,2,3,2), 6 (1,2,3,4) and 8 (1,1,2,1) hold differing values: 6, 12 and 6 ordered
    differing pairs, each weighted 1/(4-1), so the off-diagonal coincidences sum to 2 + 4 + 2 = 8;
    sum_{c!=k} n_c n_k = 40^2 - (81 + 169 + 100 + 25 + 9) = 1216;
    alpha = 1 - 39 * 8 / 1216 = 113/152 = 0.74342... (the paper prints 0.743).
    """
    rows = {
        "A": "1 2 3 3 2 1 4 1 2 . . .",
        "B": "1 2 3 3 2 2 4 1 2 5 . 3",
        "C": ". 3 3 3 2 3 4 2 2 5 1 .",
        "D": "1 2 3 3 2 4 4 1 2 5 1 .",
    }
    columns: list[list[str | None]] = [[None if v == "." else v for v in row.split()] for row in rows.values()]
    statistic = krippendorff_alpha(columns, ["1", "2", "3", "4", "5"])
    assert statistic.value == pytest.approx(113 / 152, abs=1e-9)
    assert statistic.n == 11
    assert round(statistic.value, 3) == 0.743


def test_krippendorff_alpha_two_coders_small_example() -> None:
    """Two coders, four units: (a,a) (a,b) (b,b) (b,b). Coincidences: o_aa=2, o_ab=o_ba=1, o_bb=4;
    n_a=3, n_b=5, n=8; alpha = 1 - 7 * 2 / (64 - 9 - 25) = 1 - 14/30 = 8/15."""
    alpha = krippendorff_alpha([["a", "a", "b", "b"], ["a", "b", "b", "b"]], ["a", "b"])
    assert alpha.value == pytest.approx(8 / 15, abs=1e-9)


def test_confusion_and_observed_agreement() -> None:
    first: list[str | None] = ["a", "a", "b", "c", None]
    second: list[str | None] = ["a", "b", "b", "a", "a"]
    assert confusion_matrix(first, second, LABELS) == [[1, 1, 0], [0, 1, 0], [1, 0, 0]]
    assert observed_agreement(first, second, LABELS).value == pytest.approx(0.5)
    distribution = label_distribution("j", first, LABELS)
    assert distribution.counts == {"a": 2, "b": 1, "c": 1} and distribution.missing == 1


@pytest.mark.parametrize(
    ("first", "second", "warning"),
    [
        (["a", "a", "a"], ["a", "a", "a"], "same label throughout"),  # chance agreement 1
        ([None, "a"], ["b", None], "no items labelled by both"),  # no overlap
        ([], [], "no items labelled by both"),
    ],
)
def test_degenerate_kappa_is_zero_with_a_warning(
    first: list[str | None], second: list[str | None], warning: str
) -> None:
    statistic = cohen_kappa(first, second, LABELS)
    assert statistic.value == 0.0 and any(warning in w for w in statistic.warnings)


def test_a_judge_with_one_label_against_a_varied_one_is_defined_without_warning() -> None:
    statistic = cohen_kappa(["a", "a", "a", "a"], ["a", "b", "a", "b"], LABELS)
    assert statistic.value == pytest.approx(cohen_kappa_score(["a"] * 4, ["a", "b", "a", "b"]), abs=1e-9)
    assert statistic.warnings == []


def test_degenerate_fleiss_and_alpha() -> None:
    same = [["a", "a"], ["a", "a"], ["a", "a"]]
    assert fleiss_kappa(same, LABELS).value == 0.0 and fleiss_kappa(same, LABELS).warnings
    assert krippendorff_alpha(same, LABELS).value == 0.0 and krippendorff_alpha(same, LABELS).warnings
    one_item: list[list[str | None]] = [["a"], [None]]
    assert krippendorff_alpha(one_item, LABELS).warnings == [
        "no item has two labels: Krippendorff's alpha undefined, reported as 0"
    ]
    assert fleiss_kappa([["a", "b"]], LABELS).warnings  # one judge


def test_versus_gold_rates_and_their_degenerate_cases() -> None:
    gold = [True, True, False, False, None]
    predicted = [True, False, True, True, True]
    sensitivity, specificity, balanced = versus_gold(gold, predicted)
    assert (sensitivity.value, specificity.value, balanced.value) == (0.5, 0.0, 0.25)
    assert sensitivity.n == 4
    sensitivity, specificity, balanced = versus_gold([False, False], [True, False])
    assert sensitivity.value == 0.0 and "no gold positives" in sensitivity.warnings[0]
    assert balanced.value == specificity.value == 0.5 and not balanced.warnings


def table(columns: list[list[str | None]], gold: list[bool | None] | None = None) -> VerdictTable:
    return VerdictTable(
        level="answer",
        scale="hallucinated",
        judges=[f"j{i}" for i in range(len(columns))],
        items=[str(i) for i in range(len(columns[0]))],
        columns=columns,
        gold=gold,
    )


def test_report_with_bootstrap_is_seeded_and_brackets_the_value() -> None:
    rng = random.Random(1)
    gold = [rng.random() < 0.5 for _ in range(60)]
    columns: list[list[str | None]] = [
        ["hallucinated" if (g if rng.random() < q else not g) else "faithful" for g in gold] for q in (0.9, 0.7, 0.5)
    ]
    report = agreement_report(table(columns, list(gold)), resamples=200, seed=3)
    again = agreement_report(table(columns, list(gold)), resamples=200, seed=3)
    assert report == again
    assert len(report.pairs) == 3 and len(report.gold) == 3
    for statistic in [p.kappa for p in report.pairs] + [g.balanced_accuracy for g in report.gold]:
        assert statistic.ci_low is not None and statistic.ci_high is not None
        assert statistic.ci_low <= statistic.value <= statistic.ci_high
    expected = cohen_kappa_score(columns[0], columns[1])
    assert report.pairs[0].kappa.value == pytest.approx(expected, abs=1e-9)
    gold_labels = ["hallucinated" if g else "faithful" for g in gold]
    assert report.gold[0].kappa.value == pytest.approx(cohen_kappa_score(gold_labels, columns[0]), abs=1e-9)
    # The most accurate judge is the best against gold.
    assert report.gold[0].balanced_accuracy.value > report.gold[2].balanced_accuracy.value


def test_report_of_one_sample_is_defined() -> None:
    report = agreement_report(table([["faithful"], ["hallucinated"]], [True]), resamples=50)
    for statistic in (report.pairs[0].kappa, report.fleiss_kappa, report.krippendorff_alpha, report.gold[0].kappa):
        assert np.isfinite(statistic.value)
        assert statistic.ci_low is not None and np.isfinite(statistic.ci_low)
    assert report.gold[0].specificity.warnings  # no gold negatives


def claim(index: int, text: str, sentence: int | None, label: Label) -> ClaimVerdict:
    span = Span(start=sentence * 10, end=sentence * 10 + 9) if sentence is not None else None
    return ClaimVerdict(index=index, text=text, sentence_index=sentence, answer_span=span, label=label)


def test_claim_table_uses_the_shared_claim_set_when_there_is_one() -> None:
    a = AuditRecord(id="x", line=1, claims=[claim(0, "p", 0, Label.ENTAILED), claim(1, "q", 1, Label.BASELESS)])
    b = AuditRecord(id="x", line=1, claims=[claim(0, "p", 0, Label.CONTRADICTED), claim(1, "q", 1, Label.BASELESS)])
    result = claim_table([("A", [a]), ("B", [b])], [Gold(hallucinated=True, spans=[Span(start=10, end=15)])], "label")
    assert result.items == ["x@1#0", "x@1#1"] and result.alignment == "shared claim set"
    assert result.columns == [["entailed", "baseless"], ["contradicted", "baseless"]]
    assert result.gold == [False, True]
    assert result.labels == THREE_WAY


def test_claim_table_aligns_by_sentence_and_counts_what_it_cannot() -> None:
    a = AuditRecord(id="x", line=1, claims=[
        claim(0, "p1", 0, Label.ENTAILED), claim(1, "p2", 0, Label.BASELESS), claim(2, "q", 1, Label.ENTAILED),
    ])
    b = AuditRecord(id="x", line=1, claims=[claim(0, "p", 0, Label.ENTAILED), claim(1, "whole", None, Label.ENTAILED)])
    result = claim_table([("A", [a]), ("B", [b])], None, "hallucinated")
    assert result.items == ["x@1/0"]
    assert result.columns == [["hallucinated"], ["faithful"]]  # sentence 0: AND-join of A's two claims
    assert result.unaligned == 2  # A's claim on sentence 1 (B has none there), B's holistic claim
    assert result.alignment == "by answer sentence in 1 records"


def test_runs_report_differences_and_welch() -> None:
    rng = random.Random(7)
    gold: list[bool | None] = [rng.random() < 0.5 for _ in range(80)]

    def run(accuracy: float) -> list[bool | None]:
        return [g if rng.random() < accuracy else not g for g in gold]

    good = [(f"good{i}", run(0.85)) for i in range(3)]
    poor = [(f"poor{i}", run(0.55)) for i in range(3)]
    report = runs_report([("good", good), ("poor", poor)], gold, resamples=300, seed=0)
    assert report.samples == 80
    assert [j.judge for j in report.judges] == ["good", "poor"]
    difference = next(d for d in report.differences if d.metric == "balanced_accuracy")
    assert difference.difference.value == pytest.approx(
        report.judges[0].balanced_accuracy.mean - report.judges[1].balanced_accuracy.mean
    )
    assert difference.difference.ci_low is not None and difference.difference.ci_low > 0
    assert difference.welch_p is not None and difference.welch_p < 0.05


def test_welch_test_matches_scipy_and_is_undefined_without_variation() -> None:
    from scipy import stats

    t, p, warnings = welch_test([0.5, 0.6, 0.55], [0.4, 0.45, 0.41])
    expected = stats.ttest_ind([0.5, 0.6, 0.55], [0.4, 0.45, 0.41], equal_var=False)
    assert (t, p, warnings) == (pytest.approx(expected.statistic), pytest.approx(expected.pvalue), [])
    assert welch_test([0.5], [0.4, 0.3])[:2] == (None, None)
    assert welch_test([0.5, 0.5], [0.4, 0.4])[2]


def test_welch_test_on_identical_runs_is_undefined_without_a_warning() -> None:
    # Three equal figures whose floating-point variance is not exactly zero (1e-32).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t, p, notes = welch_test([0.7, 0.7, 0.7], [0.1, 0.1, 0.1])
    assert (t, p) == (None, None) and notes == ["no run-to-run variation in either judge: Welch's t-test undefined"]


def test_a_zero_width_review_interval_never_warns_of_widths_above_one() -> None:
    # Two reviews, both agreeing: every resample gives precision 1, and the note on how far the truth
    # may be (3/2 by the naive rule of three) has to stay a share.
    codes = np.array([0, 0])
    _, _, labels, _ = estimate_agreement(codes, codes, np.ones(2), resamples=50)
    note = next(w for figures in labels for w in figures.precision.warnings if "zero width" in w)
    widths = [float(number) for number in re.findall(r"\d+\.\d+", note)]
    assert widths and all(width <= 1 for width in widths), note
