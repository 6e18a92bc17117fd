"""Sentence segmentation with exact offsets, passages, and sliding-window chunking."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rt4chart.method.text import PASSAGE_SEPARATOR, chunk_sentences, join_passages, segment_context, split_sentences
from rt4chart.types import Sentence


def assert_exact_offsets(text: str, sentences: list[Sentence]) -> None:
    """Every sentence is its own slice of ``text``, trimmed, in order, numbered, never overlapping."""
    previous_end = 0
    for position, sentence in enumerate(sentences):
        assert sentence.index == position
        assert text[sentence.start : sentence.end] == sentence.text
        assert sentence.text, "empty sentence"
        assert sentence.text == sentence.text.strip(), f"surrounding whitespace in {sentence.text!r}"
        assert sentence.start >= previous_end, "sentences overlap or go backwards"
        previous_end = sentence.end


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "Dr. Smith went to Washington. He met the U.S. president.",
            ["Dr. Smith went to Washington.", "He met the U.S. president."],
            id="title-and-country-abbreviations",
        ),
        pytest.param(
            "Use fruits, e.g. apples and pears. They are healthy.",
            ["Use fruits, e.g. apples and pears.", "They are healthy."],
            id="e.g.",
        ),
        pytest.param(
            "Mr. and Mrs. Smith left at 5 p.m. today. Ms. Jones stayed.",
            ["Mr. and Mrs. Smith left at 5 p.m. today.", "Ms. Jones stayed."],
            id="several-abbreviations",
        ),
        pytest.param(
            "J. K. Rowling wrote the books. She is British.",
            ["J. K. Rowling wrote the books.", "She is British."],
            id="initials-at-line-start-are-not-a-list-marker",
        ),
        pytest.param(
            "Growth was 3.5% this year. A coffee costs $3.50 now. Version 2.0 shipped.",
            ["Growth was 3.5% this year.", "A coffee costs $3.50 now.", "Version 2.0 shipped."],
            id="decimal-numbers",
        ),
        pytest.param(
            "1.5 million people came. Prices: $3.50. Next item.",
            ["1.5 million people came.", "Prices: $3.50.", "Next item."],
            id="number-at-line-start-and-sentence-end",
        ),
        pytest.param(
            '"Why?" she asked. He did not answer.',
            ['"Why?" she asked.', "He did not answer."],
            id="straight-quoted-question",
        ),
        pytest.param(
            "\u201cWhy?\u201d she asked. \u201cBecause,\u201d he said.",
            ["\u201cWhy?\u201d she asked.", "\u201cBecause,\u201d he said."],
            id="curly-quoted-question",
        ),
        pytest.param(
            'He said "Stop." Then he left.',
            ['He said "Stop."', "Then he left."],
            id="quote-ends-sentence",
        ),
        pytest.param(
            "Steps:\n1. Open the box.\n2) Remove the device.\n10. Recycle it.",
            ["Steps:", "Open the box.", "Remove the device.", "Recycle it."],
            id="numbered-list",
        ),
        pytest.param(
            "- A dash item.\n* A star item.\n\u2022 A bullet item\n  - An indented item.",
            ["A dash item.", "A star item.", "A bullet item", "An indented item."],
            id="bulleted-list",
        ),
        pytest.param(
            "a. first option\nb) second option\nC. third option",
            ["first option", "second option", "third option"],
            id="lettered-list",
        ),
        pytest.param(
            "First line without stop\nSecond line.\n\n   Third line.   \n",
            ["First line without stop", "Second line.", "Third line."],
            id="newlines-are-boundaries",
        ),
        pytest.param("Windows line.\r\nNext line.", ["Windows line.", "Next line."], id="crlf"),
        pytest.param("Tab\tinside. Sentence two.", ["Tab\tinside.", "Sentence two."], id="inner-tab-kept"),
        pytest.param("", [], id="empty"),
        pytest.param("  \n\t \n", [], id="whitespace-only"),
        pytest.param("- \n1. ", [], id="bare-list-markers"),
    ],
)
def test_split_sentences_texts_and_offsets(text: str, expected: list[str]) -> None:
    sentences = split_sentences(text)
    assert [s.text for s in sentences] == expected
    assert_exact_offsets(text, sentences)
    assert all(s.passage == 0 for s in sentences)


# Pieces that stress Punkt: abbreviations, decimals, quotes, list markers, odd whitespace.
_PIECES = st.sampled_from(
    [
        "The trial", "lasts", "14 days.", "Dr.", "U.S.", "e.g.", "3.5%", "$3.50", '"Why?"', "she asked.",
        "\u201cNo.\u201d", "Wait...", "what?", "Yes!", "1.", "2)", "-", "*", "\u2022", "a.", "B.", "J.", "K.",
        "x", "\n", "\n\n", "\t", "\r\n", "\u00a0", "  ",
    ]
)
_TEXTS = st.lists(_PIECES, max_size=25).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(_TEXTS)
def test_split_sentences_offsets_hold_for_any_text(text: str) -> None:
    sentences = split_sentences(text)
    assert_exact_offsets(text, sentences)
    assert all("\n" not in s.text for s in sentences), "a sentence crosses a line break"


# Lines that cannot start with a list marker, so segmentation must keep every visible character.
_LINE_OPENERS = st.sampled_from(["The", "Then", "Prices", "\u201cWhy?\u201d", "Growth"])
_WORDS = st.sampled_from(
    ["Dr.", "Smith", "e.g.", "3.5%", "$3.50", "rose.", "she asked.", "U.S.", "ok", "No!"]
)
_MARKER_FREE_TEXT = st.lists(
    st.tuples(_LINE_OPENERS, st.lists(_WORDS, max_size=8)).map(lambda line: " ".join([line[0], *line[1]])),
    max_size=6,
).map("\n".join)


@settings(max_examples=200, deadline=None)
@given(_MARKER_FREE_TEXT)
def test_split_sentences_loses_and_repeats_no_text(text: str) -> None:
    sentences = split_sentences(text)
    assert re.sub(r"\s", "", "".join(s.text for s in sentences)) == re.sub(r"\s", "", text)


def test_passages_are_joined_with_the_documented_separator() -> None:
    passages = ["First passage. Two.", "Second passage.", "", "Fourth."]
    text, starts = join_passages(passages)
    assert text == PASSAGE_SEPARATOR.join(passages)
    assert [text[start : start + len(p)] for start, p in zip(starts, passages, strict=True)] == passages
    assert join_passages("One string.") == ("One string.", [0])


def test_multi_passage_context_sentences_point_into_the_joined_text() -> None:
    text, sentences = segment_context(["First passage. Two.", "Second passage.", "", "Fourth."])
    assert [(s.text, s.passage) for s in sentences] == [
        ("First passage.", 0),
        ("Two.", 0),
        ("Second passage.", 1),
        ("Fourth.", 3),
    ]
    assert_exact_offsets(text, sentences)


@pytest.mark.parametrize(
    "passages",
    [
        pytest.param(["A passage without a stop", "starts in lower case."], id="no-stop-then-lowercase"),
        pytest.param(["It ends with Dr.", "Smith arrived."], id="abbreviation-at-passage-end"),
        pytest.param(['She asked "Why?"', "she said."], id="quote-at-passage-end"),
    ],
)
def test_passage_boundary_is_a_sentence_boundary(passages: list[str]) -> None:
    text, sentences = segment_context(passages)
    assert [(s.text, s.passage) for s in sentences] == [(passages[0], 0), (passages[1], 1)]
    assert_exact_offsets(text, sentences)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TEXTS, max_size=5))
def test_every_sentence_lies_inside_the_passage_it_names(passages: list[str]) -> None:
    text, sentences = segment_context(passages)
    _, starts = join_passages(passages)
    assert_exact_offsets(text, sentences)
    for sentence in sentences:
        start = starts[sentence.passage]
        assert start <= sentence.start and sentence.end <= start + len(passages[sentence.passage])


def test_empty_contexts_have_no_sentences() -> None:
    assert segment_context("") == ("", [])
    assert segment_context([]) == ("", [])
    assert segment_context(["", "  "])[1] == []


def _ranges(n_sentences: int, window: int, overlap: int) -> list[tuple[int, int]]:
    chunks = chunk_sentences(n_sentences, window, overlap)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    return [(c.first, c.last) for c in chunks]


@pytest.mark.parametrize(
    ("n_sentences", "window", "overlap", "expected"),
    [
        pytest.param(0, 3, 1, [], id="no-sentences"),
        pytest.param(2, 5, 2, [(0, 1)], id="fewer-sentences-than-window"),
        pytest.param(5, 5, 2, [(0, 4)], id="exactly-one-window"),
        pytest.param(1, 1, 0, [(0, 0)], id="window-of-one"),
        pytest.param(4, 2, 1, [(0, 1), (1, 2), (2, 3)], id="running-example"),
        pytest.param(5, 3, 2, [(0, 2), (1, 3), (2, 4)], id="overlap-window-minus-one"),
        pytest.param(5, 2, 0, [(0, 1), (2, 3), (4, 4)], id="no-overlap-short-last-chunk"),
        pytest.param(9, 4, 2, [(0, 3), (2, 5), (4, 7), (6, 8)], id="short-last-chunk"),
        pytest.param(10, 4, 2, [(0, 3), (2, 5), (4, 7), (6, 9)], id="windows-fit-exactly"),
        pytest.param(60, 25, 10, [(0, 24), (15, 39), (30, 54), (45, 59)], id="defaults"),
    ],
)
def test_chunk_ranges(n_sentences: int, window: int, overlap: int, expected: list[tuple[int, int]]) -> None:
    assert _ranges(n_sentences, window, overlap) == expected


def test_chunk_defaults_are_w25_o10() -> None:
    assert [(c.first, c.last) for c in chunk_sentences(40)] == [(0, 24), (15, 39)]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 80), st.integers(1, 30), st.data())
def test_chunks_slide_by_window_minus_overlap_and_cover_everything(
    n_sentences: int, window: int, data: st.DataObject
) -> None:
    overlap = data.draw(st.integers(0, window - 1))
    ranges = _ranges(n_sentences, window, overlap)
    if n_sentences == 0:
        assert ranges == []
        return
    for position, (first, last) in enumerate(ranges):
        assert first == position * (window - overlap)
        assert last == min(first + window, n_sentences) - 1
    assert ranges[-1][1] == n_sentences - 1, "the last chunk must end at the last sentence"
    assert all(previous[1] < n_sentences - 1 for previous in ranges[:-1]), "a chunk after the end"
    covered = {i for first, last in ranges for i in range(first, last + 1)}
    assert covered == set(range(n_sentences))


def test_chunk_sentence_ids_cover_first_to_last() -> None:
    assert list(chunk_sentences(4, 2, 1)[1].sentence_ids) == [1, 2]


@pytest.mark.parametrize(
    ("window", "overlap"),
    [(2, 2), (2, 3), (1, 1), (25, 25), (3, -1), (0, 0)],
)
def test_chunking_rejects_overlap_not_below_window(window: int, overlap: int) -> None:
    with pytest.raises(ValueError, match=r"window|overlap"):
        chunk_sentences(10, window, overlap)
