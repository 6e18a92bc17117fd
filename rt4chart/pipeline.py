"""Async orchestration: one sample end to end, and batches of samples in input order."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from pydantic import Field

from rt4chart.backends.base import Backend, CostEstimator, GenerationParams, JudgeRequest, prompt_tokens
from rt4chart.budget import BudgetExhausted
from rt4chart.cache import JudgeCache, request_key
from rt4chart.decompose import (
    DecomposerKind,
    decompose_by_judge,
    decompose_by_rules,
    decompose_holistically,
    decompose_request,
    holistic_request,
)
from rt4chart.grounding import ContextIndex
from rt4chart.io import (
    InputLine,
    ReportAppender,
    audit_fingerprint,
    dump_report,
    error_report,
    output_lock,
    read_completed,
    record_key,
    resolve_output,
    write_reports_atomically,
)
from rt4chart.prompts import PromptTemplate, load_prompts, prompt_set_version
from rt4chart.session import JudgeSession
from rt4chart.text import chunk_sentences, segment_context, split_sentences
from rt4chart.types import Chunk, Label, Report, Sample, Sentence
from rt4chart.verify import ClaimJudge, VerifyOptions, and_join, batches, hallucinated_spans, verify_claims


class PipelineOptions(VerifyOptions):
    """Everything that shapes an audit besides the judge."""

    decomposer: DecomposerKind = "auto"
    """``judge``, ``rules``, or ``auto`` (the judge when it can decompose, else rules)."""
    params: GenerationParams = Field(default_factory=GenerationParams)
    """Sampling parameters for every judge call."""
    samples_in_flight: int = Field(default=16, ge=1)
    """Samples audited at once; judge calls are further bounded by the judge's concurrency.
    Fewer samples in flight finish samples sooner, which matters when a budget may stop the run."""


@dataclass
class _Prepared:
    """A sample segmented and chunked, with the session that will judge it."""

    answer_sentences: list[Sentence]
    chunks: list[Chunk]
    session: JudgeSession
    judge: ClaimJudge
    decompose_by_judge: bool


@dataclass
class Pipeline:
    """A judge, its prompts and options: verifies samples."""

    backend: Backend
    options: PipelineOptions = field(default_factory=PipelineOptions)
    prompts: dict[str, PromptTemplate] = field(default_factory=load_prompts)

    @property
    def prompt_version(self) -> str:
        return prompt_set_version(self.prompts)

    def _prepare(self, sample: Sample) -> _Prepared:
        context, sentences = segment_context(sample.context)
        session = JudgeSession(self.backend, self.prompts, self.options.params)
        return _Prepared(
            answer_sentences=split_sentences(sample.answer),
            chunks=chunk_sentences(len(sentences), self.options.window, self.options.overlap),
            session=session,
            judge=ClaimJudge(session, ContextIndex(context, sentences), sample.question),
            decompose_by_judge=self.options.decomposer == "judge"
            or (self.options.decomposer == "auto" and self.backend.supports_decompose),
        )

    async def verify_sample(self, sample: Sample, line: int = 1) -> Report:
        """Audit one sample."""
        prepared = self._prepare(sample)
        if not prepared.answer_sentences:
            # e.g. an answer made only of list markers: nothing to verify is not "all entailed"
            return Report(id=sample.id, line=line, errors=[f"line {line}: answer has no sentence to verify"])
        session = prepared.session
        errors: list[str] = []
        if self.options.decomposer == "holistic":
            claims, errors = await decompose_holistically(
                session, sample.answer, prepared.answer_sentences, sample.question
            )
        elif prepared.decompose_by_judge:
            claims, errors = await decompose_by_judge(session, prepared.answer_sentences, sample.question)
        else:
            claims = decompose_by_rules(prepared.answer_sentences)
        verdicts = await verify_claims(prepared.judge, claims, prepared.chunks, self.options)
        label = and_join(v.label for v in verdicts)
        return Report(
            id=sample.id,
            line=line,
            label=label,
            hallucinated=label != Label.ENTAILED,
            claims=verdicts,
            spans=hallucinated_spans(verdicts),
            context_sentences=len(prepared.judge.index.sentences),
            chunks=len(prepared.chunks),
            usage=session.usage,
            usage_by_judge=session.usage_by_judge,
            judge=self.backend.name,
            prompt_version=self.prompt_version,
            errors=errors,
            gold=sample.gold,
        )

    def plan_requests(self, sample: Sample) -> list[JudgeRequest]:
        """The requests an audit of ``sample`` would send, built without calling the judge.

        Claims are unknown until the judge decomposes the answer, so the plan uses the rule-based
        claims; it assumes no claim is skipped and one global group per batch of claims.
        """
        prepared = self._prepare(sample)
        judge, batch = prepared.judge, self.options.batch_claims
        sentences = judge.index.sentences
        requests = []
        if self.options.decomposer == "holistic" and prepared.answer_sentences:
            requests.append(holistic_request(prepared.session, sample.answer, sample.question))
        elif prepared.decompose_by_judge and prepared.answer_sentences:
            requests.append(decompose_request(prepared.session, prepared.answer_sentences, sample.question))
        claims = decompose_by_rules(prepared.answer_sentences)
        for chunk in prepared.chunks:
            view = sentences[chunk.first : chunk.last + 1]
            requests.extend(judge.build_request(b, view, "local", chunk.index) for b in batches(claims, batch))
        if self.options.global_verification and sentences:
            requests.extend(judge.build_request(b, sentences, "global") for b in batches(claims, batch))
        return requests

    async def run(self, items: Iterable[InputLine]) -> AsyncIterator[Report]:
        """Audit input lines concurrently; yield one report per line, in input order."""
        pending: deque[asyncio.Task[Report]] = deque()
        iterator = iter(items)

        def start_next() -> bool:
            item = next(iterator, None)
            if item is None:
                return False
            pending.append(asyncio.ensure_future(self._report(item)))
            return True

        while len(pending) < self.options.samples_in_flight and start_next():
            pass
        try:
            while pending:
                report = await pending.popleft()
                start_next()
                yield report
        finally:
            for task in pending:
                task.cancel()

    async def _report(self, item: InputLine) -> Report:
        if item.sample is None:
            return error_report(item)
        return await self.verify_sample(item.sample, item.line)


@dataclass
class AuditResult:
    """How a batch audit ended."""

    written: int = 0
    """Records written by this run."""
    resumed: int = 0
    """Records kept from an earlier run (``--resume``)."""
    remaining: int = 0
    """Input lines left without a record because the budget stopped the run."""
    stopped_by_budget: bool = False
    """True when a call was refused by the budget."""


async def run_audit(
    pipeline: Pipeline,
    items: list[InputLine],
    out: Path | None,
    on_report: Callable[[Report], None],
    *,
    resume: bool = False,
    stdout: TextIO | None = None,
) -> AuditResult:
    """Audit ``items`` into ``out`` (or ``stdout``), one record per line, in input order.

    With ``resume``, records already complete in ``out`` for the same input line content and
    audit configuration are kept and their inputs skipped. When the budget refuses a call, every
    record finished before it is written completely, nothing half-done is, and the result says
    how many inputs remain. The file ends in input order. ``out`` is written through a symlink to
    its target, under its advisory lock (:func:`rt4chart.io.output_lock`; a second run on the same
    file raises :class:`rt4chart.io.OutputError`).
    """
    target = resolve_output(out) if out is not None else None
    with output_lock(target):
        return await _audit(pipeline, items, target, on_report, resume=resume, stdout=stdout)


async def _audit(
    pipeline: Pipeline,
    items: list[InputLine],
    out: Path | None,
    on_report: Callable[[Report], None],
    *,
    resume: bool,
    stdout: TextIO | None,
) -> AuditResult:
    result = AuditResult()
    fingerprint = audit_fingerprint(pipeline.backend.name, pipeline.prompt_version, pipeline.options)
    completed = read_completed(out, items, fingerprint) if resume and out else {}
    if out is not None:
        # Rewriting first drops a torn tail or foreign records before anything is appended.
        write_reports_atomically(out, [completed[line] for line in sorted(completed)])
    result.resumed = len(completed)
    for report in completed.values():
        on_report(report)
    todo = [item for item in items if item.line not in completed]
    appender = ReportAppender(out) if out is not None else None
    try:
        async for report in pipeline.run(todo):
            report.input_hash = record_key(todo[result.written], fingerprint)
            if appender is not None:
                appender.append(report)
            elif stdout is not None:
                stdout.write(dump_report(report) + "\n")
                stdout.flush()
            result.written += 1
            on_report(report)
    except BudgetExhausted:
        result.stopped_by_budget = True
        result.remaining = len(todo) - result.written
    finally:
        if appender is not None:
            appender.close()
        await pipeline.backend.aclose()
    if out is not None and result.resumed:
        _restore_input_order(out, items)
    return result


def _restore_input_order(out: Path, items: list[InputLine]) -> None:
    records = read_completed(out, items)
    lines = [report.line for report in records.values()]
    if lines != sorted(lines):
        write_reports_atomically(out, [records[line] for line in sorted(records)])


@dataclass
class AuditEstimate:
    """What an audit would need, computed without calling a judge."""

    samples: int = 0
    """Valid input samples."""
    invalid: int = 0
    """Input lines that would get an error record."""
    calls: int = 0
    """Planned judge calls (no re-asks, no skips)."""
    prompt_tokens: int = 0
    """Prompt tokens of the planned calls."""
    max_completion_tokens: int = 0
    """Completion tokens if every call used its full ``max_tokens``."""
    worst_case_usd: float = 0.0
    """Cost if every call used its full ``max_tokens`` (what a budget reserves)."""
    cached: int = 0
    """Planned calls whose reply is already in the cache."""


def estimate_audit(pipeline: Pipeline, items: list[InputLine], cache: JudgeCache) -> AuditEstimate:
    """Plan every request of an audit and price it; see :meth:`Pipeline.plan_requests`."""
    plan = AuditEstimate()
    backend = pipeline.backend
    for item in items:
        if item.sample is None:
            plan.invalid += 1
            continue
        plan.samples += 1
        for request in pipeline.plan_requests(item.sample):
            plan.calls += 1
            plan.prompt_tokens += prompt_tokens(backend, request)
            plan.max_completion_tokens += request.params.max_tokens
            if isinstance(backend, CostEstimator):
                plan.worst_case_usd += backend.max_cost_usd(request)
            plan.cached += cache.get(request_key(backend.name, request)) is not None
    return plan
