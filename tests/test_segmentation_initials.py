"""Segmentation fixes of issue 39: a capital initial that opens a line is part of a name, not a list
marker, unless the text is a lettered list; German legal forms ("GmbH & Co. KG") end no sentence."""

from __future__ import annotations

import pytest

from rt4chart.method.text import split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("K. Smith won the race. He was fast.", ["K. Smith won the race.", "He was fast."]),
        ("A. Smith won the race.\nThen J. Jones came second.",
         ["A. Smith won the race.", "Then J. Jones came second."]),
        # A lettered list keeps its markers out of the sentences, whatever the case of the letters.
        ("A. Smith won the race.\nB. Jones came second.", ["Smith won the race.", "Jones came second."]),
        ("a) Smith won.\nB. Jones came second.", ["Smith won.", "Jones came second."]),
    ],
)
def test_a_leading_capital_initial_is_not_a_list_marker(text: str, expected: list[str]) -> None:
    sentences = split_sentences(text)
    assert [s.text for s in sentences] == expected
    assert all(text[s.start : s.end] == s.text for s in sentences)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Die Firma Müller GmbH & Co. KG hat 200 Mitarbeiter. Sie sitzt in Berlin.",
         ["Die Firma Müller GmbH & Co. KG hat 200 Mitarbeiter.", "Sie sitzt in Berlin."]),
        ("Der Lieferant ist die Bosch GmbH & Co. KG. Sie sitzt in Stuttgart.",
         ["Der Lieferant ist die Bosch GmbH & Co. KG.", "Sie sitzt in Stuttgart."]),
        ("Eigentümer ist die Merck KGaA & Co. KGaA in Darmstadt.",
         ["Eigentümer ist die Merck KGaA & Co. KGaA in Darmstadt."]),
        ("Sie gehört zur Müller & Co. Die Firma sitzt in Berlin.",
         ["Sie gehört zur Müller & Co.", "Die Firma sitzt in Berlin."]),
    ],
)
def test_german_legal_forms_after_co_end_no_sentence(text: str, expected: list[str]) -> None:
    assert [s.text for s in split_sentences(text, language="de")] == expected
