"""The retromorphic check: a judge's evidence counts only if it is really in the context.

A quote is looked up verbatim first, then in ever more tolerant views of the context: whitespace
runs compared equal to one space (``whitespace``), then typographic punctuation folded to its ASCII
form as well (curly quotes, dashes, the ellipsis character, odd spaces, full-width forms:
``folded``), then, as a last resort, letter case (``case``). The first view that finds it wins and
its name is recorded on the evidence as ``match``. Every view keeps each character's original
offset, so the evidence is always the context's own text, ``context[start:end]``, and a quote that
is not in the context under any view (a paraphrase) is not evidence. Folding is a property of
characters, never of words: a view never matches a quote to text whose folded form differs.

A context of passages or documents also gives each evidence its ``source`` (:class:`PassageMap`):
the document it comes from, its offsets there, and the fields or cells of a structured document it
quotes.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from rt4chart.documents import Unit, render_document
from rt4chart.method.text import content_words, join_passages
from rt4chart.types import Evidence, EvidenceMatch, EvidenceSource, Sample, Sentence

_WHITESPACE = re.compile(r"\s+")
SENTENCE_MARKER = re.compile(r"\[S\d+\]\s*")
"""The ``[S<id>]`` prefix that numbers context sentences in prompts (:func:`sentence_marker`);
judges sometimes copy it into their quotes, so it is dropped before a quote is looked up."""
_WRAPPING_QUOTES = "\"'“”‘’«» "  # noqa: RUF001 - typographic quotes are the point

_TYPOGRAPHY = str.maketrans(
    {
        **dict.fromkeys("‘’‚‛′`´", "'"),  # noqa: RUF001 - typographic quotes are the point
        **dict.fromkeys("“”„‟″«»", '"'),
        **dict.fromkeys("‐‑‒–—―−", "-"),  # noqa: RUF001 - hyphens, dashes, the minus sign
        "…": "...",
        # Invisible characters a model never reproduces: folded away.
        **dict.fromkeys("\u200b\u200c\u200d\u2060\ufeff\u00ad", ""),
        # Full-width ASCII forms (U+FF01..U+FF5E) and the ideographic space.
        **{chr(code): chr(code - 0xFEE0) for code in range(0xFF01, 0xFF5F)},
        "\u3000": " ",
        # CJK punctuation a model may write the ASCII way: 。、 as ". ,", corner brackets as quotes.
        "。": ".", "、": ",", "｡": ".", "､": ",",
        **dict.fromkeys("「」『』〝〞", '"'),
    }
)


def _fold_typography(char: str) -> str:
    return char.translate(_TYPOGRAPHY)


def _fold_case(char: str) -> str:
    return char.translate(_TYPOGRAPHY).lower()


def sentence_marker(index: int) -> str:
    """How a prompt numbers context sentence ``index``: ``[S<index>]``."""
    return f"[S{index}]"


@dataclass(frozen=True)
class FoldedView:
    """A text with whitespace runs as one space and every character folded by ``fold``; for each
    folded character, the original character it came from and whether it is the first (last)
    folded character of that original character (or whitespace run)."""

    text: str
    origin: list[int]
    opens: list[bool]
    closes: list[bool]

    @classmethod
    def of(cls, text: str, fold: Callable[[str], str]) -> FoldedView:
        pieces: list[str] = []
        origin: list[int] = []
        opens: list[bool] = []
        closes: list[bool] = []
        position = 0
        for run in [*_WHITESPACE.finditer(text), None]:
            stop = run.start() if run else len(text)
            for offset in range(position, stop):
                folded = fold(text[offset])
                pieces.append(folded)
                origin.extend([offset] * len(folded))
                opens.extend(i == 0 for i in range(len(folded)))
                closes.extend(i == len(folded) - 1 for i in range(len(folded)))
            if run:
                pieces.append(" ")
                origin.append(run.start())
                opens.append(True)
                closes.append(True)
                position = run.end()
        return cls("".join(pieces), origin, opens, closes)

    def find(self, needle: str, low: int, high: int) -> tuple[int, int] | None:
        """The original ``[start, end)`` of the first occurrence of ``needle`` inside ``[low,
        high)`` that starts and ends on whole original characters (``…`` is matched whole or not at
        all), with ``needle`` folded and stripped like the view; ``None`` when there is none."""
        search_from = 0
        while (found := self.text.find(needle, search_from)) != -1:
            last = found + len(needle) - 1
            start, end = self.origin[found], self.origin[last] + 1
            if self.opens[found] and self.closes[last] and low <= start and end <= high:
                return start, end
            search_from = found + 1
        return None


_FOLDS: tuple[tuple[EvidenceMatch, Callable[[str], str]], ...] = (
    ("whitespace", str),
    ("folded", _fold_typography),
    ("case", _fold_case),
)
"""The tolerant views, from the strictest: the first that finds a quote names its match."""


@dataclass(frozen=True)
class PassageMap:
    """Where each passage (document) of a joined context starts, its name, and its units."""

    starts: list[int]
    """Offset of each passage in the joined context."""
    lengths: list[int]
    """Characters of each passage."""
    names: list[str]
    """Each passage's id (its 1-based position when the input named none)."""
    units: list[list[Unit]]
    """Each passage's structured units (none for prose)."""

    def source(self, start: int, end: int) -> EvidenceSource:
        """The source of the joined context's ``[start, end)``: the passage it starts in."""
        passage = max(bisect_right(self.starts, start) - 1, 0)
        if start - self.starts[passage] >= self.lengths[passage] and passage + 1 < len(self.starts):
            passage += 1  # a quote that begins in the separator begins in the next passage
        offset = self.starts[passage]
        start = max(start, offset)
        local_start, local_end = start - offset, min(end - offset, self.lengths[passage])
        units = [unit.anchor for unit in self.units[passage] if unit.start < local_end and unit.end > local_start]
        return EvidenceSource(document=self.names[passage], start=local_start, end=local_end, units=units)


def passage_map(sample: Sample) -> PassageMap | None:
    """The passages of a sample's context, for evidence sources; ``None`` for a single-string context."""
    if isinstance(sample.context, str):
        return None
    starts = join_passages(sample.context)[1]
    names = sample.passage_ids or [str(position + 1) for position in range(len(sample.context))]
    documents = sample.documents or []
    units = [render_document(document).units for document in documents] or [[] for _ in sample.context]
    return PassageMap(starts, [len(passage) for passage in sample.context], names, units)


@dataclass
class ContextIndex:
    """A context prepared for quote lookup, with its tolerant views built on demand."""

    text: str
    sentences: list[Sentence]
    passages: PassageMap | None = None
    """The context's passages, to give evidence its source; ``None`` for a single-string context."""
    _views: dict[EvidenceMatch, FoldedView] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._sentence_starts = [s.start for s in self.sentences]

    def _view(self, kind: EvidenceMatch, fold: Callable[[str], str]) -> FoldedView:
        if kind not in self._views:
            self._views[kind] = FoldedView.of(self.text, fold)
        return self._views[kind]

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
        needle = SENTENCE_MARKER.sub("", quote).strip().strip(_WRAPPING_QUOTES)
        low, high = within or (0, len(self.text))
        # Most quotes are verbatim: find them in the text itself before folding anything.
        if needle and (exact := self.text.find(needle, low, high)) != -1:
            return self._evidence(exact, exact + len(needle), "exact")
        for kind, fold in _FOLDS:
            folded = FoldedView.of(needle, fold).text.strip()
            if not folded:
                return None
            found = self._view(kind, fold).find(folded, low, high)
            if found is not None:
                return self._evidence(*found, kind)
        return None

    def _evidence(self, start: int, end: int, match: EvidenceMatch) -> Evidence:
        return Evidence(
            start=start, end=end, text=self.text[start:end], sentence_ids=self.sentence_ids(start, end), match=match,
            source=self.passages.source(start, end) if self.passages is not None else None,
        )


MIN_EVIDENCE_CONTENT_WORDS = 2
"""Content words a quote shorter than a whole context sentence must hold to count as evidence:
"quote any letter" (``["S"]``) would otherwise pass the retromorphic check."""


def substantial(index: ContextIndex, evidence: Evidence) -> bool:
    """Whether evidence says something: it covers a whole context sentence, or it holds at least
    :data:`MIN_EVIDENCE_CONTENT_WORDS` content words."""
    if any(evidence.start <= s.start and s.end <= evidence.end for s in index.sentences):
        return True
    return len(content_words(evidence.text)) >= MIN_EVIDENCE_CONTENT_WORDS


@dataclass
class Anchoring:
    """What became of a judge's quotes."""

    evidence: list[Evidence] = field(default_factory=list)
    """The quotes found in the context, as evidence (each span once)."""
    missing: list[str] = field(default_factory=list)
    """Quotes not found in the context."""
    slight: list[str] = field(default_factory=list)
    """Quotes found but too slight to count (see :func:`substantial`)."""

    @property
    def problem(self) -> str | None:
        """Why the quotes do not ground a verdict; ``None`` when they do."""
        problems = [f"evidence not found in the context: {self.missing!r}"] * bool(self.missing)
        if self.slight:
            problems.append(
                f"evidence too slight to count (neither a whole context sentence nor "
                f"{MIN_EVIDENCE_CONTENT_WORDS} content words): {self.slight!r}"
            )
        if not problems and not self.evidence:
            problems.append("no evidence quoted")
        return "; ".join(problems) or None


def anchor_quotes(index: ContextIndex, quotes: list[str], within: tuple[int, int] | None = None) -> Anchoring:
    """Anchor every quote: the evidence found, the quotes not found and those too slight to count."""
    anchoring = Anchoring()
    for quote in quotes:
        anchored = index.anchor(quote, within)
        if anchored is None:
            anchoring.missing.append(quote)
        elif not substantial(index, anchored):
            anchoring.slight.append(quote)
        elif all((e.start, e.end) != (anchored.start, anchored.end) for e in anchoring.evidence):
            anchoring.evidence.append(anchored)
    return anchoring
