"""The direct baseline (an ablation, as in the paper): one judge call over the whole context and
the whole answer that returns the hallucinated answer spans. No claims, no chunks, no global pass.

Each returned span becomes one claim-like verdict whose answer span is where the quote was found
in the answer; a quote that is not in the answer keeps its label (the judge did flag something)
but has no span and is reported as an error, the way ungrounded evidence is.
"""

from __future__ import annotations

from rt4chart.method.grounding import ContextIndex, anchor_quotes, passage_map
from rt4chart.method.session import JudgeSession
from rt4chart.method.tasks import DirectInput, DirectOutput
from rt4chart.method.text import segment_context, split_sentences
from rt4chart.method.verification import and_join, hallucinated_spans
from rt4chart.types import AuditRecord, ClaimVerdict, Label, Sample, Span


async def audit_directly(session: JudgeSession, sample: Sample) -> AuditRecord:
    """Audit one sample with one call (the record's identity and usage are the caller's to fill)."""
    context, sentences = segment_context(sample.context, session.language)
    answer_sentences = split_sentences(sample.answer, language=session.language)
    payload = DirectInput(
        question=sample.question, context=context, answer=sample.answer, sentences=[s.text for s in answer_sentences]
    )
    response = await session.send(session.request(payload))
    report = AuditRecord(id=sample.id, line=0, context_sentences=len(sentences))
    if not isinstance(response.parsed, DirectOutput):
        report.errors.append(f"direct judge failed: {response.error}")
        report.incomplete = True
        return report
    answer = ContextIndex(sample.answer, answer_sentences)
    context_index = ContextIndex(context, sentences, passage_map(sample))
    verdicts: list[ClaimVerdict] = []
    for span in response.parsed.spans:
        if span.label == Label.ENTAILED:
            continue
        found = answer.anchor(span.text)
        # As in the paper, a contradicted span comes with the context that refutes it.
        quotes = span.evidence if span.label == Label.CONTRADICTED else []
        anchoring = anchor_quotes(context_index, quotes)
        evidence, missing = anchoring.evidence, anchoring.missing + anchoring.slight
        problems = ([] if found else ["the quoted span is not in the answer"]) + [
            f"evidence not found in the context: {quote!r}" for quote in anchoring.missing
        ] + [f"evidence too slight to count: {quote!r}" for quote in anchoring.slight]
        verdicts.append(
            ClaimVerdict(
                index=len(verdicts),
                text=span.text,
                sentence_index=None,
                answer_span=Span(start=found.start, end=found.end) if found else None,
                label=span.label,
                evidence=evidence,
                rationale=span.rationale,
                confidence=span.confidence,
                grounded=found is not None and not missing,
                judge=response.judge or session.backend.name,
                errors=problems,
            )
        )
    # No flagged span is the direct baseline's verdict that the answer is faithful (unlike a claim
    # list, which is never empty when an answer was verified).
    label = and_join(v.label for v in verdicts) if verdicts else Label.ENTAILED
    report.label = label
    report.hallucinated = label != Label.ENTAILED
    report.claims = verdicts
    report.spans = hallucinated_spans(verdicts)
    report.errors.extend(f"span {v.text!r} is not in the answer" for v in verdicts if v.answer_span is None)
    return report
