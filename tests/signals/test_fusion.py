"""Claim-level fusion: judge features, span statistics, gold claim labels, fit and JSON round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rt4chart.signals import SignalError
from rt4chart.signals.fusion import (
    claim_is_hallucinated,
    claim_row,
    fit_fusion,
    judge_features,
    load_fusion,
    save_fusion,
    signal_feature_names,
    span_statistics,
)
from rt4chart.types import ClaimVerdict, Label, Span


def claim(label: Label | None, confidence: float | None, span: Span | None) -> ClaimVerdict:
    return ClaimVerdict(index=0, text="c", sentence_index=0, answer_span=span, label=label, confidence=confidence)


def test_judge_features() -> None:
    assert judge_features(claim(Label.ENTAILED, 0.9, None)) == pytest.approx([0.0, 0.1])
    assert judge_features(claim(Label.BASELESS, 0.8, None)) == pytest.approx([1.0, 0.8])
    assert judge_features(claim(Label.CONTRADICTED, None, None)) == [1.0, 1.0]
    assert judge_features(claim(None, 0.7, None)) == [0.5, 0.5]


def test_span_statistics_and_rows() -> None:
    tokens = [(0, 4, 0.1), (4, 9, 0.5), (9, 15, 0.9)]
    assert span_statistics(tokens, Span(start=5, end=12)) == pytest.approx((0.7, 0.9))
    assert span_statistics(tokens, None) == pytest.approx((0.5, 0.9))
    assert span_statistics(tokens, Span(start=20, end=30)) == pytest.approx((0.5, 0.9))  # no overlap: whole answer
    with pytest.raises(SignalError):
        span_statistics([], None)
    row = claim_row(claim(Label.ENTAILED, None, Span(start=0, end=4)), {"sum": tokens, "jsdiv": [(0, 15, 0.3)]})
    assert row == pytest.approx([0.0, 0.0, 0.1, 0.1, 0.3, 0.3])
    assert signal_feature_names(["sum", "jsdiv"]) == [
        "judge_unsupported", "judge_p_unsupported", "sum_mean", "sum_max", "jsdiv_mean", "jsdiv_max",
    ]  # fmt: skip


def test_claim_gold_label() -> None:
    gold = [Span(start=10, end=20)]
    assert claim_is_hallucinated(claim(None, None, Span(start=15, end=30)), gold)
    assert not claim_is_hallucinated(claim(None, None, Span(start=20, end=30)), gold)
    assert not claim_is_hallucinated(claim(None, None, None), gold)


def test_fit_and_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.3
    rows = np.column_stack([labels * 1.0, rng.random(300), rng.random(300) + labels * 0.5])
    names = ["judge_unsupported", "judge_p_unsupported", "sum_max"]
    model = fit_fusion(names, rows, labels)
    path = tmp_path / "fusion.json"
    save_fusion(model, path)
    loaded = load_fusion(path)
    np.testing.assert_allclose(loaded.scores(rows), model.scores(rows))
    assert loaded.training.claims == 300 and loaded.training.positive_claims == int(labels.sum())
    assert model.classifier.coefficients[0] > 0 and model.classifier.coefficients[2] > 0
    with pytest.raises(SignalError, match="expects 3 columns"):
        loaded.scores(rows[:, :2])
    path.write_text("[]")
    with pytest.raises(SignalError, match="not an rt4chart fusion file"):
        load_fusion(path)
