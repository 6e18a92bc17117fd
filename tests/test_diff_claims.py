"""Claim matching in ``rt4 diff`` and the claim-level ``--fail-on new`` gate (issue 39): claims that
say different things are never paired, and an answer whose unsupported claim was replaced by a
different unsupported claim fails the gate. The real CLI with a scripted judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.reports.runs import rt4

from rt4chart.analysis.diff import diff_files, match_claims
from rt4chart.types import ClaimVerdict, Label, Span

CONTEXT = "The statue is made of bronze. The statue stands in Oslo. Parking is free on Sundays."
RULES = {"verify": [
    {"claim": "made of bronze", "label": "entailed", "evidence": ["The statue is made of bronze."]},
    {"claim": "stands in Oslo", "label": "entailed", "evidence": ["The statue stands in Oslo."]},
    {"claim": "free on Sundays", "label": "entailed", "evidence": ["Parking is free on Sundays."]},
], "default": "baseless"}


def _claim(index: int, text: str, start: int, label: Label = Label.BASELESS) -> ClaimVerdict:
    return ClaimVerdict(index=index, text=text, label=label, sentence_index=0,
                        answer_span=Span(start=start, end=start + len(text)))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # difflib ratio 0.52 and 0.93: pairs under a similarity cut-off, yet they state other facts.
        ("The statue weighs 55 kilograms.", "The statue is stored in Bergen."),
        ("Parking is free on Sundays.", "Parking is free on Mondays."),
        ("The museum is open on Sundays.", "The museum is not open on Sundays."),
        ("The hall seats 5,000 people.", "The hall seats 2,000 people."),
        ("Smith beat Jones in the final.", "Jones beat Smith in the final."),
    ],
)
def test_claims_that_say_different_things_are_never_paired(old: str, new: str) -> None:
    pairs, removed, added = match_claims([_claim(0, old, 40)], [_claim(0, new, 40)])
    assert pairs == []
    assert [claim.text for claim in removed] == [old] and [claim.text for claim in added] == [new]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("The hall seats 5,000 people.", "the hall seats 5000 people"),  # case, punctuation, separator
        ("The museum opens at 9 am.", "Museum opens at 9 am."),  # an article
        ("The museum is open on Sundays and public holidays from April to October.",  # two words swapped
         "The museum is open on public holidays and Sundays from April to October."),
    ],
)
def test_claims_that_state_the_same_thing_are_paired(old: str, new: str) -> None:
    # Spans overlap but differ (the answer was edited around the claim).
    pairs, removed, added = match_claims([_claim(0, old, 40)], [_claim(0, new, 45)])
    assert [(a.text, b.text) for a, b in pairs] == [(old, new)] and removed == added == []


def _audit(directory: Path, name: str, answers: dict[str, str], *extra: str) -> tuple[Path, int]:
    inputs = directory / f"{name}.input.jsonl"
    inputs.write_text("".join(json.dumps({"id": key, "context": CONTEXT, "answer": answer}) + "\n"
                              for key, answer in answers.items()), encoding="utf-8")
    rules = directory / "rules.json"
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    out = directory / f"{name}.jsonl"
    done = rt4("verify", str(inputs), "--judge", f"scripted:{rules}", "--out", str(out), "--no-cache", "-q",
               *extra, cwd=directory)
    assert out.is_file(), done.stderr
    return out, done.returncode


BASE = {
    "replaced": "The statue is made of bronze. The statue weighs 55 kilograms.",
    "kept": "The statue stands in Oslo. It weighs 3 tonnes.",
}
NEW = {
    # Its one unsupported claim replaced by another unsupported claim: a new hallucination.
    "replaced": "The statue is made of bronze. The statue is stored in Bergen.",
    # Another sentence edited, the baseline's unsupported claim kept word for word: nothing new.
    "kept": "The statue is made of bronze. It weighs 3 tonnes.",
}


def test_a_replaced_unsupported_claim_fails_the_new_gate(tmp_path: Path) -> None:
    base, _ = _audit(tmp_path, "base", BASE, "--fail-on", "never")
    new, code = _audit(tmp_path, "new", NEW, "--baseline", str(base), "--fail-on", "new")
    assert code == 1

    result = diff_files(base, new)
    by_id = {answer.id: answer for answer in result.answers}
    assert by_id["replaced"].category == "still_hallucinated" and by_id["replaced"].gate_new
    assert not by_id["kept"].gate_new
    changes = sorted((change.kind, (change.new or change.base).text)  # type: ignore[union-attr]
                     for change in by_id["replaced"].claims)
    assert changes == [("added", "The statue is stored in Bergen."), ("removed", "The statue weighs 55 kilograms.")]
    assert all(change.kind != "flip" for answer in result.answers for change in answer.claims)
    # What fails the gate is shown: the terminal view and the Markdown name the replaced answer.
    shown = rt4("diff", str(base), str(new), "--markdown", "diff.md", cwd=tmp_path)
    assert "replaced  still hallucinated, answer text changed, with a new unsupported claim" in shown.stdout
    markdown = (tmp_path / "diff.md").read_text(encoding="utf-8")
    assert "still hallucinated, with a new unsupported claim: 1" in markdown and "`replaced`" in markdown


def test_only_the_kept_unsupported_claim_passes_the_new_gate(tmp_path: Path) -> None:
    base, _ = _audit(tmp_path, "base", BASE, "--fail-on", "never")
    _, code = _audit(tmp_path, "new", {"kept": NEW["kept"]}, "--baseline", str(base), "--fail-on", "new")
    assert code == 0
