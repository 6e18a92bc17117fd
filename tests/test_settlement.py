"""rt4 eval reports which judge settled each claim and how often it agreed with the gold claim labels."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.runs.evaluation import EvaluationResult

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"
RULES = FIXTURES / "fixtures.rules.json"


def test_eval_of_a_cascade_reports_claims_settled_per_stage(tmp_path: Path) -> None:
    # The fixture rules are 0.9 sure of the three entailed claims and less sure of the others,
    # which go on to a stand-in that calls everything baseless.
    stand_in = tmp_path / "everything-baseless.json"
    stand_in.write_text(json.dumps({"default": "baseless"}))
    judge = f"cascade:scripted:{RULES}@0.85,scripted:{stand_in}"
    outcome = CliRunner().invoke(app, [
        "eval", "ragtruth-qa", "--path", str(FIXTURES / "ragtruth-qa"), "--split", "dev", "--judge", judge,
        "--results-dir", str(tmp_path / "results"), "--resamples", "20", "-q",
    ])
    assert outcome.exit_code == 0, outcome.output
    [written] = (tmp_path / "results").glob("*.json")
    result = EvaluationResult.model_validate_json(written.read_text(encoding="utf-8"))
    first, second = (
        next(stage for judge, stage in result.settled_by_judge.items() if name in judge)
        for name in ("fixtures.rules", "everything-baseless")
    )
    # First stage: the three claims it is 0.9 sure of, all entailed, all clean in gold.
    assert (first.claims, first.aligned, first.agreeing, first.accuracy) == (3, 3, 3, 1.0)
    # Stand-in: "closes at 8 pm" and "built in 1850" are gold hallucinations (agree); "free on Sundays" is not.
    assert (second.claims, second.aligned, second.agreeing) == (3, 3, 2)
    assert len(result.settled_by_judge) == 2
    markdown = written.with_suffix(".md").read_text(encoding="utf-8")
    assert "3 claims, accuracy 1.000 on 3 aligned" in markdown
