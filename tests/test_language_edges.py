"""Languages at the edges (issue 40): an answer of zero-width spaces was detected as Khmer, so the
embedded verifier (English only) left it open (exit 4) where the README promises ``baseless`` with
``mode: none``; ``"language": "xx"`` was accepted as a language."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audit_fixtures import write_rules
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.languages import detect_language

runner = CliRunner()


@pytest.mark.parametrize("answer", ["\u200b\u200b\u200b", "\u200b \u200c\u2060\ufeff", "\u200b…🙂"])
def test_a_text_without_letters_has_no_language_of_its_own(answer: str) -> None:
    assert detect_language(answer, "The store opened in 1990.") == "en"


def test_a_contentless_answer_is_baseless_for_the_embedded_verifier_in_any_language(tmp_path: Path) -> None:
    rows = [
        {"context": "The store opened in 1990.", "answer": "\u200b\u200b\u200b"},
        {"context": "The store opened in 1990.", "answer": "\u200b \u200c\u2060\ufeff"},
        {"context": "ហាងបានបើកនៅឆ្នាំ ១៩៩០។", "answer": "..."},  # Khmer context: nothing to judge in it
    ]
    inputs, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inputs.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    done = runner.invoke(app, ["verify", str(inputs), "--out", str(out), "--no-cache", "-q"])
    assert done.exit_code == 1, done.output  # baseless answers: hallucinated, not incomplete (4)
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [record["label"] for record in records] == ["baseless"] * 3
    assert all(record["decomposition"]["mode"] == "none" and not record["incomplete"] for record in records)
    assert all(record["usage"]["calls"] == 0 for record in records)


@pytest.mark.parametrize("language", ["xx", "qq-XX", "zz"])
def test_an_unknown_two_letter_language_is_the_lines_error(tmp_path: Path, language: str) -> None:
    inputs, out, rules = tmp_path / "in.jsonl", tmp_path / "out.jsonl", write_rules(tmp_path / "rules.json")
    sample = {"context": "Store 1 opens daily at 9 am.", "answer": "Store 1 opens at 9 am."}
    inputs.write_text(json.dumps({**sample, "language": language}) + "\n" + json.dumps(sample) + "\n", encoding="utf-8")
    done = runner.invoke(app, ["verify", str(inputs), "--out", str(out), "--judge", f"scripted:{rules}",
                               "--decomposer", "rules", "--no-cache", "-q"])
    assert done.exit_code == 2, done.output  # an invalid input line
    first, second = (json.loads(line) for line in out.read_text(encoding="utf-8").splitlines())
    assert first["label"] is None and "not a language code or name" in first["errors"][0]
    assert second["label"] == "entailed"
    flag = runner.invoke(app, ["verify", str(inputs), "--judge", f"scripted:{rules}", "--language", language])
    assert flag.exit_code == 2 and "not a language code or name" in flag.output, flag.output
