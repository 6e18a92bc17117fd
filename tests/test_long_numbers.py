"""Numbers of any length and citation markers with any count of refs (issue 40): a long id or hash
in scraped text was a float (infinity from 309 digits on) and rounding it crashed the default judge
with exit 5 on that line, for good (``--resume`` met the same line again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

from rt4chart.method.citations import find_citations
from rt4chart.method.decompose import claim_problem
from rt4chart.method.text import numbers_in, same_number
from rt4chart.types import Sample

ROOT = Path(__file__).resolve().parent.parent
LONG_ID = "9" * 400
ONES = ",".join(["1"] * 10_000)


def rt4(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=600)


def test_long_numbers_are_exact_and_compare_without_overflow() -> None:
    from rt4chart.method.text import shown_number  # new with exact numbers

    one, other = numbers_in(f"id {LONG_ID}"), numbers_in(f"id {LONG_ID[:-1]}8")
    assert one != other and one == {Decimal(LONG_ID)}
    assert not same_number(Decimal(LONG_ID), frozenset({Decimal(5)}))
    assert not same_number(Decimal(5), one)
    # Scale words multiply exactly, far past a float's range ("million" 60 times is 10**360).
    (huge,) = numbers_in("9 " + "million " * 60)
    assert huge == 9 * Decimal(10) ** 360 and shown_number(huge) == "9e+360"
    assert numbers_in(ONES) == {Decimal("1" * 10_000)}
    # What was right before stays right: rounding, percentages, the messages' form.
    assert same_number(Decimal("23.70"), frozenset({Decimal(24)}))
    assert same_number(Decimal("0.5"), numbers_in("50%"))
    assert numbers_in("4.1 million and half a million") == {Decimal(4_100_000), Decimal(500_000)}
    assert [shown_number(n) for n in sorted(numbers_in("1990 and 4.1 million"))] == ["1990", "4.1e+06"]


def test_the_decomposition_check_reads_a_long_number_as_a_foreign_one() -> None:
    answer = f"The order id is {LONG_ID}."
    problem = claim_problem(f"The order id is {LONG_ID[:-1]}8.", answer, answer, None)
    assert problem is not None and "states 1e+400" in problem
    assert claim_problem(answer, answer, answer, None) is None


def test_refs_beyond_the_passages_are_unresolved_refs_of_any_length() -> None:
    sample = Sample(id="x", context=["The store opened in 1990.", "Cakes."],
                    answer=f"It opened in 1990 [{'9' * 99}]. It sells cakes [2].")
    cited = find_citations(sample)
    assert cited is not None
    assert [marker.passages for marker in cited.markers] == [[], [1]]
    # A custom pattern lifts the built-in 100-character bound: 10,000 refs, and one of 5,000 digits
    # (int() refuses 4,300), are ordinary refs, resolved or not.
    sample = sample.model_copy(update={"answer": f"It opened in 1990 <{ONES}>. It sells cakes <{'7' * 5000}>."})
    cited = find_citations(sample, pattern=r"<(?P<refs>[^>]+)>")
    assert cited is not None
    assert [marker.passages for marker in cited.markers] == [[0] * 10_000, []]
    # A superscript is a digit but no number: not a marker, so it stays in the text.
    superscript = sample.model_copy(update={"answer": "It opened in 1990 [²]."})
    assert find_citations(superscript) is None


def test_a_long_number_or_marker_gets_its_record_from_the_default_judge(tmp_path: Path) -> None:
    rows = [
        {"question": "When?", "context": "The store opened in 1990.", "answer": "The store opened in 1990."},
        {"question": "Which id?", "context": "The order id is 5 and the store opened in 1990.",
         "answer": f"The order id is {LONG_ID}."},
        {"question": "When?", "context": "The store opened in 1990.", "answer": f"The store opened in 1990 [{ONES}]."},
        {"question": "When?", "context": ["The store opened in 1990.", "It sells cakes."],
         "answer": "The store opened in 1990 [²]."},
    ]
    inputs, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inputs.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    done = rt4("verify", str(inputs), "--out", str(out), "--no-cache", "-q", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # the id the context never states is a finding, not a crash
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(records) == len(rows) and all(record.get("error") is None for record in records)
    assert records[1]["label"] != "entailed"
