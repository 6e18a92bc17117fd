"""An answer audited while it arrives: each sentence goes to the judge as soon as it is complete, its
verdict is emitted in answer order, and the sentences' records join into the answer's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rt4chart.method.joins import and_join, answer_hallucinated
from rt4chart.method.text import split_sentences
from rt4chart.runs.guard.policy import ClaimAllowance, Decision, GuardConfig, RequestError
from rt4chart.types import AuditRecord, ClaimVerdict, Sample, Span, Usage, answer_sha256


class Auditor(Protocol):
    """What a streamed audit needs of the service (:class:`rt4chart.runs.guard.service.Guard`)."""

    config: GuardConfig

    async def audit(
        self, sample: Sample, allowance: ClaimAllowance | None = None, latency_budget_ms: float | None = None
    ) -> AuditRecord: ...

    async def conclude(self, record: AuditRecord, started: float) -> Decision: ...


def with_answer(sample: Sample, sample_id: str, answer: str) -> Sample:
    """``sample`` (its context or documents, question, language) with another id and answer. A
    conversation's sample keeps the documents and earlier turns its messages gave; without its messages
    the new answer, not the last assistant message, is the one audited."""
    return sample.model_copy(update={"id": sample_id, "answer": answer, "messages": None})


def merge_sentence_records(request_id: str, answer: str, parts: list[tuple[int, AuditRecord]]) -> AuditRecord:
    """One answer record from the records of its sentences audited one by one (``parts``: each
    sentence's start offset in ``answer`` and its record): claims renumbered, spans moved to the
    answer's offsets, the answer label joined over every claim as the pipeline joins them."""
    claims: list[ClaimVerdict] = []
    spans: list[Span] = []
    usage = Usage()
    usage_by_judge: dict[str, Usage] = {}
    errors: list[str] = []
    for sentence_index, (start, record) in enumerate(parts):
        for claim in record.claims:
            span = (
                Span(start=start + claim.answer_span.start, end=start + claim.answer_span.end)
                if claim.answer_span
                else None
            )
            claims.append(
                claim.model_copy(update={"index": len(claims), "sentence_index": sentence_index, "answer_span": span})
            )
        spans.extend(Span(start=start + span.start, end=start + span.end) for span in record.spans)
        usage = usage + record.usage
        for judge, spent in record.usage_by_judge.items():
            usage_by_judge[judge] = usage_by_judge.get(judge, Usage()) + spent
        errors.extend(record.errors)
    labels = [claim.label for claim in claims] if claims else [record.label for _, record in parts]
    first = parts[0][1] if parts else AuditRecord(id=request_id, line=1)
    return first.model_copy(
        update={
            "id": request_id,
            "label": and_join(labels) if parts else None,
            "hallucinated": answer_hallucinated(labels) if parts else None,
            "claims": claims,
            "spans": spans,
            "usage": usage,
            "usage_by_judge": usage_by_judge,
            "errors": errors if parts else ["the answer has no sentence to verify"],
            "incomplete": any(record.incomplete for _, record in parts),
            "decomposition": None,
            "answer_sha256": answer_sha256(answer),
        }
    )


@dataclass
class SentenceVerdict:
    """One answer sentence and its audit, as a stream event."""

    index: int
    start: int
    end: int
    text: str
    record: AuditRecord
    decision: Decision

    def event(self) -> dict[str, Any]:
        """The sentence's verdict as a stream event: what a client acts on while the answer streams
        (its claims' labels, confidence, evidence quotes with their context offsets, and what went
        wrong), not the whole record: the answer event that ends the stream carries the answer's
        record, every claim in full."""
        return {
            "event": "sentence",
            "index": self.index,
            "start": self.start,
            "end": self.end,
            "text": self.text,
            "label": self.record.label,
            "decision": self.decision,
            "claims": [
                {
                    "text": claim.text,
                    "label": claim.label,
                    "confidence": claim.confidence,
                    "evidence": [{"start": e.start, "end": e.end, "text": e.text} for e in claim.evidence],
                    "errors": claim.errors,
                }
                for claim in self.record.claims
            ],
            "errors": self.record.errors,
            "incomplete": self.record.incomplete,
        }


class StreamingAudit:
    """Audits an answer while it arrives: ``feed`` text, each sentence is handed to the judge as soon
    as the next one has started (or ``finish`` ends the answer), the sentences are audited
    concurrently, and ``emit`` gets each verdict in answer order as soon as it and those before it
    are in. With ``stop_on_block``, nothing is emitted after a blocked sentence. Each sentence is
    audited as ``sample`` (its context or documents, question, language) with that sentence as answer."""

    def __init__(
        self,
        guard: Auditor,
        sample: Sample,
        emit: Callable[[SentenceVerdict], Awaitable[None]],
        *,
        stop_on_block: bool = False,
        latency_budget_ms: float | None = None,
    ) -> None:
        self.guard = guard
        self.latency_budget_ms = latency_budget_ms
        self.allowance = ClaimAllowance(guard.config.limits.max_claims)
        self.sample = sample
        self.request_id = sample.id
        self.language = sample.language
        self.answer = ""
        self.verdicts: list[SentenceVerdict] = []
        """The verdicts emitted, in answer order."""
        self.blocked = asyncio.Event()
        """Set once a sentence is blocked."""
        self._settled = 0  # answer offset up to which sentences were handed to the judge
        self._tasks: list[asyncio.Task[AuditRecord]] = []
        self._queue: asyncio.Queue[tuple[int, str, asyncio.Task[AuditRecord]] | None] = asyncio.Queue()
        self._emitter = asyncio.create_task(self._emit_in_order(emit, stop_on_block))

    def feed(self, text: str) -> None:
        self.answer += text
        self._split(final=False)

    def finish(self) -> None:
        self._split(final=True)
        self._queue.put_nowait(None)

    async def drain(self) -> None:
        """Wait until every verdict is emitted (after :meth:`finish`, or a block)."""
        await self._emitter

    def cancel(self) -> None:
        for task in [*self._tasks, self._emitter]:
            task.cancel()

    def _split(self, *, final: bool) -> None:
        limit = self.guard.config.limits.max_sentences
        sentences = split_sentences(self.answer[self._settled :], language=self.language or "en")
        complete = sentences if final else sentences[:-1]
        for sentence in complete:
            if len(self._tasks) >= limit:
                raise RequestError(413, f"the answer has more than {limit} sentences (--max-sentences)")
            sample = with_answer(self.sample, f"{self.request_id}#{len(self._tasks)}", sentence.text)
            task = asyncio.create_task(self.guard.audit(sample, self.allowance, self.latency_budget_ms))
            self._tasks.append(task)
            self._queue.put_nowait((self._settled + sentence.start, sentence.text, task))
        if complete:
            self._settled += complete[-1].end if final else sentences[-1].start

    async def _emit_in_order(self, emit: Callable[[SentenceVerdict], Awaitable[None]], stop_on_block: bool) -> None:
        while (pending := await self._queue.get()) is not None:
            start, text, task = pending
            record = await task
            decision = self.guard.config.policy.decide(record)
            verdict = SentenceVerdict(len(self.verdicts), start, start + len(text), text, record, decision)
            self.verdicts.append(verdict)
            await emit(verdict)
            if decision == "block":
                self.blocked.set()
                if stop_on_block:
                    return

    async def answer_event(self, started: float) -> dict[str, Any]:
        """The answer's verdict over the sentences emitted: logged, counted, as a stream event."""
        record = merge_sentence_records(self.request_id, self.answer, [(v.start, v.record) for v in self.verdicts])
        decision = await self.guard.conclude(record, started)
        return {
            "event": "answer",
            "label": record.label,
            "decision": decision,
            "record": record.model_dump(mode="json"),
        }
