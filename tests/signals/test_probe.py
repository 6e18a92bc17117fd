"""Probes: selectors on synthetic window features with a planted signal, the JSON round trip
against scikit-learn's own pipeline, and refusal of damaged or foreign probe files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import MinMaxScaler

from rt4chart.signals import SignalError
from rt4chart.signals.attention import AttentionFeatures
from rt4chart.signals.probe import (
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
    assert str(parse_selector("spearman:auto")) == "spearman:auto"
    assert str(parse_selector("spearman:0.1")) == "spearman:0.1"
    assert str(parse_selector("lasso")) == "lasso:0.05"
    assert str(parse_selector("random-positive:20:5")) == "random-positive:20:5"
    assert str(parse_selector("center:0.5")) == "center:0.5"
    for bad in ("spearman", "spearman:2", "random:0:3", "center:x", "lasso:-1", "magic"):
        with pytest.raises(SignalError, match="unknown head selector"):
            parse_selector(bad)


def test_selectors_find_the_planted_heads() -> None:
    features, spans = synthetic(60, 0)
    windows = build_windows(features, spans, "sum")
    planted = sorted(layer * HEADS + head for layer, head in SIGNAL_HEADS)
    # Overlapping windows are not independent, so chance heads pass p < 0.001 too; the planted
    # ones rank first.
    assert set(planted) < set(select_heads(windows, parse_selector("spearman:auto")))
    assert select_heads(windows, parse_selector(f"spearman:{2 / (LAYERS * HEADS)}")) == planted
    assert set(planted) <= set(select_heads(windows, parse_selector("lasso:0.05")))
    assert select_heads(windows, parse_selector("center:0.5")) == list(range(1 * HEADS, 4 * HEADS))
    assert select_heads(windows, parse_selector("all")) == list(range(LAYERS * HEADS))
    chosen = select_heads(windows, parse_selector("random:30:4"), seed=1)
    assert len(chosen) == 4 and set(chosen) & set(planted)
    positive = select_heads(windows, parse_selector("random-positive:30:4"), seed=1)
    assert set(positive) <= set(chosen)
    # Sum drops on hallucinated tokens: the planted heads get negative weights and are not kept.
    assert not set(positive) & set(planted)


def test_probe_json_round_trip_equals_sklearn_pipeline(tmp_path: Path) -> None:
    features, spans = synthetic(60, 0)
    windows = build_windows(features, spans, "sum")
    probe = train_probe(
        windows,
        feature="sum",
        selector=parse_selector("spearman:auto"),
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
        selector=parse_selector("center:0.5"),
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
