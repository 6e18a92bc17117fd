"""Claim-level repair of flagged answers: edits with answer offsets, planned from a verify record.

Three nested strategies act on the claims an audit did not find entailed (contradicted, baseless,
or unjudged):

- ``remove`` deletes them. A sentence whose claims are all unsupported is deleted with the
  whitespace (or the line, list marker included) that held it. In a sentence that also holds
  supported claims, only the unsupported part goes: when the sentence's claims are its clauses
  (the rule-based decomposer splits at semicolons, verbatim), the unsupported clauses are cut out
  with their separators and the sentence keeps its final punctuation; otherwise a repairing judge,
  when one is given, rewrites the sentence from its supported claims, and without one the whole
  sentence is deleted (the supported claims in it are lost: that is the price of inventing nothing).
- ``extract`` does the same and puts in the context sentences that the evidence of its
  contradicted claims points to (each context sentence at most once per answer): in place of a
  sentence it deletes, after the sentence it shortens. Baseless claims have no evidence and are
  only removed.
- ``rewrite`` asks the judge to rewrite every flagged sentence so that the context supports its
  unsupported claims, keeping the supported ones (``prompts/repair.txt``); the edit covers only
  the characters the rewrite changed.

Without a judge, ``remove`` and ``extract`` invent nothing: every character of a repaired answer is
a character of the original answer or of a whole context sentence (plus the single spaces that
separate inserted sentences). Text a judge wrote is always marked ``generated``.

Everything here is pure except :meth:`Repairer.repair`, which calls the repairing judge through
the backend contract. The re-audit of repaired answers (``--verify-after``) is a run of the run
layer (:func:`rt4chart.runs.repair.arepair`) over :func:`repaired_samples`, recorded by :func:`record_reaudit`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Literal

from pydantic import BaseModel, Field

from rt4chart.languages import ENGLISH
from rt4chart.method.decompose import rule_claims, rule_decomposition
from rt4chart.method.session import JudgeSession
from rt4chart.method.tasks import RepairInput, RepairItem, RepairOutput, load_prompts
from rt4chart.method.text import segment_context, split_sentences
from rt4chart.protocol import Backend, GenerationParams
from rt4chart.types import AuditRecord, ClaimVerdict, Evidence, Gold, Label, Sample, Sentence, Span, Usage

RepairStrategy = Literal["remove", "extract", "rewrite"]
STRATEGIES: tuple[RepairStrategy, ...] = ("remove", "extract", "rewrite")

CLAIM_COVERAGE = 0.8
"""A supported claim is retained when some claim of the repaired answer covers at least this share
of its characters, in order (difflib matching blocks): a verbatim clause covers all of it, a claim
the decomposer reworded ("it" for "the trial") still covers most of it, a removed one next to none."""

_BARE_MARKER = re.compile(r"\s*(?:\d{1,3}[.)]|[-*\u2022]|[a-zA-Z][.)])?\s*")
"""What may be left of a line once its sentences are gone: whitespace and a list marker."""

_TERMINAL = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*$")
"""The punctuation that closes a sentence (with any closing quote or bracket)."""


class Edit(BaseModel):
    """One change to the original answer: ``original[start:end]`` becomes ``inserted``."""

    start: int = Field(ge=0)
    """Offset in the original answer of the first character replaced (or the insertion point)."""
    end: int = Field(ge=0)
    """Offset one past the last character replaced (``start`` for a pure insertion)."""
    removed: str
    """Exactly ``original[start:end]``."""
    inserted: str = ""
    """What takes its place ("" for a deletion)."""
    reason: str
    """Why: which action on which kind of claim."""
    claims: list[int] = Field(default_factory=list)
    """Indices (in the verify record) of the claims the edit acts on."""
    evidence: list[Evidence] = Field(default_factory=list)
    """For an extraction, the context sentences inserted; otherwise the evidence of the claims."""
    generated: bool = False
    """True when a judge wrote ``inserted`` (never in ``remove`` or ``extract`` without a judge)."""


class VerifiedAfter(BaseModel):
    """The re-audit of a repaired answer."""

    judge: str | None
    """Judge of the re-audit."""
    label: Label | None
    """Answer verdict of the repaired answer; ``None`` when it could not be audited."""
    hallucinated: bool | None
    """Whether the repaired answer is still flagged."""
    claims: int
    """Claims of the repaired answer."""
    unsupported_claims: int
    """Those not entailed."""
    errors: list[str] = Field(default_factory=list)
    """Problems of the re-audit."""


class RepairRecord(BaseModel):
    """The output record of one verify record: the original answer, its repair and the edits."""

    id: str | None
    """Sample id."""
    line: int
    """The verify record's line in its file (1-based)."""
    strategy: RepairStrategy
    """remove, extract or rewrite."""
    original: str | None
    """The answer as audited; ``None`` when the sample could not be found."""
    repaired: str | None
    """The repaired answer (``original`` with ``edits`` applied); ``None`` on error."""
    edits: list[Edit] = Field(default_factory=list)
    """Changes in answer order, non-overlapping, offsets into ``original``."""
    empty: bool = False
    """True when nothing is left of the answer (every claim unsupported and nothing to extract)."""
    claims: int = 0
    """Claims of the verify record."""
    unsupported_claims: int = 0
    """Claims not entailed (contradicted, baseless, or unjudged)."""
    text_retention: float | None = None
    """Share of the original's characters still present, in order (difflib matching blocks)."""
    claim_retention: float | None = None
    """Share of the original's supported claims still stated by the repaired answer; ``None`` when
    it had none."""
    judge: str | None = None
    """Judge that wrote rewrites, when one was asked."""
    prompt_version: str | None = None
    """Hash of ``prompts/repair.txt`` when a judge was asked."""
    usage: Usage = Field(default_factory=Usage)
    """Usage of the repairing judge."""
    gold: Gold | None = None
    """Gold labels of the sample, when it has them."""
    verified_after: VerifiedAfter | None = None
    """The re-audit of the repaired answer (``--verify-after``)."""
    errors: list[str] = Field(default_factory=list)
    """Problems: an unusable record, a sentence left unrepaired, a failed rewrite."""
    input_hash: str | None = None
    """sha256 binding the record to its verify record, its sample's input line and the repair's
    configuration (strategy, repairing judge, prompts, parameters): what ``rt4 repair --resume`` checks."""


class RepairError(ValueError):
    """A verify record that cannot be repaired against its sample (they do not match)."""


def apply_edits(original: str, edits: Iterable[Edit]) -> str:
    """The text ``edits`` make of ``original``; raises ``ValueError`` on invalid edits.

    Edits must be in answer order, must not overlap, and must say exactly what they remove.
    """
    pieces: list[str] = []
    position = 0
    for edit in edits:
        if edit.start < position or edit.end < edit.start or edit.end > len(original):
            raise ValueError(f"edit [{edit.start}, {edit.end}) is out of order, overlapping or out of range")
        if original[edit.start : edit.end] != edit.removed:
            raise ValueError(f"edit [{edit.start}, {edit.end}) does not remove what it says")
        pieces.append(original[position : edit.start])
        pieces.append(edit.inserted)
        position = edit.end
    pieces.append(original[position:])
    return "".join(pieces)


def text_retention(original: str, repaired: str) -> float:
    """Share of ``original``'s characters still present in ``repaired``, in order."""
    return coverage(original, repaired)


def coverage(claim: str, text: str) -> float:
    """Share of ``claim``'s characters that appear in ``text`` in order."""
    if not claim:
        return 1.0
    matcher = SequenceMatcher(None, claim, text, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks()) / len(claim)


def claim_retention(supported: list[str], repaired: str) -> float | None:
    """Share of ``supported`` claims that some claim of the ``repaired`` answer (by the rule-based
    decomposer, one per clause) covers (:data:`CLAIM_COVERAGE`); ``None`` when there is none to keep."""
    if not supported:
        return None
    repaired_claims = [claim.text for claim in rule_decomposition(split_sentences(repaired)).claims]
    kept = sum(any(coverage(claim, c) >= CLAIM_COVERAGE for c in repaired_claims) for claim in supported)
    return kept / len(supported)


def is_supported(claim: ClaimVerdict) -> bool:
    """Entailed; a claim that could not be judged counts as unsupported, as in the AND-join."""
    return claim.label == Label.ENTAILED


@dataclass
class _Flagged:
    """An answer sentence with at least one unsupported claim, and what to do with it."""

    span: Span
    claims: list[ClaimVerdict]
    action: Literal["drop", "clauses", "judge"] = "drop"
    extract: list[Sentence] = field(default_factory=list)
    """Context sentences to put in (extract)."""

    @property
    def supported(self) -> list[ClaimVerdict]:
        return [c for c in self.claims if is_supported(c)]

    @property
    def unsupported(self) -> list[ClaimVerdict]:
        return [c for c in self.claims if not is_supported(c)]


def _indices(claims: Iterable[ClaimVerdict]) -> list[int]:
    return [c.index for c in claims]


def _claim_evidence(claims: Iterable[ClaimVerdict]) -> list[Evidence]:
    seen: set[tuple[int, int]] = set()
    evidence = []
    for claim in claims:
        for item in claim.evidence:
            if (item.start, item.end) not in seen:
                seen.add((item.start, item.end))
                evidence.append(item)
    return evidence


def _describe(claims: list[ClaimVerdict]) -> str:
    labels = sorted({(c.label.value if c.label else "unjudged") for c in claims})
    return "/".join(labels)


def _drop_range(answer: str, span: Span, sentences: list[Sentence]) -> tuple[int, int]:
    """The characters to delete with a whole sentence, so that no gap or list marker is left.

    A sentence alone on its line takes the line (marker and line break) with it; otherwise it
    takes the spaces after it, or before it when it ends its line.
    """
    line_start = answer.rfind("\n", 0, span.start) + 1
    line_end = answer.find("\n", span.end)
    line_end = len(answer) if line_end < 0 else line_end
    alone = not any(
        s.start < line_end and s.end > line_start and (s.start, s.end) != (span.start, span.end)
        for s in sentences
    )
    if alone:
        if line_end < len(answer):
            return line_start, line_end + 1
        return max(line_start - 1, 0), line_end
    end = span.end
    while end < line_end and answer[end] in " \t":
        end += 1
    if end < line_end:
        return span.start, end
    start = span.start
    while start > line_start and answer[start - 1] in " \t":
        start -= 1
    return start, end


def _clause_spans(answer: str, span: Span, claims: list[ClaimVerdict]) -> list[Span] | None:
    """Where each claim sits in its sentence, when the claims are the sentence's rule clauses."""
    sentence_text = answer[span.start : span.end]
    clauses = rule_claims(Sentence(index=0, start=span.start, end=span.end, text=sentence_text))
    if [c.text for c in claims] != clauses or len(clauses) < 2:
        return None
    spans, cursor = [], 0
    for clause in clauses:
        found = sentence_text.find(clause, cursor)
        spans.append(Span(start=span.start + found, end=span.start + found + len(clause)))
        cursor = found + len(clause)
    return spans


def _clause_edits(answer: str, flagged: _Flagged, clauses: list[Span]) -> list[Edit]:
    """Cut the unsupported clauses out of a sentence, keeping the separators between the kept
    clauses and the sentence's closing punctuation."""
    kept = [i for i, claim in enumerate(flagged.claims) if is_supported(claim)]
    keep: list[tuple[int, int]] = []
    for position, i in enumerate(kept):
        keep.append((clauses[i].start, clauses[i].end))
        if position + 1 < len(kept):
            keep.append((clauses[i].end, clauses[i + 1].start))  # the separator after a kept clause
    last = len(clauses) - 1
    if kept[-1] != last and not _TERMINAL.search(answer[clauses[kept[-1]].start : clauses[kept[-1]].end]):
        closing = _TERMINAL.search(answer[clauses[last].start : clauses[last].end])
        if closing:
            keep.append((clauses[last].start + closing.start(), clauses[last].end))
    edits, cursor = [], flagged.span.start
    for start, end in [*sorted(keep), (flagged.span.end, flagged.span.end)]:
        if start > cursor:
            cut = [
                c for c, clause in zip(flagged.claims, clauses, strict=True)
                if not is_supported(c) and clause.start < start and clause.end > cursor
            ]
            edits.append(
                Edit(
                    start=cursor, end=start, removed=answer[cursor:start],
                    reason=f"unsupported clause removed ({_describe(cut)})",
                    claims=_indices(cut), evidence=_claim_evidence(cut),
                )
            )
        cursor = max(cursor, end)
    return edits


def _evidence_sentences(claims: Iterable[ClaimVerdict], context: list[Sentence]) -> list[Sentence]:
    """Context sentences the evidence of contradicted claims points to, in context order."""
    ids = {
        sentence_id
        for claim in claims if claim.label == Label.CONTRADICTED
        for item in claim.evidence for sentence_id in item.sentence_ids
    }
    if any(i >= len(context) for i in ids):
        raise RepairError("evidence points to context sentences the sample does not have")
    return [context[i] for i in sorted(ids)]


def _inserted_evidence(sentences: list[Sentence]) -> list[Evidence]:
    return [Evidence(start=s.start, end=s.end, text=s.text, sentence_ids=[s.index]) for s in sentences]


def _rewrite_edit(answer: str, flagged: _Flagged, text: str, judge: str) -> Edit | None:
    """The edit a judge's (non-empty) rewrite of a sentence makes, narrowed to the characters it
    changed; ``None`` when it changed nothing."""
    old = answer[flagged.span.start : flagged.span.end]
    if text == old:
        return None
    prefix = 0
    while prefix < min(len(old), len(text)) and old[prefix] == text[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(old), len(text)) - prefix and old[-1 - suffix] == text[-1 - suffix]:
        suffix += 1
    start, end = flagged.span.start + prefix, flagged.span.end - suffix
    return Edit(
        start=start, end=end, removed=answer[start:end], inserted=text[prefix : len(text) - suffix],
        reason=f"sentence rewritten by {judge} ({_describe(flagged.unsupported)} claims)",
        claims=_indices(flagged.unsupported), evidence=_claim_evidence(flagged.unsupported), generated=True,
    )


def _merge(edits: list[Edit]) -> list[Edit]:
    """Sort edits into answer order and merge those that overlap (deletions that took the same
    whitespace) and deletions that touch (one gap, so a line emptied sentence by sentence is seen
    whole)."""
    merged: list[Edit] = []
    for edit in sorted(edits, key=lambda e: (e.start, e.end)):
        last = merged[-1] if merged else None
        touching_deletions = (
            last is not None and edit.start == last.end and not (edit.inserted or last.inserted)
        )
        if last is not None and (edit.start < last.end or touching_deletions):
            end = max(last.end, edit.end)
            removed = last.removed + edit.removed[last.end - edit.start :] if edit.end > last.end else last.removed
            reasons = last.reason if edit.reason in last.reason else f"{last.reason}; {edit.reason}"
            merged[-1] = Edit(
                start=last.start, end=end, removed=removed, inserted=last.inserted + edit.inserted,
                reason=reasons, claims=sorted(set(last.claims) | set(edit.claims)),
                evidence=last.evidence + [e for e in edit.evidence if e not in last.evidence],
                generated=last.generated or edit.generated,
            )
        else:
            merged.append(edit)
    return merged




def _tidy(answer: str, edits: list[Edit], sentences: list[Sentence]) -> list[Edit]:
    """Widen deletions that end a line so that no space, or bare list marker, is left before the
    line break: sentences deleted one by one each took only their own whitespace."""
    tidied: list[Edit] = []
    for edit in edits:
        if edit.inserted or not (edit.end == len(answer) or answer[edit.end] == "\n"):
            tidied.append(edit)
            continue
        line_start = answer.rfind("\n", 0, edit.start) + 1
        floor = max(line_start, tidied[-1].end if tidied else 0)
        start = edit.start
        bare = _BARE_MARKER.fullmatch(answer[line_start : edit.start]) and not any(
            s.start < edit.start and s.end > line_start for s in sentences  # "A." may be a sentence
        )
        if floor == line_start and bare:
            start = line_start  # nothing but a list marker is left of the line: it goes too
            end = edit.end + 1 if edit.end < len(answer) else edit.end
            if end == edit.end and start > 0:
                start -= 1  # the last line: take the line break before it instead
            edit = edit.model_copy(update={"start": start, "end": end, "removed": answer[start:end]})
        else:
            while start > floor and answer[start - 1] in " \t":
                start -= 1
            edit = edit.model_copy(update={"start": start, "removed": answer[start : edit.end]})
        tidied.append(edit)
    return _merge(tidied)


@dataclass
class Repairer:
    """Repairs answers by one strategy, with an optional repairing judge (needed for ``rewrite``)."""

    strategy: RepairStrategy
    backend: Backend | None = None
    params: GenerationParams = field(default_factory=GenerationParams)

    def __post_init__(self) -> None:
        if self.strategy == "rewrite" and self.backend is None:
            raise ValueError("the rewrite strategy needs a judge that writes text")

    async def repair(self, report: AuditRecord, sample: Sample) -> RepairRecord:
        """Repair one audited answer; a record that does not fit its sample gets ``errors``."""
        record = RepairRecord(
            id=report.id, line=report.line, strategy=self.strategy, original=sample.answer,
            repaired=None, claims=len(report.claims),
            unsupported_claims=sum(not is_supported(c) for c in report.claims), gold=sample.gold or report.gold,
        )
        if report.label is None:
            record.errors.append("the verify record has no verdict: " + ("; ".join(report.errors) or "unknown error"))
            return record
        try:
            edits = await self._plan(report, sample, record)
            repaired = apply_edits(sample.answer, edits)
        except RepairError as error:
            record.errors.append(str(error))
            return record
        if not repaired.strip() and sample.answer:
            edits = [_empty_edit(sample.answer, report.claims)]
            repaired = ""
        record.edits, record.repaired, record.empty = edits, repaired, not repaired
        record.text_retention = text_retention(sample.answer, repaired)
        record.claim_retention = claim_retention(
            [c.text for c in report.claims if is_supported(c)], repaired
        )
        return record

    async def _plan(self, report: AuditRecord, sample: Sample, record: RepairRecord) -> list[Edit]:
        answer = sample.answer
        # Split as the audit split it: the record's sentence indices and spans refer to that split.
        language = report.language or ENGLISH
        sentences = split_sentences(answer, language=language)
        flagged = self._flagged_sentences(report, sentences, record)
        context = segment_context(sample.context, language)[1]
        inserted_ids: set[int] = set()
        judge_items: list[_Flagged] = []
        for item in flagged:
            if self.strategy == "rewrite":
                item.action = "judge"
            elif item.supported:
                clauses_fit = _clause_spans(answer, item.span, item.claims) is not None
                item.action = "clauses" if clauses_fit else ("judge" if self.backend is not None else "drop")
            if self.strategy == "extract":
                fresh = [s for s in _evidence_sentences(item.unsupported, context) if s.index not in inserted_ids]
                inserted_ids.update(s.index for s in fresh)
                item.extract = fresh
            if item.action == "judge":
                judge_items.append(item)
        rewrites = await self._rewrites(judge_items, sample, record, language)
        edits: list[Edit] = []
        for item in flagged:
            edits.extend(self._sentence_edits(answer, item, sentences, rewrites.get(id(item))))
        return _tidy(answer, _merge(edits), sentences)

    def _flagged_sentences(
        self, report: AuditRecord, sentences: list[Sentence], record: RepairRecord
    ) -> list[_Flagged]:
        spans = {(s.start, s.end) for s in sentences}
        by_span: dict[tuple[int, int], list[ClaimVerdict]] = {}
        for claim in report.claims:
            if claim.answer_span is None:
                if not is_supported(claim):
                    record.errors.append(
                        f"claim {claim.index} has no answer span (holistic decomposition); left unrepaired"
                    )
                continue
            key = (claim.answer_span.start, claim.answer_span.end)
            if key not in spans:
                raise RepairError(
                    f"claim {claim.index}'s answer span [{key[0]}, {key[1]}) is not a sentence of the "
                    "sample's answer: the verify record does not belong to this sample"
                )
            by_span.setdefault(key, []).append(claim)
        return [
            _Flagged(span=Span(start=start, end=end), claims=claims)
            for (start, end), claims in sorted(by_span.items())
            if not all(is_supported(c) for c in claims)
        ]

    def _sentence_edits(
        self, answer: str, item: _Flagged, sentences: list[Sentence], rewrite: str | None
    ) -> list[Edit]:
        unsupported = item.unsupported
        if item.action == "clauses":
            clauses = _clause_spans(answer, item.span, item.claims)
            assert clauses is not None  # the action was chosen because they fit
            edits = _clause_edits(answer, item, clauses)
        elif item.action == "judge" and rewrite and self.backend is not None:
            edit = _rewrite_edit(answer, item, rewrite, self.backend.name)
            edits = [edit] if edit else []
        elif item.extract:
            # The sentence goes as a whole (nothing of it is kept), so the context takes its place.
            start, end = item.span.start, item.span.end
            return [
                Edit(
                    start=start, end=end, removed=answer[start:end], inserted=" ".join(s.text for s in item.extract),
                    reason=f"sentence replaced by the context it contradicts ({_describe(unsupported)} claims)",
                    claims=_indices(unsupported), evidence=_inserted_evidence(item.extract),
                )
            ]
        else:
            if item.action == "judge":
                why = "sentence removed: the judge wrote nothing for it"
            elif item.supported:
                why = "sentence removed: its supported and unsupported claims are not separate clauses"
            else:
                why = "unsupported sentence removed"
            start, end = _drop_range(answer, item.span, sentences)
            return [
                Edit(
                    start=start, end=end, removed=answer[start:end], reason=f"{why} ({_describe(unsupported)} claims)",
                    claims=_indices(unsupported), evidence=_claim_evidence(unsupported),
                )
            ]
        if item.extract:
            edits.append(
                Edit(
                    start=item.span.end, end=item.span.end, removed="",
                    inserted=" " + " ".join(s.text for s in item.extract),
                    reason="context that the removed claims contradict, put in after the sentence",
                    claims=[c.index for c in unsupported if c.label == Label.CONTRADICTED],
                    evidence=_inserted_evidence(item.extract),
                )
            )
        return edits

    async def _rewrites(
        self, items: list[_Flagged], sample: Sample, record: RepairRecord, language: str
    ) -> dict[int, str]:
        """Ask the judge to rewrite the flagged sentences in one call; keyed by ``id`` of the item.

        A sentence the reply leaves out, or every sentence of a failed call, is deleted instead
        (recorded in ``errors``): a flagged sentence is never kept as it was.
        """
        if not items or self.backend is None:
            return {}
        answer = sample.answer
        keep_fixing = self.strategy == "rewrite"
        requested = [
            RepairItem(
                sentence=position,
                text=answer[item.span.start : item.span.end],
                keep=[c.text for c in item.supported],
                fix=[c.text for c in item.unsupported] if keep_fixing else [],
                drop=[] if keep_fixing else [c.text for c in item.unsupported],
            )
            for position, item in enumerate(items)
        ]
        session = JudgeSession(self.backend, load_prompts(), self.params, language=language)
        context = segment_context(sample.context, language)[1]
        payload = RepairInput(question=sample.question, context=context, items=requested)
        request = session.request(payload)
        response = await session.send(request)
        record.judge, record.prompt_version, record.usage = self.backend.name, request.prompt_version, session.usage
        if not isinstance(response.parsed, RepairOutput):
            record.errors.append(f"rewrite failed ({response.error}); the flagged sentences were deleted")
            return {}
        texts: dict[int, str] = {}
        for entry in response.parsed.sentences:
            texts.setdefault(entry.sentence, entry.text.strip())
        missing = [p for p in range(len(items)) if p not in texts]
        if missing:
            record.errors.append(f"the judge gave no rewrite for flagged sentences {missing}; they were deleted")
        return {id(item): texts[p] for p, item in enumerate(items) if p in texts}


def _empty_edit(answer: str, claims: list[ClaimVerdict]) -> Edit:
    """One deletion of the whole answer: nothing of it is left."""
    unsupported = [c for c in claims if not is_supported(c)]
    return Edit(
        start=0, end=len(answer), removed=answer, reason="every claim unsupported: nothing is left",
        claims=_indices(unsupported), evidence=_claim_evidence(unsupported),
    )


class RepairSummary(BaseModel):
    """Figures over a batch of repair records."""

    strategy: RepairStrategy
    """The strategy of the records."""
    answers: int = 0
    """Records."""
    invalid: int = 0
    """Records with no repaired answer (unusable verify record or missing sample)."""
    edited: int = 0
    """Answers with at least one edit."""
    empty: int = 0
    """Answers of which nothing is left."""
    text_retention: float | None = None
    """Mean text retention over repaired answers."""
    claim_retention: float | None = None
    """Mean claim retention over repaired answers that had supported claims."""
    reverified: int = 0
    """Repaired answers re-audited (empty ones are not: nothing is left to flag)."""
    residual_hallucinated: int = 0
    """Re-audited answers still flagged."""
    residual_rate: float | None = None
    """residual_hallucinated / reverified."""
    residual_rate_with_empty: float | None = None
    """Still flagged among all repaired answers, empty ones counted as clean."""
    residual_claim_rate: float | None = None
    """Unsupported claims / claims over the re-audited answers."""
    gold_clean: int = 0
    """Answers that the gold labels mark clean."""
    gold_clean_edited: int = 0
    """Of those, answers repair edited."""
    gold_clean_edited_share: float | None = None
    """gold_clean_edited / gold_clean."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(strategy: RepairStrategy, records: list[RepairRecord]) -> RepairSummary:
    """Retention, residual hallucination and gold-clean edits over ``records``."""
    valid = [r for r in records if r.repaired is not None]
    reverified = [r for r in valid if r.verified_after is not None and r.verified_after.hallucinated is not None]
    still = sum(bool(r.verified_after and r.verified_after.hallucinated) for r in reverified)
    checked = sum(r.empty for r in valid) + len(reverified)
    claims = sum(r.verified_after.claims for r in reverified if r.verified_after)
    unsupported = sum(r.verified_after.unsupported_claims for r in reverified if r.verified_after)
    clean = [r for r in valid if r.gold is not None and r.gold.hallucinated is False]
    clean_edited = sum(bool(r.edits) for r in clean)
    return RepairSummary(
        strategy=strategy,
        answers=len(records),
        invalid=len(records) - len(valid),
        edited=sum(bool(r.edits) for r in valid),
        empty=sum(r.empty for r in valid),
        text_retention=_mean([r.text_retention for r in valid if r.text_retention is not None]),
        claim_retention=_mean([r.claim_retention for r in valid if r.claim_retention is not None]),
        reverified=len(reverified),
        residual_hallucinated=still,
        residual_rate=still / len(reverified) if reverified else None,
        residual_rate_with_empty=still / checked if reverified else None,
        residual_claim_rate=unsupported / claims if claims else None,
        gold_clean=len(clean),
        gold_clean_edited=clean_edited,
        gold_clean_edited_share=clean_edited / len(clean) if clean else None,
    )


def repaired_samples(records: list[RepairRecord], samples: dict[int, Sample]) -> list[tuple[RepairRecord, Sample]]:
    """Every repaired, non-empty answer as a sample to re-audit (empty ones are not: nothing is left
    to flag), paired with its record; ``samples`` are keyed by record line."""
    return [
        (record, samples[record.line].model_copy(update={"answer": record.repaired, "gold": None}))
        for record in records
        if record.repaired and record.repaired.strip()
    ]


def record_reaudit(record: RepairRecord, after: AuditRecord) -> None:
    """Fill ``record.verified_after`` from the audit record of its repaired answer."""
    record.verified_after = VerifiedAfter(
        judge=after.judge,
        label=after.label,
        hallucinated=after.hallucinated,
        claims=len(after.claims),
        unsupported_claims=sum(not is_supported(c) for c in after.claims),
        errors=after.errors,
    )
