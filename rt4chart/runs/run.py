"""The run layer: a run of an audit declared once (:class:`RunSpec`) and executed by every entry point.

``rt4 verify`` and :func:`rt4chart.verify` / :func:`rt4chart.averify` run :func:`aexecute`, as do the
audits inside ``rt4 eval`` (:func:`rt4chart.runs.evaluation.aevaluate`) and ``rt4 repair
--verify-after`` (:func:`rt4chart.runs.repair.arepair`); ``rt4 compare``
(:func:`rt4chart.runs.compare.acompare`) drives its engines with the same helpers. A run builds its
judge stack, its engine (local or Ray, :class:`rt4chart.runs.engine.AuditEngine`), audits through the
one batch runner with the stop policy (:func:`rt4chart.runs.engine.run_audit`: budget stop, judge
unavailable, resume, the output's lock), enriches each record with white-box signals before it is
written, and publishes what the run asked for.

Every run, of every command, returns the one :class:`RunOutcome` (what the command produced is its
payload), whose status :func:`status_of` decides from its counts, stop and decision
(:func:`policy_fails`); :func:`exit_code` is the one map from a status to the documented exit code
(README "Exit codes": of 3, 2, 4, 1 the first that applies wins). :func:`run_sync` is the one
synchronous entry of every run's coroutine.

Hook points for what a run does besides auditing: :func:`rt4chart.report.outputs.publish` (every
output a finished run writes besides its records) and :func:`outcome_of` (how an audit's records and
stop become its outcome). A run that cannot start (unknown judge, unusable cache or output, a missing
extra) raises :class:`RunUsageError` before anything is spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, computed_field
from rich.console import Console

from rt4chart.judges.budget import Ledger, RunLimits
from rt4chart.judges.cache import JudgeCache
from rt4chart.judges.registry import JudgeConfigError, JudgeStack, check_judge_serves
from rt4chart.options import FailOn
from rt4chart.protocol import Backend
from rt4chart.records.io import (
    InputFile,
    InputLine,
    OutputError,
    discards,
    guard_outputs,
    parse_sample,
    read_records,
    write_lines_atomically,
)
from rt4chart.records.manifest import RunCounts, write_manifest
from rt4chart.report.audited import AuditedSample, pair_with_inputs
from rt4chart.report.outputs import PublishOptions, baseline_gate_of, baseline_problem, gates, publish
from rt4chart.report.progress import RunSummary, lines_text
from rt4chart.runs.engine import (
    AuditEngine,
    AuditResult,
    BudgetStop,
    EngineOptions,
    Pipeline,
    UnavailableStop,
    run_audit,
)
from rt4chart.runs.ray_engine import RayUnavailable
from rt4chart.runs.spec import RunSpec, SignalSpec
from rt4chart.runs.telemetry import RunTracing, TelemetryUnavailable, start_tracing
from rt4chart.types import AuditRecord, Sample, Usage

if TYPE_CHECKING:
    from typing import TextIO

    from rt4chart.analysis.diff import GateOutcome


class RunUsageError(ValueError):
    """A run that cannot start as specified (exit 2), found before any judge call."""


class RunStatus(StrEnum):
    """How a run ended, in the order the exit code decides (the first that applies)."""

    CRASHED = "crashed"
    """An unexpected error (a bug): one line and a log of the traceback (:mod:`rt4chart.cli.crash`)."""
    STOPPED_BY_BUDGET = "stopped_by_budget"
    """The budget refused a call; the records finished before it are kept."""
    INVALID_INPUT = "invalid_input"
    """At least one input line is not a valid sample (it got a record with the reason)."""
    JUDGE_UNAVAILABLE = "judge_unavailable"
    """The judge could not be reached or refused every call; the lines not audited got records."""
    INCOMPLETE = "incomplete"
    """Judge errors left at least one verdict open (``label: null``)."""
    FAILED = "failed"
    """The answers fail the run's policy (``--fail-on``, ``--max-rate``)."""
    PASSED = "passed"
    """The answers pass."""


_EXIT_CODES: dict[RunStatus, int] = {
    RunStatus.PASSED: 0,
    RunStatus.FAILED: 1,
    RunStatus.INVALID_INPUT: 2,
    RunStatus.STOPPED_BY_BUDGET: 3,
    RunStatus.JUDGE_UNAVAILABLE: 4,
    RunStatus.INCOMPLETE: 4,
    RunStatus.CRASHED: 5,
}

EXIT_USAGE = _EXIT_CODES[RunStatus.INVALID_INPUT]
"""The exit code of bad input or usage (also of a :class:`RunUsageError`)."""


def exit_code(status: RunStatus) -> int:
    """The documented exit code of a run that ended with ``status`` (README "Exit codes")."""
    return _EXIT_CODES[status]




PayloadT = TypeVar("PayloadT")
"""What a command's run produced besides its tally (:attr:`RunOutcome.payload`)."""

OutcomeT = TypeVar("OutcomeT")
"""What a run's coroutine returns (:func:`run_sync`)."""

Stop = BudgetStop | UnavailableStop
"""Why a run stopped before its last line."""


class RunOutcome(BaseModel, Generic[PayloadT]):
    """How a run of any command ended (``rt4 verify``, ``eval``, ``compare``, ``repair``, ``signals``):
    the tally, the decision and the stop its status is decided from (:func:`status_of`, the one
    place: :attr:`status` is computed, never set), and what the command produced (``payload``)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    payload: PayloadT
    """What the command produced besides its records' tally: ``None`` for ``rt4 verify`` and
    ``rt4 signals``; a :class:`rt4chart.runs.compare.Comparison`, :class:`rt4chart.runs.repair.Repairs`,
    or the :class:`rt4chart.runs.evaluation.EvaluationResult` of ``rt4 eval`` (``None`` when it stopped)."""
    counts: RunCounts
    """The run's tally: the figures the status is decided from."""
    fails: bool = False
    """Whether the answers fail the run's policy (``--fail-on``, ``--max-rate``, a baseline gate):
    :func:`policy_fails` of ``counts``."""
    stop: Stop | None = None
    """Why the run stopped before its last line, if it did."""
    judge: str = ""
    """The judge's name, as records carry it."""
    prompt_version: str = ""
    """The prompt set's version, as records carry it."""
    spent_usd: float = 0.0
    """What the run's judge calls cost."""
    budget_usd: float | None = None
    """The run's cap, if any."""
    reports: list[AuditRecord] = Field(default_factory=list, exclude=True)
    """The run's audit records, in input order; empty when the run streamed them (``keep_records=False``:
    they are in ``out``, and the outcome is built from counters) or wrote no audit records."""
    summary: RunSummary = Field(default_factory=RunSummary, exclude=True)
    """Totals over the records (what the end-of-run table shows)."""
    reason: str = ""
    """Why the run ended as it did, in one line (:func:`reason_of`): what the CLI prints last."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def status(self) -> RunStatus:
        """How the run ended: :func:`status_of` its counts, stop and decision."""
        return status_of(self.counts, self.stop, self.fails)

    @property
    def exit_code(self) -> int:
        """The documented exit code of :attr:`status` (:func:`exit_code`)."""
        return exit_code(self.status)

    @property
    def first_open_error(self) -> str | None:
        """The first error of a record the judge left open (it names the endpoint when the judge
        could not be reached): what says why an incomplete run is incomplete."""
        return self.summary.first_open_error


class RunObserver(Protocol):
    """What follows a run as it goes (the CLI's progress bar): told the ledger first, then each record."""

    def start(self, total: int, ledger: Ledger, calls_seen: bool) -> None: ...

    def record(self, report: AuditRecord, summary: RunSummary) -> None: ...

    def finish(self) -> None: ...


def input_lines(samples: Iterable[Sample | Mapping[str, Any] | InputLine]) -> list[InputLine]:
    """Input lines numbered from 1 out of samples, mappings (validated as an input line is) or lines."""
    lines = []
    for position, sample in enumerate(samples, start=1):
        if isinstance(sample, InputLine):
            lines.append(sample)
        elif isinstance(sample, Sample):
            lines.append(InputLine(position, sample))
        else:
            lines.append(parse_sample(dict(sample), position))
    return lines


def check_engine(engine: EngineOptions) -> None:
    """A :class:`RunUsageError` (before any work) when the run asks for Ray and it cannot be imported."""
    if engine.engine == "ray":
        from rt4chart.runs.ray_engine import RayUnavailable, ray_available

        try:
            ray_available()
        except RayUnavailable as error:
            raise RunUsageError(str(error)) from None


def build_stack(
    judge: str | Backend | None,
    *,
    api_base: str | None = None,
    limits: RunLimits | None = None,
    cache: JudgeCache | Path | str | None = None,
    ledger: Ledger | None = None,
    out: Path | None = None,
    resume: bool = False,
) -> JudgeStack:
    """The run's judge stack (:func:`rt4chart.judges.registry.judge_stack`), or a :class:`RunUsageError`.
    Under ``limits.batch`` its calls go through the Batch API, journaled beside ``out`` (:func:`batch_journal`;
    ``resume``: what the journal holds is polled, not submitted again)."""
    from rt4chart.judges.cache import CacheError
    from rt4chart.judges.registry import JudgeConfigError, judge_stack

    limits = limits or RunLimits()
    batch = None
    if limits.batch:
        from rt4chart.judges.batch import BatchSettings

        poll = {"poll_s": limits.batch_poll_s} if limits.batch_poll_s is not None else {}
        batch = BatchSettings(journal=batch_journal(out), resume=resume, **poll)
    try:
        return judge_stack(
            judge, api_base=api_base, concurrency=limits.concurrency, cache=cache,
            budget_usd=None if ledger is not None else limits.budget_usd, ledger=ledger, timeout_s=limits.timeout_s,
            batch=batch,
        )
    except (JudgeConfigError, CacheError) as error:
        raise RunUsageError(str(error)) from error  # the library API re-raises the cause


def batch_journal(out: Path | None) -> Path | None:
    """Where a batch run journals what it submitted: ``OUT.batches.jsonl`` beside ``--out`` (none
    without a file to resume: stdout, the null device)."""
    if out is None or discards(out):
        return None
    return out.with_name(out.name + ".batches.jsonl")


def _engine(spec: RunSpec, stack: JudgeStack, tracing: RunTracing | None) -> AuditEngine[AuditRecord]:
    try:
        check_judge_serves(stack, spec.options)  # a method the judge cannot serve is a usage error
    except JudgeConfigError as error:
        raise RunUsageError(str(error)) from None
    pipeline = Pipeline(stack, spec.options, tracing=tracing)
    if spec.engine.engine != "ray":
        return pipeline
    if not isinstance(spec.judge, str | None):
        raise RunUsageError("--engine ray rebuilds the judge on every worker: give it as a spec, not a backend")
    from rt4chart.runs.ray_engine import ray_audit_engine

    return ray_audit_engine(
        stack, spec.options, spec.engine, judge=spec.judge, api_base=spec.api_base, limits=spec.limits,
        cache=spec.cache, tracing=tracing,
    )


def _signal_step(spec: SignalSpec, items: Iterable[InputLine]) -> Callable[[AuditRecord], AuditRecord]:
    """Open the signal model, score every valid sample, and return the step that adds a record's
    signals to it; any failure is a :class:`RunUsageError` (nothing of the judge's is spent yet)."""
    from rt4chart.signals import SignalError

    valid = [item for item in items if item.sample is not None]
    samples = [item.sample for item in valid if item.sample is not None]
    lines = [item.line for item in valid]
    try:
        if spec.kind == "attention":
            from rt4chart.signals.aggtruth import attach_attention, open_attention_probe, score_samples
            from rt4chart.signals.attention import FeatureCache

            if spec.probe is None:
                raise RunUsageError("--signals attention needs --signal-probe FILE (from rt4 signals train)")
            if spec.server is not None:
                raise RunUsageError(
                    "--signals attention reads attention maps in process; --signal-server is for csr only"
                )
            setup = open_attention_probe(spec.model, spec.probe)
            cache = FeatureCache() if spec.use_cache else None
            scores = score_samples(samples, setup.extractor, setup.probe, setup.name, cache)
            scored = dict(zip(lines, scores, strict=True))
            return lambda report: attach_attention([report], scored)[0]
        from rt4chart.signals import open_backend
        from rt4chart.signals.csr import SignalCache, attach_signals, compute_csr

        backend = open_backend(spec.model, server=spec.server)
        signal_cache = SignalCache() if spec.use_cache else None
        outcomes = dict(zip(lines, compute_csr(samples, backend, delta=spec.delta, cache=signal_cache), strict=True))
        return lambda report: attach_signals([report], outcomes)[0]
    except SignalError as error:
        raise RunUsageError(f"signals: {error}") from None


def policy_fails(counts: RunCounts, outputs: PublishOptions, gate: GateOutcome | None = None) -> bool:
    """The run's pass/fail decision, the one place it is taken: under ``--fail-on new|worse`` the
    baseline gate's; else whether the share of judged answers failing ``--fail-on`` exceeds
    ``--max-rate`` (0: any one fails the run; ``never``: none does)."""
    if gate is not None and gates(outputs, gate):
        return gate.fails
    if outputs.fail_on is FailOn.NEVER or not counts.judged:
        return False
    return counts.failing / counts.judged > outputs.max_rate


def status_of(counts: RunCounts, stop: Stop | None, fails: bool) -> RunStatus:
    """A run's status from its tally, its stop and its decision: the first of 3, 2, 4, 1 that applies.
    The one place a status is decided: :attr:`RunOutcome.status` of every command's run is this."""
    if isinstance(stop, BudgetStop):
        return RunStatus.STOPPED_BY_BUDGET
    if counts.invalid:
        return RunStatus.INVALID_INPUT
    if isinstance(stop, UnavailableStop):
        return RunStatus.JUDGE_UNAVAILABLE
    if counts.incomplete:
        return RunStatus.INCOMPLETE
    return RunStatus.FAILED if fails else RunStatus.PASSED


def _policy_reason(summary: RunSummary, fails: bool) -> str:
    """Why the answers pass or fail ``--fail-on`` / ``--max-rate``: ``failed: 3 of 4 answers hallucinated
    (75%) > --max-rate 0.50``, the decision of :func:`policy_fails` with the counts it was taken from."""
    if summary.fail_on is FailOn.NEVER:
        return "passed: --fail-on never (the verdicts do not decide the exit code)"
    judged = sum(summary.labels.values())
    if summary.fail_on is None or not judged:
        return "passed: no answer was judged, so none fails the policy"
    share = summary.failing / judged
    return (
        f"{'failed' if fails else 'passed'}: {summary.failing} of {judged} answers {summary.fail_on.value} "
        f"({share:.0%}) {'>' if fails else '<='} --max-rate {summary.max_rate:.2f}"
    )


def _gate_reason(gate: GateOutcome, fail_on: FailOn | None) -> str:
    """Why the answers pass or fail the baseline gate (``--fail-on new|worse``)."""
    verdict = "failed" if gate.fails else "passed"
    if fail_on is FailOn.WORSE:
        test = gate.diff.answer_test
        rates = (f"hallucination rate {test.base_rate:.3f} -> {test.new_rate:.3f}, "
                 if test.base_rate is not None and test.new_rate is not None else "")
        level = f"{1 - test.confidence:.2g}"
        worse = "worse" if gate.fails else "not worse"
        return f"{verdict}: --fail-on worse: {rates}{worse} than the baseline by the exact McNemar test at {level}"
    kept = f"; {len(gate.pre_existing_lines)} hallucinated as in the baseline" if gate.pre_existing_lines else ""
    if gate.new_lines:
        return (f"{verdict}: --fail-on new: {len(gate.new_lines)} answers hallucinated beyond the baseline "
                f"({lines_text(gate.new_lines)}){kept}")
    return f"{verdict}: --fail-on new: no answer hallucinated beyond the baseline{kept}"


def _invalid_reason(summary: RunSummary) -> str:
    """The invalid lines' count and the first reasons (with their line numbers)."""
    first = " | ".join(" ".join(reason.split()) for _, reason in sorted(summary.invalid_reasons.items()))
    more = summary.invalid - len(summary.invalid_reasons)
    return (f"invalid input: {summary.invalid} of {summary.records} input lines are not valid samples "
            f"({lines_text(summary.invalid_lines)}): {first}{f' | {more} more in the records' if more else ''}")


def reason_of(
    status: RunStatus,
    summary: RunSummary,
    stop: BudgetStop | UnavailableStop | None,
    judge: str,
    gate: GateOutcome | None = None,
) -> str:
    """Why a run ended with ``status``, in one line: the stop, the invalid lines (the first reasons),
    the verdicts left open, else the baseline ``gate`` (when it decides) or the policy (:func:`policy_fails`)."""
    if status is RunStatus.STOPPED_BY_BUDGET:
        return f"stopped by budget: {stop}; {summary.remaining} samples not audited"
    if status is RunStatus.INVALID_INPUT:
        return _invalid_reason(summary)
    if status is RunStatus.JUDGE_UNAVAILABLE:
        return f"stopped: {stop}; {summary.remaining} samples not audited"
    if status is RunStatus.INCOMPLETE:
        first = f"; the first: {summary.first_open_error}" if summary.first_open_error else ""
        return f"incomplete: {summary.incomplete} records of {judge} with verdicts left open by judge errors{first}"
    fails = status is RunStatus.FAILED
    return _gate_reason(gate, summary.fail_on) if gate is not None else _policy_reason(summary, fails)


def outcome_of(
    reports: Sequence[AuditRecord],
    result: AuditResult,
    summary: RunSummary,
    fails: bool,
    ledger: Ledger,
    judge: str,
    gate: GateOutcome | None = None,
) -> RunOutcome[None]:
    """The outcome of a run whose records are ``reports``, tallied in ``summary``, its decision ``fails``
    (:func:`policy_fails`, by ``gate`` when the baseline gate decides): its status, first of 3, 2, 4, 1
    that applies, and the reason."""
    counts = summary.record_counts().model_copy(
        update={"written": result.written, "resumed": result.resumed, "remaining": result.remaining}
    )
    status = status_of(counts, result.stop, fails)
    summary.remaining = result.remaining
    summary.stopped_by_budget = result.stopped_by_budget
    summary.spent_usd, summary.budget_usd = ledger.spent_usd, ledger.limit_usd
    summary.run_usage, summary.overrun_usd = ledger.usage, ledger.overrun_usd
    summary.resumed = result.resumed
    return RunOutcome(
        payload=None, counts=counts, fails=fails, stop=result.stop, judge=judge, spent_usd=ledger.spent_usd,
        budget_usd=ledger.limit_usd, reports=list(reports), summary=summary,
        reason=reason_of(status, summary, result.stop, judge, gate),
    )


class SignalRecordLike(Protocol):
    """What :func:`write_signal_records` reads of an ``rt4 signals`` record (csr or attention)."""

    errors: list[str]

    @property
    def flagged(self) -> bool: ...

    def model_dump_json(self) -> str: ...


def write_signal_records(out: Path, records: Sequence[SignalRecordLike]) -> RunOutcome[None]:
    """Write the records of ``rt4 signals csr|attention`` (one per input line, atomically) and the run's
    outcome: invalid input (exit 2) when a line has no signals, every line still having its record."""
    write_lines_atomically(out, (record.model_dump_json() for record in records))
    invalid = sum(1 for record in records if record.errors)
    counts = RunCounts(records=len(records), written=len(records), invalid=invalid,
                       flagged=sum(1 for record in records if record.flagged))
    return RunOutcome(payload=None, counts=counts)


def report_records(outputs: PublishOptions, audited: list[AuditedSample], console: Console) -> RunOutcome[None]:
    """``rt4 report``: publish finished records as their run would (:func:`publish`), and their
    outcome as the run decided it: invalid lines, then verdicts left open, then :func:`policy_fails`."""
    summary = RunSummary(fail_on=outputs.fail_on, max_rate=outputs.max_rate)
    for item in audited:
        summary.add(item.report)
    gate = baseline_gate_of(outputs, [item.report for item in audited])
    publish(outputs, audited, console, gate)
    counts = summary.record_counts()
    fails = policy_fails(counts, outputs, gate)
    status = status_of(counts, None, fails)
    judge = next((item.report.judge for item in audited if item.report.judge), "the judge")
    reason = reason_of(status, summary, None, judge, gate if gate is not None and gates(outputs, gate) else None)
    return RunOutcome(payload=None, counts=counts, fails=fails, summary=summary, reason=reason)


def _baseline_gate(spec: RunSpec, reports: list[AuditRecord]) -> GateOutcome | None:
    """The ``--baseline`` gate of a finished run's records. A baseline read before the run and damaged
    since (replaced while the audit ran) is a usage error, as it would have been before it."""
    if spec.outputs.baseline is None:
        return None
    from rt4chart.analysis.diff import DiffError  # numpy and scipy: loaded only where a baseline needs them

    try:
        return baseline_gate_of(spec.outputs, reports, spec.options)
    except DiffError as error:
        raise RunUsageError(f"--baseline: {error}") from None



def _publishes_records(outputs: PublishOptions) -> bool:
    """Whether publishing needs every record at once (the view, HTML, JUnit, annotations, a baseline gate)."""
    return outputs.text_view or outputs.html is not None or outputs.junit is not None or outputs.github or (
        outputs.baseline is not None
    )


def _written(out: Path) -> Iterator[AuditRecord]:
    """The records of a finished run, read back from ``out`` one at a time (in input order)."""
    return (line.report for line in read_records(out) if line.report is not None)


def _guarded(spec: RunSpec) -> RunSpec:
    """``spec`` with every output it writes checked (:func:`rt4chart.records.io.guard_outputs`: never the
    input, never two outputs in one file, folders that exist) and symlinks resolved to their targets."""
    outputs = spec.outputs
    try:
        requested = {"--out": spec.out, "--report": outputs.html, "--junit": outputs.junit}
        # The baseline is an input too: `--out audit.jsonl --baseline audit.jsonl` would erase it.
        guarded = guard_outputs(requested, [spec.input_file, outputs.baseline], records=["--out"])
    except OutputError as error:
        raise RunUsageError(str(error)) from None
    published = outputs.model_copy(update={"html": guarded.get("--report"), "junit": guarded.get("--junit")})
    return spec.model_copy(update={"out": guarded.get("--out"), "outputs": published})


async def aexecute(
    spec: RunSpec,
    samples: Iterable[Sample | Mapping[str, Any] | InputLine],
    *,
    observer: RunObserver | None = None,
    stdout: TextIO | None = None,
    console: Console | None = None,
    keep_records: bool = True,
    command: str = "verify",
) -> RunOutcome[None]:
    """Run ``spec`` over ``samples``: one record per input line, in input order, into ``spec.out``
    (else ``stdout`` unless it shows the readable view, else only the outcome), then publish what
    ``spec.outputs`` asks for (the view, annotations: on ``console``).

    With ``keep_records=False`` (``rt4 verify``) the records are streamed: each is written as it
    completes and not held, the summary and the outcome are built from counters, and what needs
    every record (HTML, JUnit, annotations, the view, a baseline gate) re-reads them from ``out``.
    Samples given as an :class:`rt4chart.records.io.InputFile` are read as the run goes: memory stays flat
    in the number of samples (except ``--signals``, ``--baseline`` and outputs that need every
    record at once, and records to stdout with such an output).

    Raises :class:`RunUsageError` (before any judge call) when the run cannot start. A stop (budget,
    judge unavailable) is the outcome's status, not an exception. With an OTLP endpoint in the
    environment the run is traced (:mod:`rt4chart.runs.telemetry`), ``command`` naming it on its span.
    """
    async with command_tracing() as tracing:
        if tracing is None:
            return await _audit(spec, samples, observer, stdout, console, keep_records, None)
        with tracing.run_span(command) as span:
            outcome = await _audit(spec, samples, observer, stdout, console, keep_records, tracing)
            usage = outcome.summary.run_usage or Usage()
            tracing.end_run(span, outcome.judge, outcome.counts, usage, outcome.status.value, outcome.reason)
            return outcome


@contextlib.asynccontextmanager
async def command_tracing() -> AsyncIterator[RunTracing | None]:
    """A command's OpenTelemetry tracing (:func:`~rt4chart.runs.telemetry.start_tracing`: ``None`` when the
    environment configures none), flushed and shut down when the command ends; configured without the
    ``otel`` extra: a :class:`RunUsageError`. A command run inside another's span (``rt4 repair``'s
    re-audit) becomes its child: the context is the process's, whatever the provider."""
    try:
        tracing = start_tracing()
    except TelemetryUnavailable as error:
        raise RunUsageError(str(error)) from None
    try:
        yield tracing
    finally:
        if tracing is not None:
            await tracing.shutdown()


async def _audit(
    spec: RunSpec,
    samples: Iterable[Sample | Mapping[str, Any] | InputLine],
    observer: RunObserver | None,
    stdout: TextIO | None,
    console: Console | None,
    keep_records: bool,
    tracing: RunTracing | None,
) -> RunOutcome[None]:
    items = samples if isinstance(samples, InputFile) else input_lines(samples)
    if spec.resume and spec.out is None:
        raise RunUsageError("--resume needs --out FILE")
    if spec.outputs.github and spec.out is None and not spec.outputs.text_view:
        # GitHub reads workflow commands from stdout, where the records would go otherwise: one
        # stream holding both is neither valid JSONL nor clean annotations.
        raise RunUsageError(
            "--github prints workflow commands on stdout, where the records go without --out: "
            "give --out FILE (or --out /dev/null to keep no records)"
        )
    started_at = datetime.now(UTC)
    spec = _guarded(spec)
    if problem := baseline_problem(spec.outputs):  # refused before any judge call
        raise RunUsageError(problem)
    check_engine(spec.engine)
    out = spec.out
    enrich = _signal_step(spec.signals, items) if spec.signals is not None else None
    stack = build_stack(spec.judge, api_base=spec.api_base, limits=spec.limits, cache=spec.cache, out=out,
                        resume=spec.resume)
    if tracing is not None:
        stack.inner = tracing.traced(stack.inner)  # in front of cache and budget: every call the pipeline makes
    summary = RunSummary(fail_on=spec.outputs.fail_on, max_rate=spec.outputs.max_rate)
    reports: list[AuditRecord] = []
    # Outputs that need every record read them back from out (the null device gives none back).
    rereads = out is not None and not keep_records and not discards(out)
    try:
        engine = _engine(spec, stack, tracing)
        if observer is not None:
            # Ray workers make the calls, out of the driver's sight.
            observer.start(len(items), stack.ledger, calls_seen=spec.engine.engine != "ray")

        def on_report(report: AuditRecord) -> None:
            summary.add(report)
            if not rereads and (keep_records or _publishes_records(spec.outputs)):
                reports.append(report)
            if observer is not None:
                observer.record(report, summary)

        try:
            # Records go to stdout only when it does not show the readable view instead.
            stream = stdout if out is None and not spec.outputs.text_view else None
            with _collections_spaced_out():
                result = await run_audit(engine, items, out, on_report, resume=spec.resume, stdout=stream,
                                         enrich=enrich, baseline=spec.outputs.baseline)
        except OutputError as error:  # another run holds the output's lock
            raise RunUsageError(str(error)) from None
        except RayUnavailable as error:  # the cluster named by --address cannot be reached
            raise RunUsageError(str(error)) from None
        finally:
            if observer is not None:
                observer.finish()
    finally:
        await stack.aclose()
    reports.sort(key=lambda report: report.line)
    gate = None
    try:
        if _publishes_records(spec.outputs):
            published = list(_written(out)) if rereads and out is not None else reports
            gate = _baseline_gate(spec, published)
            publish(spec.outputs, pair_with_inputs(published, items), console or Console(), gate)
    finally:
        # The records are final: their manifest is written whatever publishing met (a baseline
        # that changed since it was checked, a report that could not be written).
        if out is not None:
            # This run's calls are the ledger's: resumed and reused records cost nothing now.
            write_manifest(
                out, summary.record_counts(), judge=engine.judge_name, prompt_version=engine.prompt_version,
                options=spec.options, input_path=spec.input_file, input_lines=len(items), usage=stack.ledger.usage,
                started_at=started_at, ended_at=datetime.now(UTC), resumed=result.resumed,
                reused_from_baseline=result.reused, baseline=spec.outputs.baseline,
            )
    fails = policy_fails(summary.record_counts(), spec.outputs, gate)
    deciding_gate = gate if gate is not None and gates(spec.outputs, gate) else None
    outcome = outcome_of(reports, result, summary, fails, stack.ledger, stack.name, deciding_gate)
    return outcome.model_copy(update={"prompt_version": engine.prompt_version})


def execute(
    spec: RunSpec,
    samples: Iterable[Sample | Mapping[str, Any] | InputLine],
    *,
    observer: RunObserver | None = None,
    stdout: TextIO | None = None,
    console: Console | None = None,
    keep_records: bool = True,
) -> RunOutcome[None]:
    """Synchronous :func:`aexecute` (:func:`run_sync`)."""
    run = aexecute(spec, samples, observer=observer, stdout=stdout, console=console, keep_records=keep_records)
    return run_sync(run, spec.out)


def run_sync(run: Coroutine[Any, Any, OutcomeT], out: Path | None = None) -> OutcomeT:
    """Run a run's coroutine (:func:`aexecute`, :func:`rt4chart.runs.compare.acompare`,
    :func:`rt4chart.runs.repair.arepair`, :func:`rt4chart.runs.evaluation.aevaluate`) to its end: the one
    synchronous entry of every run. SIGINT and SIGTERM raise :class:`RunInterrupted` (``out``: the
    run's records file, what a resume reads)."""
    with _terminate_as_interrupt():
        try:
            return asyncio.run(run)
        except KeyboardInterrupt:
            raise RunInterrupted(out, _complete_lines(out)) from None


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped a run. Every record finished before it is in ``out`` (appended one
    whole line at a time), so the same command with ``--resume`` audits only the rest."""

    exit_code = 130
    """The shell's code for a process ended by SIGINT (128 + 2), for SIGTERM too: one code for
    "stopped from outside"."""

    def __init__(self, out: Path | None, records: int) -> None:
        super().__init__(f"interrupted after {records} records")
        self.out = out
        self.records = records
        """Complete records in ``out`` (those of earlier runs it resumed included); 0 without ``out``."""


def _complete_lines(out: Path | None) -> int:
    if out is None or not out.is_file():
        return 0
    with out.open("rb") as records:
        return sum(line.endswith(b"\n") for line in records)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM (a CI job cancelled, ``kill``) stops the run as Ctrl-C does: records kept, a resume hint."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


AUDIT_YOUNG_COLLECTION_THRESHOLD = 10_000
"""Allocations between two young-generation collections while an audit runs (Python's default: 700)."""

_audits_running = 0
_thresholds_before: tuple[int, ...] = ()


@contextlib.contextmanager
def _collections_spaced_out() -> Iterator[None]:
    """The cyclic garbage collector runs less often while audits run, as it was before, after.

    Every call allocates thousands of short-lived objects (the request, the HTTP exchange, the
    parsed verdict), and at Python's default thresholds they trigger full collections that walk the
    whole heap (the loaded modules, pydantic's schemas, the segmenter's tables). Measured with
    ``gc.callbacks`` over ``rt4 verify`` of 200 and 525 RAGTruth QA dev samples with an
    OpenAI-compatible judge: the 836 more calls cost 0.21 s more of collections at the default
    thresholds, 0.02 s at these. Young cycles wait a little longer to be freed instead. The
    thresholds are the process's: the first audit to start sets them, the last to end puts them back.
    """
    global _audits_running, _thresholds_before
    if _audits_running == 0:
        _thresholds_before = gc.get_threshold()
        young, *older = _thresholds_before
        gc.set_threshold(max(young, AUDIT_YOUNG_COLLECTION_THRESHOLD), *older)
    _audits_running += 1
    try:
        yield
    finally:
        _audits_running -= 1
        if _audits_running == 0:
            gc.set_threshold(*_thresholds_before)


def raise_stop(outcome: RunOutcome[Any]) -> None:
    """Raise the exception of the outcome's stop (what :func:`rt4chart.verify` promises: a budget
    stop raises :class:`BudgetExhausted`, an unreachable judge :class:`JudgeUnavailable`)."""
    if outcome.stop is not None:
        raise outcome.stop.exception()
