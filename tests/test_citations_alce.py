"""ALCE citation precision and recall, checked against ALCE's own definition computed by hand.

The context's five passages and a truth table of which passage sets support which claim are written
here; a scripted judge follows that table (its rules answer "entailed" exactly where a supporting
set is in view). :func:`alce_by_hand` re-implements ``compute_autoais`` of ALCE's eval.py
(Gao et al. 2023) over that table: its own sentence split, its own ``[\\d+`` citation regex, the
table as the NLI model. Each answer is one of the kinds the figures disagreed on: two citations that
each support the claim, an over-cited claim, a claim needing two passages jointly, a citation out of
range, three citations with one redundant, and an answer that cites nothing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from fixtures.reports.runs import rt4

from rt4chart.judges.scripted import ScriptedBackend
from rt4chart.options import AuditOptions
from rt4chart.records.io import parse_sample
from rt4chart.runs.engine import Pipeline
from rt4chart.runs.planning import worst_case_calls

PASSAGES = [
    "The museum opens at 9 am.",
    "Doors open at 9 am daily.",
    "The museum is in Bergen.",
    "Tickets cost 20 euros.",
    "Children under 12 enter for free.",
]

SUPPORT: dict[str, list[set[int]]] = {
    # claim key -> the minimal passage sets (0-based) that support it
    "opens at 9 am": [{0}, {1}],
    "located in Bergen": [{2}],
    "cost 20 euros and children under 12 enter free": [{3, 4}],
}
"""The truth the judge follows, and ALCE's NLI model here."""

RULES: dict[str, Any] = {
    "verify": [
        # Over-citing: with passages 3 and 4 in view the judge also quotes the ticket price.
        {"claim": "located in Bergen", "chunk_contains": "The museum is in Bergen. Tickets cost 20 euros.",
         "label": "entailed", "evidence": ["The museum is in Bergen.", "Tickets cost 20 euros."]},
        {"claim": "located in Bergen", "chunk_contains": "The museum is in Bergen.", "label": "entailed",
         "evidence": ["The museum is in Bergen."]},
        {"claim": "opens at 9 am", "chunk_contains": "The museum opens at 9 am.", "label": "entailed",
         "evidence": ["The museum opens at 9 am."]},
        {"claim": "opens at 9 am", "chunk_contains": "Doors open at 9 am daily.", "label": "entailed",
         "evidence": ["Doors open at 9 am daily."]},
        {"claim": "cost 20 euros and children under 12 enter free",
         "chunk_contains": "Tickets cost 20 euros. Children under 12 enter for free.", "label": "entailed",
         "evidence": ["Tickets cost 20 euros.", "Children under 12 enter for free."]},
    ],
    "default": "baseless",
}

ANSWERS = {
    "each-supports": "The museum opens at 9 am [1][2].",
    "over-cited": "The museum is located in Bergen [3][4].",
    "jointly": "Tickets cost 20 euros and children under 12 enter free [4][5].",
    "one-uncited-sentence": "The museum opens at 9 am [1]. The museum is located in Bergen.",
    "cites-nothing": "The museum is located in Bergen.",
    "out-of-range": "The museum opens at 9 am [1][9].",
    "three-one-redundant": "The museum opens at 9 am [1][2][3].",
    "wrong-passage": "The museum is located in Bergen [4].",
    "three-jointly": "Tickets cost 20 euros and children under 12 enter free [3][4][5].",
}


def supports(passages: set[int], sentence: str) -> bool:
    """The NLI model: the passages support the sentence when they hold one of its supporting sets."""
    return any(key in sentence and any(needed <= passages for needed in SUPPORT[key]) for key in SUPPORT)


def alce_by_hand(answer: str) -> tuple[float, float]:
    """(precision, recall) of one output, as ``compute_autoais`` of ALCE's eval.py computes them."""
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", answer) if s]
    entail = entail_prec = total_citations = 0
    for sentence in sentences:
        refs = [int(r[1:]) - 1 for r in re.findall(r"\[\d+", sentence)]
        target = re.sub(r"\[\d+\]", "", sentence)
        if not refs or any(r >= len(PASSAGES) for r in refs):
            joint = False
        else:
            total_citations += len(refs)
            joint = supports(set(refs), target)
        entail += joint
        if joint and len(refs) > 1:
            for ref in refs:
                if supports({ref}, target) or not supports(set(refs) - {ref}, target):
                    entail_prec += 1
        else:
            entail_prec += joint
    return (entail_prec / total_citations if total_citations else 0.0), entail / len(sentences)


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    directory = tmp_path_factory.mktemp("alce")
    (directory / "rules.json").write_text(json.dumps(RULES), encoding="utf-8")
    lines = [{"id": key, "context": PASSAGES, "answer": answer} for key, answer in ANSWERS.items()]
    (directory / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    completed = rt4("verify", "in.jsonl", "--out", "out.jsonl", "--no-cache", "-q", "--judge",
                    f"scripted:{directory / 'rules.json'}", "--decomposer", "rules", "--fail-on", "never",
                    cwd=directory)
    assert completed.returncode == 0, completed.stderr
    found = [json.loads(line) for line in (directory / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    return directory, found


def test_the_judge_follows_the_truth_table(audited: tuple[Path, list[dict[str, Any]]]) -> None:
    _, found = audited
    for record in found:
        for claim in record["claims"]:
            assert claim["label"] == ("entailed" if supports(set(range(len(PASSAGES))), claim["text"]) else "baseless")


def test_each_answers_figures_are_alces(audited: tuple[Path, list[dict[str, Any]]]) -> None:
    _, found = audited
    by_hand = {key: alce_by_hand(answer) for key, answer in ANSWERS.items()}
    # The kinds of case the issue names, so that the table cannot drift into easy ones.
    assert by_hand["each-supports"] == (1.0, 1.0)
    assert by_hand["over-cited"] == (0.5, 1.0)
    assert by_hand["out-of-range"] == (0.0, 0.0)
    for record in found:
        precision, recall = by_hand[record["id"]]
        if record["id"] == "cites-nothing":
            assert "citations" not in record
            continue
        assert (record["citations"]["precision"], record["citations"]["recall"]) == pytest.approx(
            (precision, recall)), record["id"]


def test_the_run_means_count_an_answer_citing_nothing_as_zero(audited: tuple[Path, list[dict[str, Any]]]) -> None:
    directory, _ = audited
    by_hand = [alce_by_hand(answer) for answer in ANSWERS.values()]
    run = json.loads((directory / "out.jsonl.manifest.json").read_text(encoding="utf-8"))["counts"]["citations"]
    assert run["precision"] == pytest.approx(sum(p for p, _ in by_hand) / len(by_hand))
    assert run["recall"] == pytest.approx(sum(r for _, r in by_hand) / len(by_hand))
    assert run["uncited_answers"] == 1 and run["answers"] == len(ANSWERS) - 1


def test_the_relevant_citations_and_the_checks_behind_them(audited: tuple[Path, list[dict[str, Any]]]) -> None:
    _, found = audited
    claims = {record["id"]: record["claims"] for record in found}
    over = claims["over-cited"][0]["citation"]
    assert over["relevant"] == [2]
    assert {(tuple(c["passages"]), c["label"]) for c in over["subset_checks"]} == {((2,), "entailed"),
                                                                                  ((3,), "baseless")}
    # The evidence settles passage 1 alone and the pair {1, 2}: only 2 and 3 alone are asked.
    three = claims["three-one-redundant"][0]["citation"]
    assert three["relevant"] == [0, 1]
    assert [c["passages"] for c in three["subset_checks"]] == [[1], [2]]


def test_the_worst_case_plan_bounds_the_checks(audited: tuple[Path, list[dict[str, Any]]]) -> None:
    directory, found = audited
    pipeline = Pipeline(ScriptedBackend.from_file(directory / "rules.json"), AuditOptions(decomposer="rules"))
    for number, (key, answer) in enumerate(ANSWERS.items(), 1):
        sample = parse_sample({"id": key, "context": PASSAGES, "answer": answer}, number).sample
        assert sample is not None
        record = next(r for r in found if r["id"] == key)
        assert worst_case_calls(pipeline, sample) >= record["usage"]["calls"], key
