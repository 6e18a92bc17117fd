"""The retromorphic check: a judge's evidence counts only if it is really in the context.

Quotes are matched after whitespace normalisation (runs of whitespace compare equal to one
space), then mapped back to exact offsets of the original context and to the sentences they
overlap. A quote that is not found is not evidence.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property

from rt4chart.types import Evidence, Sentence

_WHITESPACE = re.compile(r"\s+")
SENTENCE_MARKER = re.compile(r"\[S\d+\]\s*")
"""The ``[S<id>]`` prefix that numbers context sentences in prompts (:func:`sentence_marker`);
judges sometimes copy it into their quotes, so it is dropped before a quote is looked up."""
_WRAPPING_QUOTES = "\"'“”‘’«» "  # noqa: RUF001 - typographic quotes are the point


def sentence_marker(index: int) -> str:
    """How a prompt numbers context sentence ``index``: ``[S<index>]``."""
    return f"[S{index}]"


@dataclass
class ContextIndex:
    """A context prepared for quote lookup, with a whitespace-normalised view built on demand."""

    text: str
    sentences: list[Sentence]

    def __post_init__(self) -> None:
        self._sentence_starts = [s.start for s in self.sentences]

    @cached_property
    def _normalised(self) -> tuple[str, list[int]]:
        """The text with each whitespace run as one space, and each character's original offset."""
        pieces: list[str] = []
        offsets: list[int] = []
        position = 0
        for match in _WHITESPACE.finditer(self.text):
            pieces.append(self.text[position : match.start()])
            offsets.extend(range(position, match.start()))
            pieces.append(" ")
            offsets.append(match.start())
            position = match.end()
        pieces.append(self.text[position:])
        offsets.extend(range(position, len(self.text)))
        return "".join(pieces), offsets

    def sentence_ids(self, start: int, end: int) -> list[int]:
        """Indices of the sentences that overlap ``[start, end)``."""
        first = max(bisect_right(self._sentence_starts, start) - 1, 0)
        return [
            s.index
            for s in self.sentences[first:]
            if s.start < end and s.end > start
        ]

    def anchor(self, quote: str, within: tuple[int, int] | None = None) -> Evidence | None:
        """Find ``quote`` in the context (or in the ``within`` character range of it)."""
        needle = _WHITESPACE.sub(" ", SENTENCE_MARKER.sub("", quote)).strip(_WRAPPING_QUOTES)
        if not needle:
            return None
        low, high = within or (0, len(self.text))
        # Most quotes are verbatim: find them in the text itself before normalising anything.
        exact = self.text.find(needle, low, high)
        if exact != -1:
            return self._evidence(exact, exact + len(needle))
        normalised, offsets = self._normalised
        search_from = 0
        while (found := normalised.find(needle, search_from)) != -1:
            start = offsets[found]
            end = offsets[found + len(needle) - 1] + 1
            if low <= start and end <= high:
                return self._evidence(start, end)
            search_from = found + 1
        return None

    def _evidence(self, start: int, end: int) -> Evidence:
        return Evidence(start=start, end=end, text=self.text[start:end], sentence_ids=self.sentence_ids(start, end))


def anchor_quotes(
    index: ContextIndex, quotes: list[str], within: tuple[int, int] | None = None
) -> tuple[list[Evidence], list[str]]:
    """Anchor every quote; return the evidence found and the quotes that were not found."""
    evidence: list[Evidence] = []
    missing: list[str] = []
    for quote in quotes:
        anchored = index.anchor(quote, within)
        if anchored is None:
            missing.append(quote)
        elif anchored not in evidence:
            evidence.append(anchored)
    return evidence, missing
