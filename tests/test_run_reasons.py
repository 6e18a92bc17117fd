"""Every run's last stderr line says why it passed or failed (issue 46): the baseline gate under
``--fail-on new|worse``, invalid input lines (their first reasons with line numbers, then the
count) and the policy. The run layer decides the line (``RunOutcome.reason``); the CLI prints it.
The real CLI with a scripted judge."""

from __future__ import annotations

import json
from pathlib import Path

from fixtures.reports.runs import rt4

CONTEXT = "The statue is made of bronze. The statue stands in Oslo. Parking is free on Sundays."
RULES = {"verify": [
    {"claim": "made of bronze", "label": "entailed", "evidence": ["The statue is made of bronze."]},
    {"claim": "stands in Oslo", "label": "entailed", "evidence": ["The statue stands in Oslo."]},
], "default": "baseless"}
FAITHFUL = "The statue is made of bronze."
UNSUPPORTED = "The statue is made of bronze. It weighs 3 tonnes."


def _verify(directory: Path, name: str, lines: list[str], *extra: str) -> tuple[int, str]:
    """``rt4 verify`` of ``lines`` (JSON lines as given) with the scripted judge: exit code and the
    last stderr line."""
    inputs = directory / f"{name}.input.jsonl"
    inputs.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    rules = directory / "rules.json"
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    done = rt4("verify", str(inputs), "--judge", f"scripted:{rules}", "--out", str(directory / f"{name}.jsonl"),
               "--no-cache", *extra, cwd=directory)
    return done.returncode, done.stderr.rstrip().splitlines()[-1]


def _answers(answers: dict[str, str]) -> list[str]:
    return [json.dumps({"id": key, "context": CONTEXT, "answer": answer}) for key, answer in answers.items()]


def test_the_last_line_says_why_the_new_gate_failed_or_passed(tmp_path: Path) -> None:
    _verify(tmp_path, "base", _answers({"a": FAITHFUL, "b": UNSUPPORTED}), "--fail-on", "never")
    base = str(tmp_path / "base.jsonl")
    code, last = _verify(tmp_path, "worse", _answers({"a": UNSUPPORTED, "b": UNSUPPORTED}),
                         "--baseline", base, "--fail-on", "new")
    assert code == 1
    assert last == ("failed: --fail-on new: 1 answers hallucinated beyond the baseline (line 1); "
                    "1 hallucinated as in the baseline")
    code, last = _verify(tmp_path, "same", _answers({"a": FAITHFUL, "b": UNSUPPORTED}),
                         "--baseline", base, "--fail-on", "new")
    assert code == 0
    assert last == ("passed: --fail-on new: no answer hallucinated beyond the baseline; "
                    "1 hallucinated as in the baseline")


def test_the_last_line_says_whether_the_worse_gate_failed(tmp_path: Path) -> None:
    _verify(tmp_path, "base", _answers({"a": FAITHFUL, "b": UNSUPPORTED}), "--fail-on", "never")
    code, last = _verify(tmp_path, "new", _answers({"a": UNSUPPORTED, "b": UNSUPPORTED}),
                         "--baseline", str(tmp_path / "base.jsonl"), "--fail-on", "worse")
    assert code == 0  # one more hallucinated answer of two is no significant rise
    assert last.startswith("passed: --fail-on worse: hallucination rate 0.500 -> 1.000, not worse than the baseline")


def test_invalid_lines_end_the_run_with_their_first_reasons_and_the_count(tmp_path: Path) -> None:
    valid = _answers({"fine": FAITHFUL})
    broken = ["not json", json.dumps({"id": "no answer", "context": CONTEXT}), "[1, 2]", "{", "also not json"]
    code, last = _verify(tmp_path, "mixed", [*valid, *broken])
    assert code == 2
    assert last.startswith("invalid input: 5 of 6 input lines are not valid samples (lines 2, 3, 4, 5, 6): line 2: ")
    first, *reasons, count = last.split(" | ")
    assert first.endswith("line 2: not valid JSON (Expecting value at column 1)")
    assert [reason.split(":")[0] for reason in reasons] == ["line 3", "line 4"]
    assert "answer" in reasons[0], "the reason of line 3 names the missing field"
    assert count == "2 more in the records"
