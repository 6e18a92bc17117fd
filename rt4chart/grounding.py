"""The retromorphic check: a judge's evidence counts only if it is really in the context.

Quotes are matched after whitespace normalisation (runs of whitespace compare equal to one
space), then mapped back to exact offsets of the original context and to the sentences they
overlap. A quote that is not found is not evidence.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field

from rt4chart.types import Evidence, Sentence

_WHITESPACE = re.compile(r"\s+")
_SENTENCE_MARKER = re.compile(r"\[S\d+\]\s*")
_WRAPPING_QUOTES = "\"'“”‘’«» "  # noqa: RUF001 - typographic quotes are the point


@dataclass
class ContextIndex:
    """A context prepared for quote lookup: its normalised text and the map back to offsets."""

    text: str
    sentences: list[Sentence]
    normalised: str = field(init=False)
    original_offsets: list[int] = field(init=False)

    def __post_init__(self) -> None:
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
        self.normalised = "".join(pieces)
        self.original_offsets = offsets
        self._sentence_starts = [s.start for s in self.sentences]

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
        needle = _WHITESPACE.sub(" ", _SENTENCE_MARKER.sub("", quote)).strip(_WRAPPING_QUOTES)
        if not needle:
            return None
        low, high = within or (0, len(self.text))
        search_from = 0
        while (found := self.normalised.find(needle, search_from)) != -1:
            start = self.original_offsets[found]
            end = self.original_offsets[found + len(needle) - 1] + 1
            if low <= start and end <= high:
                return Evidence(
                    start=start,
                    end=end,
                    text=self.text[start:end],
                    sentence_ids=self.sentence_ids(start, end),
                )
            search_from = found + 1
        return None


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
