"""The shipped model file of the embedded verifier: it loads, it is the one the pins were made with,
and it reproduces the pinned verdicts (CI does not retrain; evals/embedded/train.py does)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
from conftest import require_embedded

from rt4chart.judges.embedded.model import (
    ARTEFACT,
    FEATURES,
    Head,
    ModelArtefact,
    Platt,
    artefact_sha256,
    load_model,
    pairwise,
)

PINNED = Path(__file__).resolve().parents[1] / "fixtures" / "embedded_pinned.json"


def test_shipped_model_loads_and_is_small() -> None:
    model = load_model()
    assert set(model.heads) == {"question", "no_question"}
    assert tuple(model.features) == FEATURES
    assert ARTEFACT.stat().st_size < 200_000
    for head in model.heads.values():
        assert 0.0 < head.threshold < 1.0
        assert all(scale > 0 for scale in head.scale)


def test_shipped_model_is_the_pinned_one() -> None:
    pinned = json.loads(PINNED.read_text())
    assert artefact_sha256() == pinned["artefact_sha256"], (
        "the model file changed: run evals/embedded/pin_predictions.py and review the new verdicts"
    )


def test_model_trained_on_other_features_is_refused(tmp_path: Path) -> None:
    data = json.loads(ARTEFACT.read_text())
    data["features"] = [*data["features"][:-1], "something_else"]
    path = tmp_path / "model.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="other features"):
        load_model(path)


def test_head_is_a_standardised_logistic_regression_with_platt_maps() -> None:
    width = len(FEATURES)
    expanded = len(pairwise([0.0] * width))
    # Only the first feature and its square carry weight.
    coefficients = [0.0] * expanded
    coefficients[0], coefficients[width] = 0.5, 0.25
    head = Head(
        mean=[1.0] * width,
        scale=[2.0] * width,
        expanded_mean=[0.0] * expanded,
        expanded_scale=[1.0] * width + [4.0] * (expanded - width),
        coefficients=coefficients,
        intercept=-1.0,
        claim_calibration=Platt(slope=2.0, intercept=0.5),
        threshold=0.5,
        answer_calibration=Platt(slope=1.0, intercept=0.0),
        training={},
    )
    vector = [5.0] + [123.0] * (width - 1)
    standard = (5.0 - 1.0) / 2.0
    logit = -1.0 + 0.5 * standard + 0.25 * standard**2 / 4.0  # = 0.25
    assert head.unsupported_probability(vector) == pytest.approx(1 / (1 + math.exp(-(2.0 * logit + 0.5))))
    # With an identity answer map, the answer probability is 1 - prod(1 - p).
    assert head.answer_probability([0.2, 0.5]) == pytest.approx(1 - 0.8 * 0.5)
    assert head.answer_probability([]) == pytest.approx(1e-6)


def test_pairwise_products_follow_scikit_learns_order() -> None:
    assert pairwise([2.0, 3.0, 5.0]) == [2.0, 3.0, 5.0, 4.0, 6.0, 10.0, 9.0, 15.0, 25.0]


def test_artefact_round_trips_as_plain_json() -> None:
    text = ARTEFACT.read_text()
    assert ModelArtefact.model_validate_json(text) == load_model()
    assert hashlib.sha256(text.encode()).hexdigest() == artefact_sha256()


def test_pinned_predictions_are_reproduced() -> None:
    require_embedded()
    from rt4chart.judges.embedded.verifier import VERSION, EmbeddedBackend
    from rt4chart.method.tasks import VerifyInput
    from rt4chart.method.text import segment_context

    backend = EmbeddedBackend()
    assert backend.name == f"embedded#{VERSION}"
    pinned = json.loads(PINNED.read_text())
    labels_seen = set()
    for case in pinned["cases"]:
        _, sentences = segment_context(case["context"])
        payload = VerifyInput(stage="global", claims=case["claims"], sentences=sentences, question=case["question"])
        judgements = backend.judge(payload).judgements
        got = [(j.label.value, j.confidence) for j in judgements]
        for claim, (label, confidence), expected in zip(case["claims"], got, case["expected"], strict=True):
            assert label == expected["label"], claim
            assert confidence == pytest.approx(expected["confidence"], abs=2e-3), claim
            labels_seen.add(label)
    # The pins exercise every decision the head can make, not only one label.
    assert labels_seen == {"entailed", "baseless", "contradicted"}
