"""``rt4 repair`` as an engine of the one run path.

Each verify record is an input line of the repair run (:func:`repair_items`: its position in the
verify file, the sample it audits, a digest of both), and :class:`RepairEngine` repairs them
through the repairing judge, ``samples_in_flight`` at a time, in input order, its stop (the budget,
the judge unavailable) a value. :func:`arepair` drives it with :func:`rt4chart.runs.engine.run_audit`,
as the run layer drives the audit engines: records streamed to the output under its lock, one per
verify record, ``--resume`` keeping the finished ones. Its outcome is the one
:class:`~rt4chart.runs.run.RunOutcome`, :class:`Repairs` its payload.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from rt4chart.judges.budget import Ledger, SampleAdmission
from rt4chart.method.repair import (
    Repairer,
    RepairRecord,
    RepairStrategy,
    RepairSummary,
    record_reaudit,
    repaired_samples,
    summarize,
)
from rt4chart.method.tasks import load_prompts, prompt_set_version
from rt4chart.protocol import BudgetExhausted, GenerationParams, JudgeUnavailable
from rt4chart.records.io import InputLine, OutputError, RecordKind, dump_report, write_reports_atomically
from rt4chart.records.manifest import RunCounts
from rt4chart.report.outputs import PublishOptions
from rt4chart.runs.engine import BudgetStop, UnavailableStop, in_input_order, run_audit, stop_of
from rt4chart.runs.run import (
    RunOutcome,
    RunStatus,
    RunUsageError,
    aexecute,
    build_stack,
    command_tracing,
    input_lines,
)
from rt4chart.runs.spec import RunSpec
from rt4chart.runs.telemetry import RunTracing
from rt4chart.types import AuditRecord, Sample, Usage

if TYPE_CHECKING:
    from typing import TextIO


class RepairSettings(BaseModel):
    """What a repair record is bound to for ``--resume``, besides the repairing judge and its prompts."""

    model_config = ConfigDict(frozen=True)

    strategy: RepairStrategy
    """remove, extract or rewrite."""
    params: GenerationParams
    """The repairing judge's generation parameters."""


def repair_items(
    records: Sequence[AuditRecord | str], samples: Iterable[InputLine], input_name: str
) -> tuple[list[InputLine], dict[int, AuditRecord]]:
    """The input lines of a repair run, one per verify record (numbered by its position in the
    verify file), and the verify record of each line that has its sample. A record that is not one,
    or whose sample is missing, is an invalid line (its repair record says why). A line's digest
    binds the verify record and the sample's input line together (``--resume``)."""
    by_line = {item.line: item for item in samples}
    items: list[InputLine] = []
    verified: dict[int, AuditRecord] = {}
    for position, record in enumerate(records, start=1):
        if isinstance(record, str):
            items.append(InputLine(position, None, record))
            continue
        item = by_line.get(record.line)
        if item is None or item.sample is None or item.sample.id != record.id:
            problem = f"no valid sample with id {record.id!r} on line {record.line} of {input_name}"
            items.append(InputLine(position, None, problem, raw_id=record.id))
            continue
        digest = None
        if item.digest is not None:
            digest = hashlib.sha256(f"{record.model_dump_json()}:{item.digest}".encode()).hexdigest()
        items.append(InputLine(position, item.sample, raw_id=record.id, digest=digest))
        verified[position] = record
    return items, verified


def repair_records(strategy: RepairStrategy) -> RecordKind[RepairRecord]:
    """How the batch runner reads repair records: finished when repaired without an error."""

    def unrepaired(item: InputLine, stop: str) -> RepairRecord:
        record_id = item.sample.id if item.sample is not None else item.raw_id
        return RepairRecord(id=record_id, line=item.line, strategy=strategy, original=None, repaired=None,
                            errors=[f"not repaired: {stop}"])

    return RecordKind(
        RepairRecord.model_validate, lambda record: record.repaired is not None and not record.errors, unrepaired
    )


@dataclass
class RepairEngine:
    """An :class:`~rt4chart.runs.engine.AuditEngine` of repair records: each verify record's answer
    repaired by ``repairer``, ``samples_in_flight`` at a time (fewer when the budget says so), in
    input order."""

    repairer: Repairer
    """The strategy and its repairing judge (which stays the caller's)."""
    verified: Mapping[int, AuditRecord]
    """The verify record of each valid input line (:func:`repair_items`)."""
    samples_in_flight: int
    """Answers repaired at once."""
    ledger: Ledger | None = None
    """The repairing judge's ledger (its budget admits samples); ``None`` without a judge."""
    tracing: RunTracing | None = None
    """The run's OpenTelemetry tracing, when configured: a span per line (:mod:`rt4chart.runs.telemetry`)."""

    @property
    def judge_name(self) -> str:
        return self.repairer.backend.name if self.repairer.backend is not None else ""

    @property
    def prompt_version(self) -> str:
        return prompt_set_version(load_prompts()) if self.repairer.backend is not None else ""

    @property
    def options(self) -> RepairSettings:
        return RepairSettings(strategy=self.repairer.strategy, params=self.repairer.params)

    @property
    def records(self) -> RecordKind[RepairRecord]:
        return repair_records(self.repairer.strategy)

    async def audit(self, items: Iterable[InputLine]) -> AsyncIterator[RepairRecord | BudgetStop | UnavailableStop]:
        try:
            admission = SampleAdmission(self.ledger)
            async for record in in_input_order(items, self._repair, self.samples_in_flight, admission):
                yield record
        except (BudgetExhausted, JudgeUnavailable) as error:
            yield stop_of(error)

    async def _repair(self, item: InputLine) -> RepairRecord:
        if self.tracing is not None:
            return await self.tracing.repair(item, self._repair_line)
        return await self._repair_line(item)

    async def _repair_line(self, item: InputLine) -> RepairRecord:
        if item.sample is None:
            return RepairRecord(id=item.raw_id, line=item.line, strategy=self.repairer.strategy, original=None,
                                repaired=None, errors=[item.error or "invalid input"])
        record = await self.repairer.repair(self.verified[item.line], item.sample)
        record.line = item.line  # the verify record's position in its file
        return record


class Repairs(BaseModel):
    """What ``rt4 repair`` produced (the payload of its :class:`~rt4chart.runs.run.RunOutcome`): the
    repair records, their summary, and the re-audit of the repaired answers."""

    records: list[RepairRecord]
    """One per verify record, in their order."""
    summary: RepairSummary
    """Retention and residual hallucination over the records."""
    reaudit: RunOutcome[None] | None = None
    """The re-audit of the repaired answers (``--verify-after``)."""


async def arepair(
    spec: RunSpec,
    records: Sequence[AuditRecord | str],
    samples: Iterable[Sample | Mapping[str, Any] | InputLine],
    strategy: RepairStrategy,
    *,
    input_name: str = "the input",
    verify_after: bool = False,
    verify_judge: str | None = None,
    stdout: TextIO | None = None,
) -> RunOutcome[Repairs]:
    """``rt4 repair``: repair the flagged answers of ``records`` (verify records, or why a line is
    not one) against their ``samples`` with ``spec.judge`` (``None``: no repairing judge), through
    the one batch runner (:func:`rt4chart.runs.engine.run_audit` over a
    :class:`RepairEngine`): one repair record per verify record, in their
    order, ``spec.options.samples_in_flight`` at a time, into ``spec.out`` (else ``stdout``), a
    killed run resumed with ``spec.resume``. With ``verify_after``, the repaired answers are then
    re-audited as a run of their own (:func:`rt4chart.runs.run.aexecute`) with ``verify_judge`` (default:
    ``spec.judge``, else the embedded verifier), and the records rewritten with their re-audits.
    Traced (an OTLP endpoint in the environment): a ``rt4chart.run`` span (``rt4chart.command`` repair),
    a ``rt4chart.sample`` span per line with its repair's outcome, the repairing judge's calls under it, and
    the re-audit's own ``rt4chart.run`` as the repair run's child."""
    async with command_tracing() as tracing:
        if tracing is None:
            return await _repair(spec, records, samples, strategy, input_name, verify_after, verify_judge, stdout,
                                 None)
        with tracing.run_span("repair") as span:
            outcome = await _repair(spec, records, samples, strategy, input_name, verify_after, verify_judge,
                                    stdout, tracing)
            usage = sum((record.usage for record in outcome.payload.records), Usage())
            tracing.end_run(span, outcome.judge, outcome.counts, usage, outcome.status.value, outcome.reason)
            return outcome


def reaudit_records(out: Path) -> Path:
    """Where ``--verify-after`` keeps the re-audit's own records: ``OUT.verify-after.jsonl`` beside ``--out``."""
    return out.with_name(out.name + ".verify-after.jsonl")


async def _repair(
    spec: RunSpec, records: Sequence[AuditRecord | str], samples: Iterable[Sample | Mapping[str, Any] | InputLine],
    strategy: RepairStrategy, input_name: str, verify_after: bool, verify_judge: str | None, stdout: TextIO | None,
    tracing: RunTracing | None,
) -> RunOutcome[Repairs]:
    if strategy == "rewrite" and spec.judge is None:
        raise RunUsageError("--strategy rewrite needs --judge: a judge that writes text")
    if spec.resume and spec.out is None:
        raise RunUsageError("--resume needs --out FILE")
    items, verified = repair_items(records, input_lines(samples), input_name)
    repairing = (
        build_stack(spec.judge, api_base=spec.api_base, limits=spec.limits, cache=spec.cache, out=spec.out,
                    resume=spec.resume)
        if spec.judge else None
    )
    if repairing is not None and tracing is not None:
        repairing.inner = tracing.traced(repairing.inner)
    finished: list[RepairRecord] = []
    try:
        if repairing is not None and not repairing.capabilities.can_write_text:
            raise RunUsageError(
                f"judge {repairing.name} cannot write text; repair needs a language-model or scripted judge"
            )
        engine = RepairEngine(Repairer(strategy, repairing, spec.options.params), verified,
                              spec.options.samples_in_flight, repairing.ledger if repairing is not None else None,
                              tracing)
        try:
            # With a re-audit to come, stdout gets the records once they hold it.
            result = await run_audit(engine, items, spec.out, finished.append, resume=spec.resume,
                                     stdout=None if verify_after else stdout)
        except OutputError as error:  # another run holds the output's lock
            raise RunUsageError(str(error)) from None
    finally:
        if repairing is not None:
            await repairing.aclose()
    finished.sort(key=lambda record: record.line)
    stop = result.stop
    reaudit = None
    if verify_after and stop is None:
        valid = {item.line: item.sample for item in items if item.sample is not None}
        todo = repaired_samples(finished, valid)
        # --api-base belongs to --judge; a separate --verify-judge is resolved on its own.
        # The re-audit keeps its own records beside --out (OUT.verify-after.jsonl), so a killed run resumes it as
        # any audit resumes: its finished records kept, its batch journal polled (nothing paid twice).
        reaudit_out = None if spec.out is None else reaudit_records(spec.out)
        rejudge = spec.model_copy(update={
            "judge": spec.judge if verify_judge is None else verify_judge,
            "api_base": spec.api_base if verify_judge is None else None,
            "out": reaudit_out, "resume": spec.resume and reaudit_out is not None and reaudit_out.exists(),
            "outputs": PublishOptions(), "signals": None, "input_file": None,
        })
        reaudit = await aexecute(rejudge, [sample for _, sample in todo])
        for (repaired, _), after in zip(todo, reaudit.reports, strict=True):
            record_reaudit(repaired, after)
        stop = reaudit.stop
        if spec.out is not None:
            write_reports_atomically(spec.out, finished)
    if verify_after and spec.out is None and stdout is not None:
        stdout.writelines(dump_report(record) + "\n" for record in finished)
    summary = summarize(strategy, finished)
    counts = RunCounts(
        records=len(finished), written=result.written, resumed=result.resumed, remaining=result.remaining,
        # Records a stop left unrepaired are not bad input: with a stop, the stop decides (3 or 4).
        invalid=summary.invalid if stop is None else 0,
        incomplete=reaudit.counts.incomplete if reaudit is not None else 0,
    )
    outcome = RunOutcome(
        payload=Repairs(records=finished, summary=summary, reaudit=reaudit), counts=counts,
        fails=summary.residual_hallucinated > 0, stop=stop, judge=engine.judge_name,
        prompt_version=engine.prompt_version,
    )
    outcome.reason = _repair_reason(outcome)
    return outcome


def _repair_reason(outcome: RunOutcome[Repairs]) -> str:
    """Why a repair run ended as it did, in the one line the CLI prints last."""
    summary, reaudit = outcome.payload.summary, outcome.payload.reaudit
    settled = outcome.status in (RunStatus.PASSED, RunStatus.FAILED)
    if reaudit is not None and reaudit.status is outcome.status and not settled:
        return reaudit.reason  # the re-audit stopped or left verdicts open: its own line says why
    if outcome.stop is not None:
        return f"stopped: {outcome.stop}; {outcome.counts.remaining} records not repaired"
    if outcome.status is RunStatus.INVALID_INPUT:
        return f"invalid input: {summary.invalid} of {summary.answers} records could not be repaired (errors above)"
    if outcome.fails:
        return f"failed: {summary.residual_hallucinated} of {summary.reverified} repaired answers still hallucinated"
    if summary.reverified:
        return f"passed: none of the {summary.reverified} re-audited repairs is hallucinated"
    return f"passed: {summary.answers - summary.invalid} answers repaired (not re-audited: --verify-after audits them)"

