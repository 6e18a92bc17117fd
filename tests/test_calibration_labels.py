"""``rt4 calibrate`` on labels of one class (issue 40): it wrote a profile claiming precision 1.000
[1.000, 1.000] without a word. Now it is refused (exit 2, no profile), as the README says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_calibration import UNSURE_BOTH_WAYS, stated_answers, write_rules
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.runs.run import EXIT_USAGE


@pytest.mark.parametrize("kind", ["supported", "unsupported"])
def test_labels_of_one_class_are_refused_and_no_profile_is_written(tmp_path: Path, kind: str) -> None:
    answers = stated_answers(tmp_path)
    lines = []
    for line in answers.read_text(encoding="utf-8").splitlines():
        sample = json.loads(line)
        whole = [{"start": 0, "end": len(sample["answer"])}]
        sample["gold"] = {"hallucinated": kind == "unsupported", "spans": whole if kind == "unsupported" else []}
        lines.append(json.dumps(sample))
    answers.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rules = write_rules(tmp_path / "rules.json", UNSURE_BOTH_WAYS)
    records, profile = tmp_path / "records.jsonl", tmp_path / "calibrated.toml"
    first = CliRunner().invoke(app, ["verify", str(answers), "--judge", f"scripted:{rules}", "--no-cache",
                                     "--out", str(records)])
    assert first.exit_code == 1, first.output
    refused = CliRunner().invoke(app, ["calibrate", str(records), "--folds", "3", "--resamples", "20",
                                       "--out", str(profile), "--judge", f"scripted:{rules}"])
    assert refused.exit_code == EXIT_USAGE, refused.output
    assert f"are {kind}: an operating point needs labels of both kinds" in refused.output.replace("\n", " ")
    assert "Traceback" not in refused.output and not profile.exists()
