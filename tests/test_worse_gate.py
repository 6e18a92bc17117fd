"""``rt4 verify --baseline BASE --fail-on worse`` decides by the exact McNemar test it prints, checked
against statsmodels' exact McNemar p-value: a few new hallucinations all one way can push the
percentile bootstrap CI above zero while the exact test cannot tell them from noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.reports.runs import rt4
from statsmodels.stats.contingency_tables import mcnemar

CONTEXT = "The shop opens at 9 am. Returns are accepted within 30 days."
FLIPS = "The shop opens at 9 am."  # entailed by the baseline's judge, contradicted by the new one
STABLE = "Returns are accepted within 30 days."


def rules(opening: str) -> dict[str, object]:
    return {"verify": [
        {"claim": "opens at 9", "label": opening, "evidence": ["The shop opens at 9 am."]},
        {"claim": "within 30 days", "label": "entailed", "evidence": ["Returns are accepted within 30 days."]},
    ], "default": "baseless"}


@pytest.mark.parametrize("flipped", [4, 8])
def test_worse_is_decided_by_the_printed_exact_test(tmp_path: Path, flipped: int) -> None:
    pairs = 60
    answers = [FLIPS] * flipped + [STABLE] * (pairs - flipped)
    inputs = tmp_path / "in.jsonl"
    inputs.write_text("".join(json.dumps({"id": f"a{n}", "context": CONTEXT, "answer": answer}) + "\n"
                              for n, answer in enumerate(answers)), encoding="utf-8")
    (tmp_path / "base.rules.json").write_text(json.dumps(rules("entailed")), encoding="utf-8")
    (tmp_path / "new.rules.json").write_text(json.dumps(rules("contradicted")), encoding="utf-8")
    base = rt4("verify", str(inputs), "--judge", f"scripted:{tmp_path / 'base.rules.json'}", "--out", "base.jsonl",
               "--no-cache", "-q", cwd=tmp_path)
    assert base.returncode == 0, base.stderr
    gate = rt4("verify", str(inputs), "--judge", f"scripted:{tmp_path / 'new.rules.json'}", "--out", "new.jsonl",
               "--no-cache", "-q", "--baseline", "base.jsonl", "--fail-on", "worse", cwd=tmp_path)
    # Baseline faithful everywhere; the new run hallucinates the flipped answers: [[stable, 0], [flipped, 0]].
    p_value = mcnemar([[pairs - flipped, flipped], [0, 0]], exact=True).pvalue
    printed = float(gate.stderr.split("McNemar p=")[1].split()[0].rstrip(";,"))
    assert printed == pytest.approx(p_value, rel=1e-3)
    assert gate.returncode == (1 if p_value < 0.05 else 0), gate.stderr
    assert ("worse by the exact McNemar test" if p_value < 0.05 else "not worse by the exact McNemar test") \
        in gate.stderr
    # The case the CI alone got wrong is among them: 4 of 60, p = 0.125.
    if flipped == 4:
        assert p_value == pytest.approx(0.125)
