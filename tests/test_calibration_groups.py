"""``rt4 calibrate`` without ``--gold``: folds grouped by the context each answer was given, checked
against scikit-learn's LeaveOneGroupOut, and warnings where a figure is not held out.

The records are written here: four contexts, each answered three times with the same claims (as
models answering one source tend to), so a fold that holds out one answer of a context while the
other two train it leaks. With four folds and four contexts, each fold is one context: the held-out
precision is then what LeaveOneGroupOut over contexts gives, with the best-F1 threshold chosen on
the other contexts by sklearn's precision_recall_curve.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import precision_recall_curve, precision_score
from sklearn.model_selection import LeaveOneGroupOut
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.types import AuditRecord, ClaimVerdict, Gold, Label, Span, context_sha256

# Per context: each claim's (stated unsupported score, gold unsupported).
CONTEXTS: list[list[tuple[float, bool]]] = [
    [(0.91, True), (0.62, False), (0.18, False)],
    [(0.83, True), (0.55, True), (0.27, False)],
    [(0.74, False), (0.44, True), (0.12, False)],
    [(0.68, True), (0.39, False), (0.05, False)],
]
ANSWERS_PER_CONTEXT = 3


def record(context: int, copy: int, with_context_hash: bool = True) -> AuditRecord:
    claims, spans, position = [], [], 0
    for index, (score, unsupported) in enumerate(CONTEXTS[context]):
        text = f"Claim {index} of context {context}."
        span = Span(start=position, end=position + len(text))
        label = Label.BASELESS if score >= 0.5 else Label.ENTAILED
        confidence = score if label != Label.ENTAILED else 1.0 - score
        claims.append(ClaimVerdict(index=index, text=text, sentence_index=index, answer_span=span, label=label,
                                   confidence=confidence))
        if unsupported:
            spans.append(span)
        position = span.end + 1
    hallucinated = any(label != Label.ENTAILED for label in (c.label for c in claims))
    return AuditRecord(
        id=f"c{context}-a{copy}", line=context * ANSWERS_PER_CONTEXT + copy + 1,
        label=Label.BASELESS if hallucinated else Label.ENTAILED, hallucinated=hallucinated, claims=claims,
        judge="scripted:rules.json", gold=Gold(hallucinated=bool(spans), spans=spans),
        context_sha256=context_sha256(f"The source text number {context}.") if with_context_hash else None,
    )


def write(path: Path, with_context_hash: bool = True) -> Path:
    records = [record(c, a, with_context_hash) for c in range(len(CONTEXTS)) for a in range(ANSWERS_PER_CONTEXT)]
    path.write_text("".join(r.model_dump_json() + "\n" for r in records), encoding="utf-8")
    return path


def calibrate(path: Path, *options: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["calibrate", str(path), "--folds", str(len(CONTEXTS)), "--resamples", "20",
                                      "--json", *options])
    assert result.exit_code == 0, result.output
    return dict(json.loads(result.output))


def leave_one_context_out() -> tuple[float, float]:
    """Held-out (precision, recall) by sklearn: LeaveOneGroupOut over contexts, each held-out context
    flagged at the best-F1 score of the others (flag a claim when its score is at or above the
    midpoint between that score and the next lower one, rt4chart's candidate thresholds)."""
    rows = [(c, s, u) for c in range(len(CONTEXTS)) for _ in range(ANSWERS_PER_CONTEXT) for s, u in CONTEXTS[c]]
    groups = np.array([c for c, _, _ in rows])
    scores = np.array([s for _, s, _ in rows])
    gold = np.array([u for _, _, u in rows])
    flags = np.zeros(len(rows), dtype=bool)
    for train, test in LeaveOneGroupOut().split(scores, gold, groups):
        precision, recall, thresholds = precision_recall_curve(gold[train], scores[train])
        with np.errstate(invalid="ignore", divide="ignore"):
            f1 = np.nan_to_num(2 * precision * recall / (precision + recall))[:-1]
        chosen = thresholds[int(np.argmax(f1))]
        # rt4chart flags at the midpoint between the chosen score and the next lower one it saw.
        lower = scores[train][scores[train] < chosen]
        flags[test] = scores[test] >= (chosen + (lower.max() if lower.size else 0.0)) / 2
    return float(precision_score(gold, flags)), float(np.sum(flags & gold) / np.sum(gold))


def test_the_folds_hold_out_whole_contexts(tmp_path: Path) -> None:
    report = calibrate(write(tmp_path / "records.jsonl"))
    precision, recall = leave_one_context_out()
    assert report["groups"] == len(CONTEXTS) and report["ungrouped"] == 0 and not report["warnings"]
    assert [p["claims"] for p in report["fold_points"]] == [ANSWERS_PER_CONTEXT * 3] * len(CONTEXTS)
    assert report["held_out"]["precision"]["value"] == pytest.approx(precision)
    assert report["held_out"]["recall"]["value"] == pytest.approx(recall)


def test_records_without_a_context_hash_are_grouped_by_answer_and_warned_of(tmp_path: Path) -> None:
    report = calibrate(write(tmp_path / "records.jsonl", with_context_hash=False))
    assert report["groups"] == report["ungrouped"] == len(CONTEXTS) * ANSWERS_PER_CONTEXT
    assert any("no context hash" in warning for warning in report["warnings"])
    shown = CliRunner().invoke(app, ["calibrate", str(tmp_path / "records.jsonl"), "--resamples", "20"])
    assert shown.exit_code == 0 and "**warning**" in shown.output and "read high" in shown.output


def test_a_target_reached_only_in_sample_is_warned_of(tmp_path: Path) -> None:
    report = calibrate(write(tmp_path / "records.jsonl"), "--target", "precision>=0.8")
    held = report["held_out"]["precision"]["value"]
    assert report["target_reached"] and held < 0.8
    assert any("in-sample only" in warning and f"{held:.3f}" in warning for warning in report["warnings"])
    shown = CliRunner().invoke(app, ["calibrate", str(tmp_path / "records.jsonl"), "--folds", "4",
                                     "--resamples", "20", "--target", "precision>=0.8"])
    assert "target reached in-sample" in shown.output
