"""Async orchestration: one sample end to end, and batches of samples in input order.

:class:`AuditEngine` is what a batch runner needs of an engine: records in, records out, in input
order, a stop (the budget refused a call, the judge cannot be reached) as a typed value
(:data:`RunStop`) that ends the stream instead of an exception or a string. :class:`Pipeline` is the
local engine; :class:`rt4chart.runs.ray_engine.RayEngine` the other one. :func:`run_audit` drives either.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal, Protocol, TextIO, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from rt4chart.judges.budget import SampleAdmission
from rt4chart.judges.registry import JudgeStack
from rt4chart.languages import audit_language
from rt4chart.method.citations import CitedAnswer, audit_citations, find_citations
from rt4chart.method.decompose import Decomposition, decompose_answer
from rt4chart.method.direct import audit_directly
from rt4chart.method.grounding import ContextIndex, passage_map
from rt4chart.method.prompts import PromptTemplate
from rt4chart.method.session import JudgeSession
from rt4chart.method.settlement import settle_at_threshold, settle_earlier_turns
from rt4chart.method.tasks import load_prompts, prompt_set_version
from rt4chart.method.text import chunk_sentences, content_words, segment_context, split_sentences
from rt4chart.method.verification import ClaimVerifier, and_join, answer_hallucinated, hallucinated_spans, verify_claims
from rt4chart.options import AuditOptions, HelpPanel
from rt4chart.protocol import Backend, BudgetExhausted, JudgeUnavailable
from rt4chart.records.io import (
    AUDIT_RECORDS,
    InputLine,
    RecordKind,
    ReportAppender,
    RunRecord,
    audit_fingerprint,
    dump_report,
    error_report,
    output_lock,
    read_kept,
    read_reusable,
    record_key,
    resolve_output,
    write_reports_atomically,
)
from rt4chart.runs.telemetry import RunTracing
from rt4chart.types import (
    AuditRecord,
    Label,
    Sample,
    Sentence,
    answer_sha256,
    context_sha256,
)


class BudgetStop(BaseModel):
    """The budget refused a call: the run stops with every record finished before it kept."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["budget"] = "budget"
    """Which stop this is (the discriminator of :data:`RunStop`)."""
    detail: str = ""
    """The budget's message."""

    def __str__(self) -> str:
        return self.detail or "stopped by the budget"

    def exception(self) -> BudgetExhausted:
        """The exception a caller that wants one raises (:func:`rt4chart.verify`)."""
        return BudgetExhausted(self.detail)


class UnavailableStop(BaseModel):
    """The judge's circuit opened (it cannot be reached, or refuses every call): the run stops."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["unavailable"] = "unavailable"
    """Which stop this is (the discriminator of :data:`RunStop`)."""
    endpoint: str
    """The judge and where it is called (never a key)."""
    failures: int
    """Requests in a row that failed non-transiently."""
    last_error: str
    """The last of those errors."""

    def __str__(self) -> str:
        return str(self.exception())

    def exception(self) -> JudgeUnavailable:
        """The exception a caller that wants one raises (:func:`rt4chart.verify`)."""
        return JudgeUnavailable(self.endpoint, self.failures, self.last_error)


RunStop = Annotated[BudgetStop | UnavailableStop, Field(discriminator="kind")]
"""Why an engine stopped before its last record: a value that crosses processes as JSON."""


def stop_of(error: BudgetExhausted | JudgeUnavailable) -> BudgetStop | UnavailableStop:
    """The typed stop of the exception a backend raised."""
    if isinstance(error, BudgetExhausted):
        return BudgetStop(detail=str(error))
    return UnavailableStop(endpoint=error.endpoint, failures=error.failures, last_error=error.last_error)


R = TypeVar("R", bound=RunRecord)
"""The kind of record an engine writes (an audit's, a repair's)."""


async def in_input_order(
    items: Iterable[InputLine],
    audit: Callable[[InputLine], Awaitable[R]],
    in_flight: int,
    admission: SampleAdmission | None = None,
) -> AsyncIterator[R]:
    """``audit`` every item, up to ``in_flight`` at a time (fewer when ``admission``, the budget's,
    says so), yielding the reports in input order; an exception of one audit (a stop) cancels the
    others and propagates."""
    pending: deque[asyncio.Task[R]] = deque()
    iterator = iter(items)

    def start_next() -> bool:
        item = next(iterator, None)
        if item is None:
            return False
        pending.append(asyncio.ensure_future(audit(item)))
        return True

    def fill() -> None:
        while len(pending) < in_flight and (admission is None or admission.may_start(len(pending))) and start_next():
            pass

    fill()
    try:
        while pending:
            report = await pending.popleft()
            if admission is not None:
                admission.sample_finished(report.usage.cost_usd)
            fill()
            yield report
    finally:
        for task in pending:
            task.cancel()


Engine = Literal["local", "ray"]
"""Where an audit runs: this process, or a Ray cluster's workers."""


class EngineOptions(BaseModel):
    """Where ``rt4 verify`` runs its audit (``--engine``, ``--address``, ``--workers``, ``--worker-cpus``):
    options of the run, not of the audit, so they change no record and no ``--resume`` binding."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    engine: Engine = Field(default="local", json_schema_extra={"panel": HelpPanel.SCALE})
    """local (this process) or ray (a Ray Data pipeline over worker actors; the ray extra)."""
    address: str | None = Field(default=None, json_schema_extra={"panel": HelpPanel.SCALE})
    """Ray cluster to join (auto: the one started on this machine with `ray start`); default: a local one."""
    workers: int = Field(default=2, ge=1, json_schema_extra={"panel": HelpPanel.SCALE})
    """Ray workers, each with its own judge stack and --concurrency calls in flight."""
    worker_cpus: float = Field(default=1.0, gt=0.0, json_schema_extra={"panel": HelpPanel.SCALE})
    """CPUs Ray reserves per worker (a judge worker mostly waits on HTTP; litellm costs a few ms of CPU per call)."""


class AuditEngine(Protocol[R]):
    """Where a batch of input lines is run (audited, repaired): lines in, records out, in input order.

    ``audit`` yields one record per input line, in order, until it yields a stop (then nothing
    more: the lines after it are not run). ``judge_name``, ``prompt_version`` and ``options``
    bind the records for ``--resume``: they are the driver's, whatever process makes the calls.
    ``records`` says how the batch runner reads, judges finished and fills in its records.
    """

    @property
    def judge_name(self) -> str: ...

    @property
    def prompt_version(self) -> str: ...

    @property
    def options(self) -> BaseModel: ...

    @property
    def records(self) -> RecordKind[R]: ...

    def audit(self, items: Iterable[InputLine]) -> AsyncIterator[R | BudgetStop | UnavailableStop]: ...


MAX_ANSWER_SENTENCES = 300
"""Sentences an answer may hold: each is decomposed and its claims verified against every chunk."""


@dataclass
class Pipeline:
    """A judge, its prompts and options: verifies samples.

    The pipeline never closes its backend: whoever built the judge stack closes it.
    """

    backend: Backend
    options: AuditOptions = field(default_factory=AuditOptions)
    prompts: dict[str, PromptTemplate] = field(default_factory=load_prompts)
    tracing: RunTracing | None = None
    """The run's OpenTelemetry tracing, when configured: a span per sample (:mod:`rt4chart.runs.telemetry`)."""

    @property
    def prompt_version(self) -> str:
        return prompt_set_version(self.prompts)

    @property
    def judge_name(self) -> str:
        return self.backend.name

    @property
    def records(self) -> RecordKind[AuditRecord]:
        return AUDIT_RECORDS

    @property
    def decomposes_by_judge(self) -> bool:
        """Whether answers are decomposed by a judge call (holistically or by sentence; else by rules)."""
        return self.options.decomposer in ("judge", "holistic") or (
            self.options.decomposer == "auto" and self.backend.capabilities.can_write_text
        )

    def _session(self, sample: Sample) -> JudgeSession:
        language = audit_language(sample.language, self.options.language, sample.answer, sample.context)
        return JudgeSession(self.backend, self.prompts, self.options.params, language=language)

    def _answer(self, sample: Sample, language: str) -> tuple[CitedAnswer | None, list[Sentence]]:
        """The answer's citations and the sentences the audit decomposes (citation markers leave the
        text the judge sees; sentences keep the answer's offsets)."""
        cited = find_citations(sample, self.options.citation_pattern, language)
        return cited, cited.sentences if cited is not None else split_sentences(sample.answer, language=language)

    async def _decompose(
        self, session: JudgeSession, sample: Sample, sentences: list[Sentence], cited: CitedAnswer | None
    ) -> Decomposition:
        question = sample.question if self.options.decompose_with_question else None
        return await decompose_answer(
            session if self.decomposes_by_judge else None, self.options, sentences,
            cited.answer if cited is not None else sample.answer, question,
        )

    async def draw_claims(self, sample: Sample) -> Decomposition:
        """The claims this pipeline's judge would verify for ``sample``: the decomposition front of
        :meth:`verify_sample` alone (``rt4 compare`` draws them once and has every judge verify them)."""
        session = self._session(sample)
        cited, sentences = self._answer(sample, session.language)
        if not sentences or len(sentences) > MAX_ANSWER_SENTENCES:
            return Decomposition([])  # every judge's record says why (verify_sample checks first)
        return await self._decompose(session, sample, sentences, cited)

    async def verify_sample(
        self,
        sample: Sample,
        line: int = 1,
        decomposition: Decomposition | None = None,
        admit_claims: Callable[[int], None] | None = None,
    ) -> AuditRecord:
        """Audit one sample with the configured method; ``decomposition``, when given, replaces the
        pipeline's own (``rt4 compare``: one claim set, drawn by :meth:`draw_claims`, verified by
        every judge). ``admit_claims``, when given, is told the number of claims drawn before any is
        verified, and refuses them by raising (``rt4 guard``'s claim limit)."""
        session = self._session(sample)
        language = session.language
        if self.options.method == "direct":
            report = await audit_directly(session, sample)
        elif (
            refusal := self.backend.capabilities.language_refusal(language, self.backend.name)
        ) is not None and content_words(sample.answer):
            # An English model's verdicts on other languages look confident and mean little: the
            # sample stays open (exit 4) and says which judges can audit it. An answer with no word
            # at all asks the judge nothing: it is baseless in any language (nothing_to_check).
            report = AuditRecord(id=sample.id, line=line, errors=[f"line {line}: {refusal}"], incomplete=True)
        else:
            cited, answer_sentences = self._answer(sample, language)
            if not answer_sentences:
                # e.g. an answer made only of list markers: nothing to verify is not "all entailed"
                return AuditRecord(id=sample.id, line=line, errors=[f"line {line}: answer has no sentence to verify"])
            if len(answer_sentences) > MAX_ANSWER_SENTENCES:
                problem = f"answer of {len(answer_sentences)} sentences, over the limit of {MAX_ANSWER_SENTENCES}"
                return AuditRecord(id=sample.id, line=line, errors=[f"line {line}: {problem}"])
            report = await self._rt4chart(session, sample, answer_sentences, decomposition, cited, admit_claims)
        return report.model_copy(
            update={
                "id": sample.id,
                "line": line,
                "usage": session.usage,
                "usage_by_judge": session.usage_by_judge,
                "judge": self.backend.name,
                "prompt_version": self.prompt_version,
                "gold": sample.gold,
                "trace": sample.trace,
                "answer_sha256": answer_sha256(sample.answer),
                "context_sha256": context_sha256(sample.context),
                "language": language,
            }
        )

    async def _rt4chart(
        self,
        session: JudgeSession,
        sample: Sample,
        answer_sentences: list[Sentence],
        decomposition: Decomposition | None,
        cited: CitedAnswer | None,
        admit_claims: Callable[[int], None] | None = None,
    ) -> AuditRecord:
        options = self.options
        context, sentences = segment_context(sample.context, session.language)
        chunks = chunk_sentences(len(sentences), options.window, options.overlap)
        index = ContextIndex(context, sentences, passage_map(sample))
        judge = ClaimVerifier(session, index, sample.question, options.ungrounded, answer=sample.answer)
        if decomposition is None:
            decomposition = await self._decompose(session, sample, answer_sentences, cited)
        report = AuditRecord(
            id=sample.id,
            line=0,
            context_sentences=len(sentences),
            chunks=len(chunks),
            passages=len(sample.context) if isinstance(sample.context, list) else None,
            errors=list(decomposition.errors),
            decomposition=decomposition.stats,
        )
        if decomposition.nothing_to_check:
            report.label, report.hallucinated = Label.BASELESS, True
            return report
        if not decomposition.claims:
            # Nothing verified is not "all entailed": an answer whose claims could not be drawn (or
            # that a decomposer was talked into finding none in) stays open.
            report.errors.append("no claim to verify: the decomposer found none in the answer")
            report.incomplete = True
            return report
        if admit_claims is not None:
            admit_claims(len(decomposition.claims))
        run_global = options.global_verification and not (options.global_auto and len(chunks) == 1)
        report.global_stage = (
            "full" if run_global else "off" if not options.global_verification else "skipped: one chunk"
        )
        verdicts = await verify_claims(judge, decomposition.claims, chunks, options, run_global)
        if (threshold := self.backend.capabilities.claim_threshold) is not None:
            # A calibrated profile's point acts on the final verdicts, where rt4 calibrate measured it.
            settle_at_threshold(verdicts, threshold, self.backend.name)
        settle_earlier_turns(verdicts, sample.earlier_turns)
        labels = [v.label for v in verdicts]
        report.label = and_join(labels)
        report.hallucinated = answer_hallucinated(labels)
        report.incomplete = None in labels
        if cited is not None:
            report.citations = await audit_citations(judge, cited, verdicts, options.batch_claims)
        report.claims = verdicts
        report.spans = hallucinated_spans(verdicts)
        return report

    async def run(self, items: Iterable[InputLine]) -> AsyncIterator[AuditRecord]:
        """Audit input lines concurrently; yield one report per line, in input order."""
        ledger = self.backend.ledger if isinstance(self.backend, JudgeStack) else None
        admission = SampleAdmission(ledger)
        async for report in in_input_order(items, self._report, self.options.samples_in_flight, admission):
            yield report

    async def audit(self, items: Iterable[InputLine]) -> AsyncIterator[AuditRecord | BudgetStop | UnavailableStop]:
        """The local engine (:class:`AuditEngine`): :meth:`run`, its stop yielded as a value."""
        try:
            async for report in self.run(items):
                yield report
        except (BudgetExhausted, JudgeUnavailable) as error:
            yield stop_of(error)

    async def _report(self, item: InputLine) -> AuditRecord:
        if self.tracing is not None:
            return await self.tracing.sample(item, self._audit_line)
        return await self._audit_line(item)

    async def _audit_line(self, item: InputLine) -> AuditRecord:
        if item.sample is None:
            return error_report(item)
        return await self.verify_sample(item.sample, item.line)


class PipelineBound:
    """An engine whose calls are made elsewhere (Ray workers, a comparison's shared claims) but whose
    records are bound, for ``--resume``, to the judge, prompts and options of its ``pipeline``."""

    pipeline: Pipeline

    @property
    def judge_name(self) -> str:
        return self.pipeline.judge_name

    @property
    def prompt_version(self) -> str:
        return self.pipeline.prompt_version

    @property
    def options(self) -> AuditOptions:
        return self.pipeline.options

    @property
    def records(self) -> RecordKind[AuditRecord]:
        return AUDIT_RECORDS


@dataclass
class AuditResult:
    """How a batch audit ended."""

    written: int = 0
    """Records written by this run."""
    resumed: int = 0
    """Records kept from an earlier run (``--resume``)."""
    reused: int = 0
    """Records taken from the baseline audit without a judge call (``--baseline``)."""
    remaining: int = 0
    """Input lines the run did not audit because it stopped (by the budget: left without a record;
    the judge unavailable: given a ``not audited`` record)."""
    stop: BudgetStop | UnavailableStop | None = None
    """Why the run stopped before its last line; ``None`` when it did not."""

    @property
    def stopped_by_budget(self) -> bool:
        """True when a call was refused by the budget."""
        return isinstance(self.stop, BudgetStop)

    @property
    def judge_unavailable(self) -> str | None:
        """Why the run stopped when the judge's circuit opened (endpoint and last error)."""
        return str(self.stop) if isinstance(self.stop, UnavailableStop) else None


async def run_audit(
    engine: AuditEngine[R],
    items: Iterable[InputLine],
    out: Path | None,
    on_report: Callable[[R], None],
    *,
    resume: bool = False,
    stdout: TextIO | None = None,
    enrich: Callable[[R], R] | None = None,
    baseline: Path | None = None,
) -> AuditResult:
    """Run ``items`` through ``engine`` into ``out`` (or ``stdout``), one record per line, in input
    order: the one batch runner of ``rt4 verify``, ``rt4 eval``, ``rt4 compare`` and ``rt4 repair``.

    With ``baseline`` (another audit's records, ``rt4 verify --baseline``), a line whose content
    and audit configuration are those of a finished baseline record takes that record without a
    judge call (:func:`rt4chart.records.io.read_reusable`): a CI runner with an empty cache re-judges only
    what changed.

    ``enrich`` (white-box signals, :mod:`rt4chart.runs.run`) turns each audited record into the one
    written, before it is written: what is published is already complete.

    With ``resume``, records already finished in ``out`` for the same input line content and
    audit configuration are kept and their inputs skipped. When the budget refuses a call, every
    record finished before it is written completely, nothing half-done is, and the result says
    how many inputs remain. When the judge's circuit opens (it cannot be reached, or refuses every
    call), every input line still gets its record: the lines not audited get ``label: null``,
    ``incomplete: true`` and the reason, and ``--resume`` audits them again. The file ends in input
    order. ``out`` is written through a symlink to its target, under its advisory lock
    (:func:`rt4chart.records.io.output_lock`; a second run on the same file raises
    :class:`rt4chart.records.io.OutputError`).
    """
    target = resolve_output(out) if out is not None else None
    with output_lock(target):
        return await _audit(
            engine, items, target, on_report, resume=resume, stdout=stdout, enrich=enrich, baseline=baseline
        )


async def _audit(
    engine: AuditEngine[R],
    items: Iterable[InputLine],
    out: Path | None,
    on_report: Callable[[R], None],
    *,
    resume: bool,
    stdout: TextIO | None,
    enrich: Callable[[R], R] | None,
    baseline: Path | None,
) -> AuditResult:
    result = AuditResult()
    kind = engine.records
    fingerprint = audit_fingerprint(engine.judge_name, engine.prompt_version, engine.options)
    completed = read_kept(kind, out, items, fingerprint) if resume and out else {}
    if out is not None:
        # Rewriting first drops a torn tail or foreign records before anything is appended.
        write_reports_atomically(out, [completed[line] for line in sorted(completed)])
    result.resumed = len(completed)
    for report in completed.values():
        on_report(report)
    kept = set(completed)  # the resumed records are in the file now: only their lines are held
    del completed
    unfinished: Iterable[InputLine] = (item for item in items if item.line not in kept)
    reused: dict[int, R] = {}
    if baseline is not None:
        unfinished = list(unfinished)
        reused = read_reusable(kind, baseline, unfinished, fingerprint)
    result.reused = len(reused)
    reuse_order = deque(sorted(reused))
    # Items stream through: each is held from when the engine takes it until its record is written.
    todo = (item for item in unfinished if item.line not in reused)
    handed: deque[InputLine] = deque()

    def hand_over() -> Iterator[InputLine]:
        for item in todo:
            handed.append(item)
            yield item

    appender = ReportAppender(out) if out is not None else None

    def write(report: R) -> None:
        if appender is not None:
            appender.append(report)
        elif stdout is not None:
            stdout.write(dump_report(report) + "\n")
            stdout.flush()
        on_report(report)

    def write_reused(before_line: int | None) -> None:
        # Baseline records go out between the audited ones, so the output stays in input order.
        while reuse_order and (before_line is None or reuse_order[0] < before_line):
            report = reused[reuse_order.popleft()]
            write(enrich(report) if enrich is not None else report)

    def emit(item: InputLine, report: R) -> None:
        write_reused(item.line)
        # The record is bound to its line's content and this audit's configuration (for --resume).
        report.input_hash = record_key(item, fingerprint)
        result.written += 1
        write(report)

    try:
        async for audited in engine.audit(hand_over()):
            if isinstance(audited, BudgetStop | UnavailableStop):
                result.stop = audited
                for item in itertools.chain(handed, todo):  # the lines taken but not finished, then the rest
                    result.remaining += 1
                    if isinstance(audited, UnavailableStop):
                        emit(item, kind.unaudited(item, str(audited)))
                break
            emit(handed.popleft(), enrich(audited) if enrich is not None else audited)
        write_reused(None)
    finally:
        if appender is not None:
            appender.close()
    if out is not None and result.resumed:
        _restore_input_order(kind, out, items)
    return result


def _restore_input_order(kind: RecordKind[R], out: Path, items: Iterable[InputLine]) -> None:
    records = read_kept(kind, out, items)
    lines = [report.line for report in records.values()]
    if lines != sorted(lines):
        write_reports_atomically(out, [records[line] for line in sorted(records)])
