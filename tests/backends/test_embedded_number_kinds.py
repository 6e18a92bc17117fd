"""Years and counts in the embedded judge's number guard (issue 39): a number from 1000 to 2100 is
not always a year, and a claim number the context does not state, where the matched sentence
states another number of the same kind, is never entailed. The real model, no network."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torch", reason="needs torch (the embedded extra)")
pytest.importorskip("transformers", reason="needs transformers (the embedded extra)")

from rt4chart.judges.embedded.verifier import EmbeddedBackend
from rt4chart.method.tasks import ClaimJudgement, VerifyInput
from rt4chart.method.text import StatedNumber, read_numbers, segment_context
from rt4chart.types import Label

_WORDS = re.compile(r"\d+(?:[.,]\d+)*|[A-Za-z]+")


@pytest.fixture(scope="module")
def backend() -> EmbeddedBackend:
    return EmbeddedBackend()


def _judge(backend: EmbeddedBackend, context: str, claim: str, question: str | None) -> ClaimJudgement:
    _, sentences = segment_context([context])
    [judgement] = backend.judge(
        VerifyInput(stage="global", claims=[claim], sentences=sentences, question=question)
    ).judgements
    return judgement


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("It seats about 2,000 people.", [(2000, "count")]),  # a thousands separator
        ("It seats about two thousand people.", [(2000, "count")]),  # number words
        ("It seats 2000 people.", [(2000, "count")]),  # the plural noun that follows
        ("It costs $1500 and is 1200 km away.", [(1500, "count"), (1200, "count")]),  # currency, unit
        ("It opened in 2000.", [(2000, "year")]),  # the preposition
        ("In 2008, 1500 people came.", [(2008, "year"), (1500, "count")]),
        ("The 2019 season was long.", [(2019, "year")]),  # a singular noun: an attributive year
        ("It fell in May 1453 and in the 1990s.", [(1453, "year"), (1990, "year")]),
        ("It seats 5,000 people.", [(5000, "count")]),
        # The day of a date, before or after its month, is no count ("two boxers" against a birthday).
        ("Eubank Jr. was born on 18 September 1989, his father on Aug. 8, 1966.",
         [(18, "day"), (1989, "year"), (8, "day"), (1966, "year")]),
        ("In May, 18 people came; they may 3 times.", [(18, "count"), (3, "count")]),  # no date, no month
        # A scale word without a number before it is a magnitude, not the count 1000.
        ("It costs several thousand dollars, a few hundred more than a thousand others.", [(1000, "count")]),
    ],
)
def test_years_are_told_from_counts(text: str, expected: list[tuple[int, str]]) -> None:
    assert read_numbers(text, list(_WORDS.finditer(text))) == [StatedNumber(float(v), k) for v, k in expected]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "context",
    [
        "The concert hall opened in 1990. The concert hall seats about two thousand people.",
        "The concert hall opened in 1990. The concert hall seats about 2,000 people.",
    ],
)
@pytest.mark.parametrize("question", [None, "How many people does the concert hall seat?"])
def test_a_count_that_differs_from_the_contexts_is_contradicted(
    backend: EmbeddedBackend, context: str, question: str | None
) -> None:
    judgement = _judge(backend, context, "The concert hall seats about 5,000 people.", question)
    assert judgement.label == Label.CONTRADICTED
    assert judgement.score is not None and judgement.score.decided_by == "number_guard"


def test_a_year_is_still_no_conflict_with_a_count(backend: EmbeddedBackend) -> None:
    judgement = _judge(backend, "The concert hall opened in 1990. It seats about 2,000 people.",
                       "The concert hall opened in 1990.", None)
    assert judgement.label == Label.ENTAILED


def test_an_absent_number_beside_another_of_its_kind_is_never_entailed(backend: EmbeddedBackend) -> None:
    # The claim's words are spread over three sentences, so no one sentence holds half of them and the
    # guard cannot call it contradicted; the head alone entails it (p_unsupported 0.13 < 0.145),
    # although its count 5 is nowhere in view and the sentence it matched says 3.
    context = ("The team plays in Boston. The team won 3 titles. "
               "Its stadium is near the river and the old harbour.")
    claim = "The Boston team won 5 titles and its stadium is near the river and harbour."
    judgement = _judge(backend, context, claim, "Where does the team play?")
    assert judgement.label == Label.BASELESS
    assert judgement.score is not None and judgement.score.decided_by == "number_guard"
    assert judgement.score.p_unsupported < judgement.score.threshold  # what the head alone would say


def test_a_magnitude_is_no_number_to_conflict_with(backend: EmbeddedBackend) -> None:
    context = "Replacing the entire sewer line could easily cost you from $3,000 to around $12,000."
    judgement = _judge(backend, context, "Replacing the sewer line can cost several thousand dollars.", None)
    assert judgement.score is not None and judgement.score.decided_by != "number_guard"
