"""Probes: selectors on synthetic window features with a planted signal, AggTruth's own selectors
against independent computations of their definitions, the JSON round trip against
scikit-learn's own pipeline, and refusal of damaged or foreign probe files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import rankdata
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import MinMaxScaler

from rt4chart.signals import SignalError
from rt4chart.signals.attention import AttentionFeatures
from rt4chart.signals.probe import (
    WindowSet,
    build_windows,
    load_probe,
    parse_selector,
    save_probe,
    select_heads,
    train_probe,
    training_hash,
)
from rt4chart.types import Span

LAYERS, HEADS = 6, 4
SIGNAL_HEADS = {(2, 1), (3, 0)}  # layer, head whose Sum drops on hallucinated tokens


def synthetic(count: int, seed: int) -> tuple[list[AttentionFeatures], list[list[Span]]]:
    rng = np.random.default_rng(seed)
    features, spans = [], []
    for _ in range(count):
        tokens = int(rng.integers(12, 30))
        offsets = [(2 * i, 2 * i + 2) for i in range(tokens)]
        bad = np.zeros(tokens, dtype=bool)
        gold: list[Span] = []
        if rng.random() < 0.5:
            start = int(rng.integers(0, tokens - 4))
            bad[start : start + 4] = True
            gold = [Span(start=2 * start, end=2 * start + 8)]
        values = rng.uniform(0.2, 0.8, size=(4, tokens, LAYERS, HEADS))
        for layer, head in SIGNAL_HEADS:
            values[0, bad, layer, head] -= 0.5
        features.append(AttentionFeatures(offsets, values, rng.uniform(0.3, 0.6, size=tokens)))
        spans.append(gold)
    return features, spans


def test_selector_parsing() -> None:
    for text in (
        "center:0.5", "center:12", "random:20:15", "random-positive:20:20", "spearman", "spearman:significant",
        "spearman:0.1", "lasso:0.05", "best-of-random:30:4", "best-of-random-positive:20:5", "layers-center:0.5", "all",
    ):  # fmt: skip
        assert str(parse_selector(text)) == text
    assert str(parse_selector("lasso")) == "lasso:0.05"
    # spearman:auto was renamed spearman:significant; center's R is a count or a fraction below 1;
    # a Boruta-like selector cannot ask for more marks than repeats.
    for bad in (
        "spearman:auto", "spearman:2", "center:0", "center:1.5", "center:x", "random:0:3", "random:3:5",
        "layers-center:2", "lasso:-1", "magic",
    ):  # fmt: skip
        with pytest.raises(SignalError, match=r"unknown head selector .*best-of-random:N:K"):
            parse_selector(bad)


def test_selectors_find_the_planted_heads() -> None:
    features, spans = synthetic(60, 0)
    windows = build_windows(features, spans, "sum")
    planted = sorted(layer * HEADS + head for layer, head in SIGNAL_HEADS)
    # Overlapping windows are not independent, so chance heads pass p < 0.001 too; the planted
    # ones rank first.
    assert set(planted) < set(select_heads(windows, parse_selector("spearman:significant")))
    assert select_heads(windows, parse_selector(f"spearman:{2 / (LAYERS * HEADS)}")) == planted
    assert select_heads(windows, parse_selector("spearman")) == planted
    assert set(planted) <= set(select_heads(windows, parse_selector("lasso:0.05")))
    assert select_heads(windows, parse_selector("layers-center:0.5")) == list(range(1 * HEADS, 4 * HEADS))
    assert select_heads(windows, parse_selector("all")) == list(range(LAYERS * HEADS))
    # Sum drops on hallucinated tokens: the planted heads have the lowest median ratios.
    assert set(planted) <= set(select_heads(windows, parse_selector("center:4")))
    assert set(planted) <= set(select_heads(windows, parse_selector("random:10:10")))
    assert not set(planted) & set(select_heads(windows, parse_selector("random-positive:10:1")))
    chosen = select_heads(windows, parse_selector("best-of-random:30:4"), seed=1)
    assert len(chosen) == 4 and set(chosen) & set(planted)
    positive = select_heads(windows, parse_selector("best-of-random-positive:30:4"), seed=1)
    assert set(positive) <= set(chosen)
    # The planted heads get negative weights and are not kept.
    assert not set(positive) & set(planted)


def window_set(head_columns: np.ndarray, labels: np.ndarray, layers: int, heads: int) -> WindowSet:
    """Windows with the given head features (a constant passage column appended), one answer each."""
    matrix = np.column_stack([head_columns, np.full(len(labels), 0.5)])
    return WindowSet(matrix, labels.astype(bool), np.arange(len(labels), dtype=np.int64), layers, heads)


def test_center_keeps_the_extreme_median_ratios() -> None:
    # Negative windows have median 1 in every head; positive windows have median RATIOS[head].
    ratios = np.array([0.5, 2.0, 1.0, 3.0, 0.25, 1.1])
    negatives = np.array([[1.0], [0.8], [1.2], [1.0]]) * np.ones(6)
    positives = np.array([[1.0], [0.9], [1.1]]) * ratios
    windows = window_set(np.vstack([negatives, positives]), np.array([0, 0, 0, 0, 1, 1, 1]), 2, 3)
    # By hand: highest ratios 3.0 (head 3), 2.0 (1), 1.1 (5); lowest 0.25 (4), 0.5 (0), 1.0 (2).
    assert select_heads(windows, parse_selector("center:2")) == [3, 4]
    assert select_heads(windows, parse_selector("center:4")) == [0, 1, 3, 4]
    assert select_heads(windows, parse_selector("center:3")) == [1, 3, 4]  # the odd head goes to the highest
    assert select_heads(windows, parse_selector("center:0.5")) == [1, 3, 4]  # half of 6 heads
    assert select_heads(windows, parse_selector("center:6")) == list(range(6))
    with pytest.raises(SignalError, match="more heads asked for"):
        select_heads(windows, parse_selector("center:7"))


def boruta_reference(windows: WindowSet, repeats: int, accept: int, positive_only: bool, seed: int) -> list[int]:
    """AggTruth's Random/Random+ written out with scikit-learn's pipeline, for comparison."""
    heads = windows.layers * windows.heads
    generator = np.random.default_rng(seed)
    marks = np.zeros(heads)
    for _ in range(repeats):
        augmented = np.column_stack([windows.matrix[:, :heads], generator.random(len(windows.labels))])
        scaled = MinMaxScaler().fit_transform(augmented)
        weights = LogisticRegression(class_weight="balanced", max_iter=2000).fit(scaled, windows.labels).coef_[0]
        bar = abs(weights[-1])
        marks += weights[:-1] > bar if positive_only else np.abs(weights[:-1]) > bar
    return [int(head) for head in np.flatnonzero(marks >= accept)]


def test_random_selectors_beat_an_appended_random_column() -> None:
    rng = np.random.default_rng(7)
    labels = rng.random(1500) < 0.3
    columns = rng.uniform(0, 1, size=(1500, 8))
    columns[:, 2] += 0.6 * labels  # larger on positives: a positive coefficient
    columns[:, 5] -= 0.6 * labels  # smaller on positives: a negative coefficient
    windows = window_set(columns, labels, 2, 4)
    for text, repeats, accept, positive_only in (
        ("random:6:6", 6, 6, False), ("random:6:3", 6, 3, False), ("random-positive:6:6", 6, 6, True)
    ):  # fmt: skip
        chosen = select_heads(windows, parse_selector(text), seed=3)
        assert chosen == boruta_reference(windows, repeats, accept, positive_only, seed=3)
        assert chosen == select_heads(windows, parse_selector(text), seed=3)  # seeded: the same again
    assert {2, 5} <= set(select_heads(windows, parse_selector("random:6:6"), seed=3))
    positive = select_heads(windows, parse_selector("random-positive:6:6"), seed=3)
    assert 2 in positive and 5 not in positive


def test_spearman_keeps_heads_above_half_the_best_correlation() -> None:
    rng = np.random.default_rng(11)
    labels = rng.random(800) < 0.4
    noise = rng.normal(size=(800, 6))
    columns = noise.copy()
    columns[:, 0] += 2.0 * labels  # strongest
    columns[:, 3] -= 1.2 * labels  # strong, negative
    columns[:, 4] += 0.3 * labels  # weak: below half the best
    windows = window_set(columns, labels, 2, 3)
    # Spearman's rho is Pearson's r on ranks.
    rho = np.array([np.corrcoef(rankdata(columns[:, i]), rankdata(labels))[0, 1] for i in range(6)])
    expected = [i for i in range(6) if abs(rho[i]) > np.abs(rho).max() / 2]
    assert expected == [0, 3]
    assert select_heads(windows, parse_selector("spearman")) == expected


def test_probe_json_round_trip_equals_sklearn_pipeline(tmp_path: Path) -> None:
    features, spans = synthetic(60, 0)
    windows = build_windows(features, spans, "sum")
    probe = train_probe(
        windows,
        feature="sum",
        selector=parse_selector("spearman:significant"),
        model="m#1",
        template_version="t1",
        data_sha256=training_hash([str(i) for i in range(60)], ["a"] * 60, spans),
    )
    path = tmp_path / "probe.json"
    save_probe(probe, path)
    stored = json.loads(path.read_text())
    assert stored["format"] == 1 and stored["feature"] == "sum" and stored["training"]["sklearn_version"]
    loaded = load_probe(path)
    assert loaded == probe
    columns = [*probe.columns, LAYERS * HEADS]
    scaler = MinMaxScaler().fit(windows.matrix[:, columns])
    reference = LogisticRegression(class_weight="balanced", max_iter=2000).fit(
        scaler.transform(windows.matrix[:, columns]), windows.labels
    )
    test_features, test_spans = synthetic(20, 5)
    test_windows = build_windows(test_features, test_spans, "sum")
    expected = reference.predict_proba(scaler.transform(test_windows.matrix[:, columns]))[:, 1]
    np.testing.assert_allclose(loaded.window_scores(test_windows.matrix), expected, atol=1e-9)
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(test_windows.labels, expected) > 0.9


def test_damaged_or_foreign_probe_files_are_refused(tmp_path: Path) -> None:
    features, spans = synthetic(40, 0)
    probe = train_probe(
        build_windows(features, spans, "jsdiv"),
        feature="jsdiv",
        selector=parse_selector("layers-center:0.5"),
        model="m#1",
        template_version="t1",
        data_sha256="x",
    )
    path = tmp_path / "p.json"
    save_probe(probe, path)
    with pytest.raises(SignalError, match="trained on m#1"):
        load_probe(path).check_model("other#2")
    with pytest.raises(SignalError, match="cannot read the probe"):
        load_probe(tmp_path / "missing.json")
    path.write_text("{not json")
    with pytest.raises(SignalError, match="is not an rt4chart probe file"):
        load_probe(path)
    stored = probe.model_dump()
    stored["format"] = 99
    path.write_text(json.dumps(stored))
    with pytest.raises(SignalError, match="probe format 99"):
        load_probe(path)
    stored["format"] = 1
    stored["classifier"]["coefficients"].append(1.0)
    path.write_text(json.dumps(stored))
    with pytest.raises(SignalError, match="does not match"):
        load_probe(path)


def test_training_needs_both_classes() -> None:
    features, spans = synthetic(10, 0)
    with pytest.raises(SignalError, match="both positive and negative"):
        train_probe(
            build_windows(features, [[] for _ in spans], "sum"),
            feature="sum",
            selector=parse_selector("all"),
            model="m",
            template_version="t",
            data_sha256="x",
        )
