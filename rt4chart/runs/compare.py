"""``rt4 compare``: several judges verify one claim set, so their claim verdicts are comparable.

Each answer is decomposed once (:func:`decompose_once`, through the pipeline's own decomposition
front: by the ``--decompose-with`` judge as ``--decomposer`` says, else by the rule decomposer),
and every judge verifies exactly those claims through its own :class:`SharedClaimsEngine`, which
:func:`acompare` drives like any other engine (:func:`rt4chart.runs.engine.run_audit`): one output
file per judge, in input order, one record per input line, the same stop policy as ``rt4 verify``;
ready for ``rt4 agree --level claim`` (which then aligns claims one to one). Its outcome is the one
:class:`~rt4chart.runs.run.RunOutcome`, a :class:`Comparison` its payload.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rt4chart.analysis.agreement import (
    AgreementInputError,
    AgreementReport,
    agreement_report,
    answer_table,
    claim_table,
    gold_column,
    read_outputs,
)
from rt4chart.judges.budget import Ledger
from rt4chart.judges.cache import JudgeCache
from rt4chart.judges.registry import JudgeStack
from rt4chart.method.decompose import Decomposition
from rt4chart.options import AuditOptions
from rt4chart.protocol import BudgetExhausted, JudgeUnavailable
from rt4chart.records.io import InputLine, OutputError, error_report, guard_outputs
from rt4chart.records.manifest import RunCounts
from rt4chart.report.progress import RunSummary
from rt4chart.runs.engine import (
    AuditEngine,
    AuditResult,
    BudgetStop,
    Pipeline,
    PipelineBound,
    UnavailableStop,
    in_input_order,
    run_audit,
    stop_of,
)
from rt4chart.runs.run import (
    RunObserver,
    RunOutcome,
    RunStatus,
    RunUsageError,
    Stop,
    build_stack,
    command_tracing,
    input_lines,
    outcome_of,
)
from rt4chart.runs.spec import RunSpec
from rt4chart.runs.telemetry import RunTracing
from rt4chart.types import AuditRecord, Sample, Usage


def output_name(judge: str) -> str:
    """A file name for a judge's outputs (its name with path-hostile characters replaced)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", judge).strip("-") + ".jsonl"


async def decompose_once(items: list[InputLine], decomposer: Pipeline) -> dict[int, Decomposition]:
    """Every valid sample's claims, by input line, drawn once by ``decomposer``'s front
    (:meth:`~rt4chart.runs.engine.Pipeline.draw_claims`, ``samples_in_flight`` at a time); raises the
    decomposer's stop (:class:`~rt4chart.protocol.BudgetExhausted`,
    :class:`~rt4chart.protocol.JudgeUnavailable`)."""
    slots = asyncio.Semaphore(decomposer.options.samples_in_flight)
    valid = [item for item in items if item.sample is not None]

    async def one(sample: Sample) -> Decomposition:
        async with slots:
            return await decomposer.draw_claims(sample)

    drawn = await asyncio.gather(*(one(item.sample) for item in valid if item.sample is not None))
    return {item.line: decomposition for item, decomposition in zip(valid, drawn, strict=True)}


@dataclass
class SharedClaimsEngine(PipelineBound):
    """An :class:`~rt4chart.runs.engine.AuditEngine` that verifies the claims drawn once per answer
    (:func:`decompose_once`) with one judge's pipeline: every judge of a comparison judges the same
    claims, so their claim verdicts align one to one."""

    pipeline: Pipeline
    """The judge's pipeline (its judge stays the caller's)."""
    shared: Mapping[int, Decomposition]
    """The claims of each valid input line."""
    stop: BudgetStop | UnavailableStop | None = None
    """Why the claims could not be drawn (the decomposer stopped): the engine stops at once."""

    async def audit(self, items: Iterable[InputLine]) -> AsyncIterator[AuditRecord | BudgetStop | UnavailableStop]:
        if self.stop is not None:
            yield self.stop
            return
        try:
            async for report in in_input_order(items, self._report, self.options.samples_in_flight):
                yield report
        except (BudgetExhausted, JudgeUnavailable) as error:
            yield stop_of(error)

    async def _report(self, item: InputLine) -> AuditRecord:
        if self.pipeline.tracing is not None:
            return await self.pipeline.tracing.sample(item, self._verify)
        return await self._verify(item)

    async def _verify(self, item: InputLine) -> AuditRecord:
        if item.sample is None:
            return error_report(item)
        return await self.pipeline.verify_sample(item.sample, item.line, self.shared[item.line])


def _stack_cache(spec: RunSpec) -> JudgeCache | None:
    """One cache opened for several stacks of a run (closed by the run), or ``None``."""
    from rt4chart.judges.cache import CacheError, open_cache

    if spec.cache is None:
        return None
    try:
        return open_cache(spec.cache)
    except CacheError as error:
        raise RunUsageError(str(error)) from None


class Comparison(BaseModel):
    """What ``rt4 compare`` produced (the payload of its :class:`~rt4chart.runs.run.RunOutcome`): one
    outcome per judge, their files and, when every judge finished, the agreement between them."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    by_judge: list[RunOutcome[None]]
    """Each judge's run, in ``--judges`` order."""
    paths: list[Path]
    """Each judge's output file, in the same order."""
    agreement: list[AgreementReport] = Field(default_factory=list)
    """Answer- and claim-level agreement (answer level first); empty when a run stopped or left
    verdicts open."""


def _total(counts: Sequence[RunCounts]) -> RunCounts:
    """Several runs' tallies added up (citation figures left out): a comparison's status is
    :func:`~rt4chart.runs.run.status_of` this total, so the first of 3, 2, 4 that applies to any judge."""
    added = {
        name: sum(getattr(tally, name) for tally in counts)
        for name, field in RunCounts.model_fields.items()
        if field.annotation is int
    }
    labels = sum((Counter(tally.labels) for tally in counts), Counter[str]())
    claims = sum((Counter(tally.claims) for tally in counts), Counter[str]())
    return RunCounts(labels=dict(labels), claims=dict(claims), **added)


def _first_stop(stops: Sequence[Stop | None]) -> Stop | None:
    """Of several runs' stops, the one that decides their status: a budget stop (exit 3) before an
    unreachable judge (exit 4)."""
    stopped = [stop for stop in stops if stop is not None]
    return next((stop for stop in stopped if isinstance(stop, BudgetStop)), stopped[0] if stopped else None)


async def acompare(
    spec: RunSpec,
    judges: Sequence[str],
    samples: Iterable[Sample | Mapping[str, Any] | InputLine],
    out_dir: Path,
    *,
    decompose_with: str | None = None,
    resamples: int = 1000,
    seed: int = 0,
    observer: RunObserver | None = None,
) -> RunOutcome[Comparison]:
    """``rt4 compare``: decompose each answer once (``decompose_with``, else by rules), have every
    judge verify those claims through the run's stop policy, one file per judge in ``out_dir``.

    ``spec.judge`` is not used (``judges`` are the judges); its api base, limits, cache and options
    apply to every judge. Raises :class:`RunUsageError` before any judge call when it cannot start.
    Traced (an OTLP endpoint in the environment): a ``rt4chart.compare`` span, the decomposer's calls
    and one ``rt4chart.run`` span per judge as its children, that judge's sample spans under it.
    """
    async with command_tracing() as tracing:
        if tracing is None:
            return await _compare(spec, judges, samples, out_dir, decompose_with, resamples, seed, observer, None)
        with tracing.span("rt4chart.compare", {"rt4chart.command": "compare"}) as span:
            outcome = await _compare(spec, judges, samples, out_dir, decompose_with, resamples, seed, observer,
                                     tracing)
            # One ledger for every judge: each judge's run usage is the comparison's.
            usage = outcome.payload.by_judge[0].summary.run_usage or Usage()
            tracing.end_run(span, outcome.judge, outcome.counts, usage, outcome.status.value, outcome.reason)
            return outcome


async def _compare(
    spec: RunSpec, judges: Sequence[str], samples: Iterable[Sample | Mapping[str, Any] | InputLine], out_dir: Path,
    decompose_with: str | None, resamples: int, seed: int, observer: RunObserver | None, tracing: RunTracing | None,
) -> RunOutcome[Comparison]:
    items = input_lines(samples)
    if len(judges) < 2 or len(set(judges)) != len(judges):
        raise RunUsageError(f"--judges needs at least two different judges (got {','.join(judges)!r})")
    ledger = Ledger(limit_usd=spec.limits.budget_usd)
    cache = _stack_cache(spec)  # shared by every judge; closed here
    stacks: list[JudgeStack] = []
    try:
        for name in [*judges, *([decompose_with] if decompose_with else [])]:
            stacks.append(build_stack(name, api_base=spec.api_base, limits=spec.limits, cache=cache, ledger=ledger,
                                      out=out_dir / "compare"))
            if tracing is not None:
                stacks[-1].inner = tracing.traced(stacks[-1].inner)
        judging = stacks[: len(judges)]
        decomposer = _decomposer(spec.options, stacks[len(judges)] if decompose_with else None, judging[0])
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RunUsageError(f"--out-dir {out_dir}: {error.strerror}") from None
        try:
            requested = {f"--out-dir file of {stack.name}": out_dir / output_name(stack.name) for stack in judging}
            paths = list(guard_outputs(requested, [spec.input_file]).values())
        except OutputError as error:
            raise RunUsageError(str(error)) from None
        if observer is not None:
            observer.start(len(items) * len(judging), ledger, calls_seen=True)
        try:
            shared = await decompose_once(items, decomposer)
            decomposer_stop = None
        except (BudgetExhausted, JudgeUnavailable) as error:
            shared, decomposer_stop = {}, stop_of(error)
        engines = [SharedClaimsEngine(Pipeline(stack, spec.options, tracing=tracing), shared, decomposer_stop)
                   for stack in judging]
        runs = await asyncio.gather(*(_run_engine(engine, items, path, observer, tracing, ledger)
                                      for engine, path in zip(engines, paths, strict=True)))
    finally:
        if observer is not None:
            observer.finish()
        for stack in stacks:
            await stack.aclose()
        if cache is not None:
            cache.close()
    by_judge = [
        outcome_of(reports, result, summary, False, ledger, engine.judge_name)
        for engine, (reports, result, summary) in zip(engines, runs, strict=True)
    ]
    outcome = RunOutcome(
        payload=Comparison(by_judge=by_judge, paths=paths), counts=_total([judged.counts for judged in by_judge]),
        stop=_first_stop([judged.stop for judged in by_judge]), judge=",".join(judges),
        spent_usd=ledger.spent_usd, budget_usd=ledger.limit_usd,
    )
    if outcome.status in (RunStatus.PASSED, RunStatus.FAILED, RunStatus.INVALID_INPUT):
        outcome.payload.agreement = _agreement(paths, resamples, seed)
    # The reason of the first judge whose run ended as the comparison did; a comparison that passes
    # passes whatever the verdicts (it measures the judges, it does not gate the answers).
    ended_alike = (judged.reason for judged in by_judge if judged.status is outcome.status)
    outcome.reason = next(
        ended_alike if outcome.status is not RunStatus.PASSED else iter(()),
        f"passed: {len(by_judge)} judges verified the same claims of {by_judge[0].counts.records} answers "
        "(rt4 compare measures the judges; their verdicts do not decide its exit code)",
    )
    return outcome


def _decomposer(options: AuditOptions, decompose_with: JudgeStack | None, first_judge: JudgeStack) -> Pipeline:
    """The pipeline whose decomposition front draws a comparison's claims: ``--decompose-with``'s
    judge, as ``--decomposer`` says; without one, the rule decomposer (no judge is asked)."""
    if decompose_with is None:
        if options.decomposer in ("judge", "holistic"):
            raise RunUsageError(f"--decomposer {options.decomposer} needs --decompose-with JUDGE: the judge "
                                "that writes every answer's claims once")
        return Pipeline(first_judge, options.model_copy(update={"decomposer": "rules"}))
    if not decompose_with.capabilities.can_write_text:
        raise RunUsageError(f"--decompose-with {decompose_with.name}: this judge cannot decompose answers")
    return Pipeline(decompose_with, options)


async def _run_engine(
    engine: AuditEngine[AuditRecord], items: list[InputLine], out: Path | None, observer: RunObserver | None,
    tracing: RunTracing | None, ledger: Ledger,
) -> tuple[list[AuditRecord], AuditResult, RunSummary]:
    """One engine through :func:`run_audit` (no resume, no stdout), its records and totals collected;
    traced, inside a ``rt4chart.run`` span of its judge's tally (its usage: its records')."""
    summary = RunSummary()
    reports: list[AuditRecord] = []

    def on_report(report: AuditRecord) -> None:
        summary.add(report)
        reports.append(report)
        if observer is not None:
            observer.record(report, summary)

    with tracing.run_span("compare") if tracing is not None else contextlib.nullcontext() as span:
        try:
            result = await run_audit(engine, items, out, on_report)
        except OutputError as error:  # another run holds the output's lock
            raise RunUsageError(str(error)) from None
        if tracing is not None and span is not None:
            judged = outcome_of(reports, result, summary, False, ledger, engine.judge_name)
            usage = sum((report.usage for report in reports), Usage())
            tracing.end_run(span, engine.judge_name, judged.counts, usage, judged.status.value, judged.reason)
    reports.sort(key=lambda report: report.line)
    return reports, result, summary


def _agreement(paths: list[Path], resamples: int, seed: int) -> list[AgreementReport]:
    """Answer- and claim-level agreement between the judges' output files (``rt4 agree``'s figures)."""
    try:
        loaded = read_outputs(paths)
        gold_labels = gold_column(loaded[0][1], None)
    except AgreementInputError as error:
        raise RunUsageError(str(error)) from None
    return [
        agreement_report(build(loaded, gold_labels, "hallucinated"), resamples=resamples, seed=seed)
        for build in (answer_table, claim_table)
    ]
