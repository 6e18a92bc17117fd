"""Answers that cite their sources: markers, the passages they name, and whether they hold.

An answer to a list-of-passages context may carry citation markers (``[1]``, ``[1, 3]``,
``[1][2]``, ``[^1]``, ``(Source 2)``, or ``--citation-pattern``). :func:`find_citations` takes
them out of the text the decomposer and the judge see, keeping each with its offsets in the answer;
answer sentences keep their offsets into the answer as given, so every claim's answer span still
points at the original text. A ref names a passage by the input's passage id
(``{"id": "doc-7", "text": ...}``) or by its 1-based position.

:func:`audit_citations` then compares, claim by claim, the passages its sentence cites with the
passages its evidence comes from (the audit already anchored that evidence in context sentences,
and every context sentence knows its passage). Where the evidence lies outside the cited passages
(or an entailed claim has none), one extra verification asks whether the cited passages alone
entail the claim: the verification step itself, against a view of those passages only, so only the
judge decides. A claim whose evidence already lies in the passages it cites needs no call: the judge
quoted its support from them, and grounding checked the quotes.

Citation precision and recall follow ALCE (Gao et al. 2023, "Enabling Large Language Models to
Generate Text with Citations"), with claims as the statements: recall is the share of claims that
their cited passages support (a claim without citation scores 0); precision the share of citations
that count, where a citation of a supported claim counts when it is its only one or when its passage
holds the supporting evidence (ALCE's "alone supports, or needed by the rest", read off where the
judge's evidence lies instead of one more call per citation). Per answer, then averaged over the
answers that cite, as ALCE averages over outputs.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rt4chart.text import split_sentences
from rt4chart.types import (
    AnswerCitations,
    AuditRecord,
    CitationMarker,
    CitationVerdict,
    Claim,
    ClaimCitation,
    ClaimVerdict,
    Label,
    RunCitations,
    Sample,
    Sentence,
    Verdict,
)
from rt4chart.verification import ClaimVerifier, batches, max_calls

CITATION_VERDICTS: tuple[CitationVerdict, ...] = ("supported", "misattributed", "unsupported", "uncited")
"""Every citation verdict, in the order views list them."""

BUILT_IN_MARKERS = re.compile(
    r"\[\^?(?P<bracket>[^\[\]\n]{1,100})\]"
    r"|\((?:sources?|passages?|documents?|docs?|refs?)\s+(?P<paren>[^()\n]{1,100})\)",
    re.IGNORECASE,
)
"""``[1]``, ``[1, 3]``, ``[^1]``, ``[doc-7]`` and ``(Source 2)`` / ``(Sources 1 and 3)``; ``[1][2]``
is two markers. A built-in marker counts only when every ref is a number or a passage id, so
``[sic]`` or ``[citation needed]`` stay in the text."""

_REF_SEPARATOR = re.compile(r"\s*(?:,|;|&|\band\b)\s*")
_SPACE_BEFORE = re.compile(r"[ \t]+$")


@dataclass(frozen=True)
class CitedAnswer:
    """An answer with its citation markers taken out."""

    answer: str
    """The answer without its markers (what a holistic decomposer reads)."""
    sentences: list[Sentence]
    """Its sentences: marker-free text, offsets into the answer as given."""
    markers: list[CitationMarker]
    """The markers, in answer order."""
    passage_ids: list[str] | None
    """The input's passage ids, when it named them."""


def _passage_of(ref: str, n_passages: int, ids: list[str] | None) -> int | None:
    """The 0-based passage a ref names: a passage id first, else a 1-based position."""
    if ids is not None and ref in ids:
        return ids.index(ref)
    if not ref.isdecimal():
        return None
    # Digits of any script ("١"), read digit by digit: a ref of 400 or 10,000 digits names no
    # passage (an ordinary unresolved ref) and never reaches int(), which refuses 4,300 digits.
    digits = "".join(str(unicodedata.decimal(character)) for character in ref).lstrip("0")
    if len(digits) > len(str(n_passages)) or not 1 <= int(digits or "0") <= n_passages:
        return None
    return int(digits) - 1


def _refs(match: re.Match[str], custom: bool) -> list[str]:
    groups = match.groupdict()
    if custom:
        body = groups["refs"] if "refs" in groups else match.group(1)
    else:
        body = groups["bracket"] if groups.get("bracket") is not None else groups["paren"]
    return [ref for ref in _REF_SEPARATOR.split((body or "").strip()) if ref]


def find_citations(sample: Sample, pattern: str | None = None, language: str = "en") -> CitedAnswer | None:
    """The answer's citation markers taken out; ``None`` when it has none, or when its context is
    one string (there are no passages to cite: the answer is audited exactly as before)."""
    if not isinstance(sample.context, list):
        return None
    custom = pattern is not None
    regex = re.compile(pattern) if pattern is not None else BUILT_IN_MARKERS
    n_passages, ids = len(sample.context), sample.passage_ids
    answer = sample.answer
    pieces: list[str] = []
    origin: list[int] = []  # origin[i]: the answer offset of character i of the marker-free text
    found: list[tuple[int, int, list[str], int]] = []  # start, end, refs, marker-free position
    position = 0
    for match in regex.finditer(answer):
        refs = _refs(match, custom)
        if not refs or not (custom or all(ref.isdecimal() or (ids is not None and ref in ids) for ref in refs)):
            continue
        kept = answer[position : match.start()]
        # "30 days [2]." reads "30 days." once the marker is out.
        kept = _SPACE_BEFORE.sub("", kept)
        pieces.append(kept)
        origin.extend(range(position, position + len(kept)))
        found.append((match.start(), match.end(), refs, len(origin)))
        position = match.end()
    if not found:
        return None
    pieces.append(answer[position:])
    origin.extend(range(position, len(answer)))
    text = "".join(pieces)
    clean_sentences = split_sentences(text, language=language)
    sentences = [
        s.model_copy(update={"start": origin[s.start], "end": origin[s.end - 1] + 1}) for s in clean_sentences
    ]
    markers = []
    for start, end, refs, at in found:
        # A marker cites the text before it: the last sentence that starts before it.
        owner = max((s.index for s in clean_sentences if s.start < at), default=0)
        passages = [p for ref in refs if (p := _passage_of(ref, n_passages, ids)) is not None]
        markers.append(
            CitationMarker(
                start=start, end=end, text=answer[start:end], refs=refs, passages=passages, sentence_index=owner
            )
        )
    return CitedAnswer(answer=text, sentences=sentences, markers=markers, passage_ids=ids)


def _unique(values: Iterable[int]) -> list[int]:
    return list(dict.fromkeys(values))


def _passages(verdict: Verdict, sentences: Sequence[Sentence]) -> list[int]:
    return sorted({sentences[i].passage for evidence in verdict.evidence for i in evidence.sentence_ids})


def _claim_citation(
    verdict: ClaimVerdict, cited_answer: CitedAnswer, sentences: Sequence[Sentence], n_passages: int
) -> ClaimCitation:
    """What the claim cites and where its evidence lies (the verdict comes later)."""
    refs = [ref for m in cited_answer.markers if m.sentence_index == verdict.sentence_index for ref in m.refs]
    resolved = [(ref, _passage_of(ref, n_passages, cited_answer.passage_ids)) for ref in refs]
    return ClaimCitation(
        cited=_unique(p for _, p in resolved if p is not None),
        unresolved=list(dict.fromkeys(ref for ref, p in resolved if p is None)),
        evidence_passages=_passages(verdict, sentences),
    )


def _needs_cited_check(verdict: ClaimVerdict, citation: ClaimCitation) -> bool:
    """An entailed claim that cites passages, but whose evidence is not all inside them (or that
    has no evidence at all): only a judgement against the cited passages alone can tell whether
    they suffice."""
    if verdict.label != Label.ENTAILED or not citation.cited:
        return False
    return not citation.evidence_passages or not set(citation.evidence_passages) <= set(citation.cited)


def _settle(verdict: ClaimVerdict, citation: ClaimCitation, sentences: Sequence[Sentence]) -> None:
    """Give the claim its citation verdict, supporting passages and the citations that count."""
    cites = bool(citation.cited or citation.unresolved)
    if verdict.label is None:
        return
    if verdict.label != Label.ENTAILED:
        citation.verdict = "unsupported" if cites else None
        return
    if not cites:
        citation.verdict, citation.supporting = "uncited", citation.evidence_passages
        return
    check = citation.cited_check
    if check is None:
        inside = [p for p in citation.evidence_passages if p in citation.cited]
    elif check.label == Label.ENTAILED:
        # The check saw the cited passages only, but a quote between two of them could anchor outside.
        inside = [p for p in _passages(check, sentences) if p in citation.cited]
    else:
        inside = []
    if inside:
        citation.verdict, citation.supporting = "supported", inside
        single = len(citation.cited) + len(citation.unresolved) == 1
        citation.relevant = list(citation.cited) if single else [p for p in citation.cited if p in inside]
    else:
        citation.verdict, citation.supporting = "misattributed", citation.evidence_passages


async def check_cited_passages(
    verifier: ClaimVerifier, verdicts: list[ClaimVerdict], citations: dict[int, ClaimCitation], batch_claims: int
) -> int:
    """The extra verification: every claim that needs it (:func:`_needs_cited_check`) judged
    against its cited passages only, in batches of claims citing the same passages; the outcome
    goes to its :attr:`ClaimCitation.cited_check`. Returns how many claims were checked."""
    sentences = verifier.index.sentences
    groups: dict[tuple[int, ...], list[ClaimVerdict]] = {}
    for verdict in verdicts:
        citation = citations[verdict.index]
        if _needs_cited_check(verdict, citation):
            groups.setdefault(tuple(sorted(citation.cited)), []).append(verdict)
    calls = []
    for cited, members in groups.items():
        view = [s for s in sentences if s.passage in cited]
        claims = [Claim(index=v.index, text=v.text, sentence_index=v.sentence_index, answer_span=v.answer_span)
                  for v in members]
        for batch in batches(claims, batch_claims):
            calls.append(verifier.judge(batch, view, "local"))
    by_claim = {index: judged for outcome in await asyncio.gather(*calls) for index, judged in outcome.items()}
    for verdict in verdicts:
        judged = by_claim.get(verdict.index)
        if judged is None:
            continue
        citations[verdict.index].cited_check = Verdict(**judged.verdict_fields())
        if judged.label is None:
            verdict.errors.append(f"citation check failed ({judged.error}); no citation verdict")
        verdict.calls, verdict.cost_usd = verifier.charges.get(verdict.index, (0, 0.0))
    return len(by_claim)


async def audit_citations(
    verifier: ClaimVerifier, cited_answer: CitedAnswer, verdicts: list[ClaimVerdict], batch_claims: int
) -> AnswerCitations:
    """Check every claim's citations (in place: :attr:`ClaimVerdict.citation`) and sum up the answer's."""
    sentences = verifier.index.sentences
    n_passages = max((s.passage for s in sentences), default=0) + 1
    tied = [v for v in verdicts if v.sentence_index is not None]  # a holistic claim belongs to no sentence
    citations = {v.index: _claim_citation(v, cited_answer, sentences, n_passages) for v in tied}
    checks = await check_cited_passages(verifier, tied, citations, batch_claims)
    for verdict in tied:
        citation = citations[verdict.index]
        if citation.cited_check is None or citation.cited_check.label is not None:
            _settle(verdict, citation, sentences)
        verdict.citation = citation
    return answer_citations(cited_answer, tied, checks)


def answer_citations(cited_answer: CitedAnswer, verdicts: list[ClaimVerdict], checks: int) -> AnswerCitations:
    """The answer's counts per citation verdict and its ALCE citation precision and recall."""
    # A claim without a verdict, or whose cited check failed, is left out, as ALCE would not score it.
    citations = [
        v.citation for v in verdicts
        if v.label is not None and v.citation is not None
        and not (v.citation.cited_check is not None and v.citation.cited_check.label is None)
    ]
    counts: dict[str, int] = {name: sum(c.verdict == name for c in citations) for name in CITATION_VERDICTS}
    n_citations = sum(len(c.cited) + len(c.unresolved) for c in citations)
    return AnswerCitations(
        markers=cited_answer.markers,
        passage_ids=cited_answer.passage_ids,
        verdicts=counts,
        precision=sum(len(c.relevant) for c in citations) / n_citations if n_citations else None,
        recall=counts["supported"] / len(citations) if citations else None,
        checks=checks,
    )


def describe_run(figures: RunCitations) -> str:
    """One line for a summary: ``3 answers with citations · ALCE precision 0.83 · recall 0.75 · ...``."""
    parts = [f"{figures.answers} answer{'s' * (figures.answers != 1)} with citations"]
    for name, value in (("precision", figures.precision), ("recall", figures.recall)):
        parts.append(f"ALCE {name} {value:.2f}" if value is not None else f"ALCE {name} n/a")
    parts.append(", ".join(f"{figures.verdicts.get(name, 0)} {name}" for name in CITATION_VERDICTS))
    parts.append(f"{figures.checks} cited-passage check{'s' * (figures.checks != 1)}")
    return " \u00b7 ".join(parts)


def passage_names(passages: Iterable[int], ids: list[str] | None) -> list[str]:
    """How the answer names passages: their ids when the input gave them, else 1-based numbers."""
    return [ids[p] if ids is not None and p < len(ids) else str(p + 1) for p in passages]


def describe_claim(citation: ClaimCitation, ids: list[str] | None) -> str:
    """``misattributed · cites refunds · supported by returns`` (what a view shows under a claim)."""
    cited = [*passage_names(citation.cited, ids), *(f"{ref} (no such passage)" for ref in citation.unresolved)]
    parts = [citation.verdict or "no citation verdict", f"cites {', '.join(cited) or 'nothing'}"]
    if citation.supporting:
        parts.append(f"supported by {', '.join(passage_names(citation.supporting, ids))}")
    if citation.cited_check is not None:
        parts.append(f"cited passages alone: {citation.cited_check.label or 'check failed'}")
    return " \u00b7 ".join(parts)


def describe_answer(audit: AnswerCitations) -> str:
    """``ALCE precision 0.50 · recall 1.00 · 1 supported, 1 misattributed, ...`` for one answer."""
    figures = [
        f"ALCE {name} {value:.2f}" if value is not None else f"ALCE {name} n/a"
        for name, value in (("precision", audit.precision), ("recall", audit.recall))
    ]
    counts = ", ".join(f"{audit.verdicts.get(name, 0)} {name}" for name in CITATION_VERDICTS)
    return " \u00b7 ".join([*figures, counts])


def run_citations(records: Iterable[AuditRecord]) -> RunCitations | None:
    """The run's citation figures; ``None`` when no answer carried a citation marker."""
    figures = RunCitations()
    for record in records:
        if record.citations is not None:
            figures.add(record.citations)
    return figures if figures.answers else None


def cited_answer_sentences(sample: Sample, pattern: str | None, language: str = "en") -> list[Sentence]:
    """The answer sentences an audit decomposes: marker-free when the answer cites."""
    cited = find_citations(sample, pattern, language)
    return cited.sentences if cited is not None else split_sentences(sample.answer, language=language)


def max_check_calls(cited: CitedAnswer, claims_of: Callable[[Sentence], int], batch_claims: int) -> int:
    """The most calls the cited-passages check can make for an answer, whatever the judge answers:
    every claim of a citing sentence (``claims_of`` it) checked, in batches of claims citing the
    same passages, each batch at its worst (:func:`rt4chart.verification.max_calls`)."""
    groups: dict[tuple[int, ...], int] = {}
    for sentence in cited.sentences:
        passages = tuple(sorted({p for m in cited.markers if m.sentence_index == sentence.index for p in m.passages}))
        if passages:
            groups[passages] = groups.get(passages, 0) + claims_of(sentence)
    return sum(
        max_calls(min(batch_claims, n - start)) for n in groups.values() for start in range(0, n, batch_claims)
    )
