"""The direct baseline (an ablation, as in the paper): one judge call over the whole context and
the whole answer that returns the hallucinated answer spans. No claims, no chunks, no global pass.

Each returned span becomes one claim-like verdict whose answer span is where the quote was found
in the answer; a quote that is not in the answer keeps its label (the judge did flag something)
but has no span and is reported as an error, the way ungrounded evidence is.
"""

from __future__ import annotations

from dataclasses import dataclass

from rt4chart.backends.base import DirectInput, DirectOutput, JudgeRequest
from rt4chart.grounding import ContextIndex
from rt4chart.pipeline import Pipeline
from rt4chart.session import JudgeSession
from rt4chart.text import segment_context, split_sentences
from rt4chart.types import ClaimVerdict, Label, Report, Sample, Span
from rt4chart.verify import and_join, hallucinated_spans


@dataclass
class DirectPipeline(Pipeline):
    """A :class:`Pipeline` whose audit of a sample is the single direct call."""

    def _direct_request(self, sample: Sample, session: JudgeSession) -> tuple[JudgeRequest, int]:
        context, sentences = segment_context(sample.context)
        payload = DirectInput(question=sample.question, context=context, answer=sample.answer)
        fields = {"context": context, "question": sample.question or "(none)", "answer": sample.answer}
        return session.request("direct", "direct", payload, fields), len(sentences)

    def plan_requests(self, sample: Sample) -> list[JudgeRequest]:
        """The one request a direct audit of ``sample`` sends."""
        session = JudgeSession(self.backend, self.prompts, self.options.params)
        return [self._direct_request(sample, session)[0]]

    async def verify_sample(self, sample: Sample, line: int = 1) -> Report:
        """Audit one sample with one call."""
        session = JudgeSession(self.backend, self.prompts, self.options.params)
        request, context_sentences = self._direct_request(sample, session)
        response = await session.send(request)
        report = Report(
            id=sample.id,
            line=line,
            context_sentences=context_sentences,
            usage=session.usage,
            usage_by_judge=session.usage_by_judge,
            judge=self.backend.name,
            prompt_version=self.prompt_version,
            gold=sample.gold,
        )
        if not isinstance(response.parsed, DirectOutput):
            report.errors.append(f"direct judge failed: {response.error}")
            return report
        answer = ContextIndex(sample.answer, split_sentences(sample.answer))
        verdicts: list[ClaimVerdict] = []
        for span in response.parsed.spans:
            if span.label == Label.ENTAILED:
                continue
            found = answer.anchor(span.text)
            verdicts.append(
                ClaimVerdict(
                    index=len(verdicts),
                    text=span.text,
                    sentence_index=None,
                    answer_span=Span(start=found.start, end=found.end) if found else None,
                    label=span.label,
                    rationale=span.rationale,
                    confidence=span.confidence,
                    grounded=found is not None,
                    judge=response.judge or self.backend.name,
                    errors=[] if found else ["the quoted span is not in the answer"],
                )
            )
        # The direct judge read the whole answer and flagged nothing: that is its verdict (unlike a
        # claim-based audit, where no claim means nothing was checked).
        label = and_join(v.label for v in verdicts) if verdicts else Label.ENTAILED
        report.label = label
        report.hallucinated = label != Label.ENTAILED
        report.claims = verdicts
        report.spans = hallucinated_spans(verdicts)
        report.errors.extend(f"span {v.text!r} is not in the answer" for v in verdicts if not v.grounded)
        return report
