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

Citation precision and recall are ALCE's (Gao et al. 2023, "Enabling Large Language Models to
Generate Text with Citations", ``compute_autoais`` in its eval.py), with claims as the statements
and the judge as the NLI model. Recall: the share of claims that the concatenation of their cited
passages supports; a claim citing nothing, or citing a ref that names no passage, scores 0.
Precision: per answer, the citations that count over all citations (a claim with a ref naming no
passage adds none, as in eval.py; an answer with no citation scores 0). A claim's single citation
counts when its passages support it; of several citations of a supported claim, each counts that
alone supports the claim, or without which the rest no longer do (an over-cited passage does not).
Those judgements are the judge's: against one passage alone, or all cited passages but one
(:attr:`ClaimCitation.subset_checks`), except where the evidence already settles them: a subset
that holds all the evidence that supported the claim supports it. The run's figures average over
every answer to a list-of-passages context, an answer that cites nothing at 0.
"""

from __future__ import annotations

import asyncio
import re
import unicodedata
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rt4chart.method.text import split_sentences
from rt4chart.method.verification import ClaimVerifier, Judged, batches, max_calls
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
    SubsetCheck,
    Verdict,
)

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
    # Digits of any script (Arabic-Indic ones too), read digit by digit: a ref of 400 or 10,000 digits names no
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
    else:
        citation.verdict, citation.supporting = "misattributed", citation.evidence_passages


async def judge_against_passages(
    verifier: ClaimVerifier, requests: Sequence[tuple[ClaimVerdict, tuple[int, ...]]], batch_claims: int
) -> dict[tuple[int, tuple[int, ...]], Judged]:
    """Each (claim, passages) judged against a view of those passages only, by the verification
    step itself, in batches of claims asking about the same passages; keyed by (claim index,
    passages). The calls are charged to their claims."""
    sentences = verifier.index.sentences
    groups: dict[tuple[int, ...], list[ClaimVerdict]] = {}
    for verdict, passages in requests:
        groups.setdefault(passages, []).append(verdict)
    calls: list[tuple[tuple[int, ...], Coroutine[Any, Any, dict[int, Judged]]]] = []
    for passages, members in groups.items():
        view = [s for s in sentences if s.passage in passages]
        claims = [Claim(index=v.index, text=v.text, sentence_index=v.sentence_index, answer_span=v.answer_span)
                  for v in members]
        calls.extend((passages, verifier.judge(batch, view, "local")) for batch in batches(claims, batch_claims))
    outcomes = await asyncio.gather(*(call for _, call in calls))
    found = {
        (index, passages): judged
        for (passages, _), outcome in zip(calls, outcomes, strict=True) for index, judged in outcome.items()
    }
    for verdict, _ in requests:
        verdict.calls, verdict.cost_usd = verifier.charges.get(verdict.index, (0, 0.0))
    return found


async def check_cited_passages(
    verifier: ClaimVerifier, verdicts: list[ClaimVerdict], citations: dict[int, ClaimCitation], batch_claims: int
) -> int:
    """The extra verification: every claim that needs it (:func:`_needs_cited_check`) judged
    against its cited passages only; the outcome goes to its :attr:`ClaimCitation.cited_check`.
    Returns how many claims were checked."""
    requests = [
        (verdict, tuple(sorted(citations[verdict.index].cited)))
        for verdict in verdicts if _needs_cited_check(verdict, citations[verdict.index])
    ]
    found = await judge_against_passages(verifier, requests, batch_claims)
    for verdict, passages in requests:
        judged = found[verdict.index, passages]
        citations[verdict.index].cited_check = Verdict(**judged.verdict_fields())
        if judged.label is None:
            verdict.errors.append(f"citation check failed ({judged.error}); no citation verdict")
    return len(requests)


def _alce_supported(citation: ClaimCitation) -> bool:
    """ALCE's joint entailment: the claim cites, every ref names a passage, and they support it."""
    return citation.verdict == "supported" and not citation.unresolved


def _settled_by_evidence(citation: ClaimCitation, passages: Iterable[int]) -> bool:
    """A subset of the cited passages that holds all the evidence that supported the claim supports it."""
    return set(citation.supporting) <= set(passages)


async def check_citation_precision(
    verifier: ClaimVerifier, verdicts: list[ClaimVerdict], citations: dict[int, ClaimCitation], batch_claims: int
) -> int:
    """ALCE's precision test of every citation of a supported claim that cites several passages
    (:attr:`ClaimCitation.relevant`): first each passage alone, then, for each passage that does not
    support the claim alone, the other cited passages without it (ALCE's conditions A and B); the
    judge answers whatever the evidence does not settle. Returns the judge's checks."""
    several = [v for v in verdicts if _alce_supported(citations[v.index]) and len(citations[v.index].cited) > 1]
    known: dict[tuple[int, tuple[int, ...]], bool | None] = {}

    async def settle(wanted: list[tuple[ClaimVerdict, tuple[int, ...]]]) -> int:
        asked = []
        for verdict, passages in wanted:
            if (verdict.index, passages) in known:
                continue
            if _settled_by_evidence(citations[verdict.index], passages):
                known[verdict.index, passages] = True
            else:
                asked.append((verdict, passages))
        found = await judge_against_passages(verifier, asked, batch_claims)
        for verdict, passages in asked:
            check = found[verdict.index, passages]
            citations[verdict.index].subset_checks.append(SubsetCheck(passages=list(passages), label=check.label))
            known[verdict.index, passages] = None if check.label is None else check.label == Label.ENTAILED
            if check.label is None:
                verdict.errors.append(f"citation precision check failed ({check.error}); no ALCE figures")
        return len(asked)

    checks = await settle([(v, (p,)) for v in several for p in citations[v.index].cited])
    rest = [
        (v, tuple(sorted(set(citations[v.index].cited) - {p})))
        for v in several for p in citations[v.index].cited if known[v.index, (p,)] is False
    ]
    checks += await settle(rest)
    for verdict in several:
        citation = citations[verdict.index]
        without = {p: tuple(sorted(set(citation.cited) - {p})) for p in citation.cited}
        citation.relevant = [
            p for p in citation.cited if known[verdict.index, (p,)] or known.get((verdict.index, without[p])) is False
        ]
    for verdict in verdicts:
        citation = citations[verdict.index]
        if len(citation.cited) == 1 and _alce_supported(citation):
            citation.relevant = list(citation.cited)
    return checks


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
    checks += await check_citation_precision(verifier, tied, citations, batch_claims)
    return answer_citations(cited_answer, tied, checks)


def _scored(verdict: ClaimVerdict) -> bool:
    """Whether ALCE can score the claim: it has a verdict, and no check on its citations failed."""
    citation = verdict.citation
    return (
        verdict.label is not None and citation is not None
        and not (citation.cited_check is not None and citation.cited_check.label is None)
        and all(check.label is not None for check in citation.subset_checks)
    )


def answer_citations(cited_answer: CitedAnswer, verdicts: list[ClaimVerdict], checks: int) -> AnswerCitations:
    """The answer's counts per citation verdict and its ALCE citation precision and recall."""
    # A claim without a verdict, or with a failed check, is left out, as ALCE would not score it.
    citations = [v.citation for v in verdicts if _scored(v) and v.citation is not None]
    counts: dict[str, int] = {name: sum(c.verdict == name for c in citations) for name in CITATION_VERDICTS}
    # eval.py counts no citation of a statement with an out-of-range ref.
    n_citations = sum(len(c.cited) for c in citations if not c.unresolved)
    precision = sum(len(c.relevant) for c in citations) / n_citations if n_citations else 0.0
    return AnswerCitations(
        markers=cited_answer.markers,
        passage_ids=cited_answer.passage_ids,
        verdicts=counts,
        precision=precision if citations else None,
        recall=sum(_alce_supported(c) for c in citations) / len(citations) if citations else None,
        checks=checks,
    )


def describe_run(figures: RunCitations) -> str:
    """One line for a summary: ``3 answers with citations · ALCE precision 0.83 · recall 0.75 · ...``."""
    parts = [f"{figures.answers} answer{'s' * (figures.answers != 1)} with citations"]
    if figures.uncited_answers:
        parts[0] += f", {figures.uncited_answers} citing nothing (scored 0)"
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


def add_record(figures: RunCitations, record: AuditRecord) -> None:
    """Count a judged record in the run's citation figures: its citation audit, or, for an answer
    to a list-of-passages context that cites nothing, ALCE's 0."""
    if record.label is None:
        return
    if record.citations is not None:
        figures.add(record.citations)
    elif record.passages is not None and any(claim.sentence_index is not None for claim in record.claims):
        figures.add_uncited()


def max_check_calls(cited: CitedAnswer, claims_of: Callable[[Sentence], int], batch_claims: int) -> int:
    """The most calls the citation checks can make for an answer, whatever the judge answers: every
    claim of a citing sentence (``claims_of`` it) checked against its cited passages, then, where it
    cites several, against each alone, then against all but each (for three or more), each round in
    batches of claims asking about the same passages, each batch at its worst
    (:func:`rt4chart.method.verification.max_calls`)."""
    rounds: list[dict[tuple[int, ...], int]] = [{}, {}, {}]
    for sentence in cited.sentences:
        passages = sorted({p for m in cited.markers if m.sentence_index == sentence.index for p in m.passages})
        claims = claims_of(sentence)
        views: list[list[tuple[int, ...]]] = [
            [tuple(passages)] if passages else [],
            [(p,) for p in passages] if len(passages) > 1 else [],
            [tuple(q for q in passages if q != p) for p in passages] if len(passages) > 2 else [],
        ]
        for round_views, wanted in zip(rounds, views, strict=True):
            for view in wanted:
                round_views[view] = round_views.get(view, 0) + claims
    return sum(
        max_calls(min(batch_claims, n - start))
        for round_views in rounds for n in round_views.values() for start in range(0, n, batch_claims)
    )
