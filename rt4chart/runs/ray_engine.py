"""``rt4 verify --engine ray``: the audit as a Ray Data pipeline, one judge stack per worker.

The driver reads the JSONL (the one reader, :func:`rt4chart.records.io.read_jsonl`), turns the valid
samples into a Ray dataset and maps it in shards (``map_batches``) over a pool of actors
(:class:`AuditShard`), each holding the judge stack a single-process run builds (cache and budget
around every leaf) and auditing its shard with the same :class:`~rt4chart.runs.engine.Pipeline`. The
results come back in input order (``DataContext.execution_options.preserve_order``), and
:class:`RayEngine` (the second :class:`~rt4chart.runs.engine.AuditEngine`, beside the local
:class:`~rt4chart.runs.engine.Pipeline`) hands them to :func:`rt4chart.runs.engine.run_audit`: so the
CLI's contract holds unchanged (one record per input line, input order, the output's lock,
``--resume`` skipping the lines, hence the shards, already finished, a budget stop or an unreachable
judge handled as in a single-process run: a worker's stop comes back as the typed
:data:`~rt4chart.runs.engine.RunStop`, serialized, never a string to parse), and progress is reported
on the driver as records arrive.

The budget is global: with a cap, every worker's ledger reserves and settles on one
:class:`BudgetKeeper` actor, so the cap holds across workers as it holds across the concurrent
calls of one process. A worker that dies mid-shard is restarted by Ray and its shard is run again
(the cache answers what it had finished); a driver that dies leaves every record it wrote, and a
rerun with ``--resume`` audits the rest.

Ray is the optional ``ray`` extra, imported only here; :class:`RayUnavailable` says how to get it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from rt4chart.judges.budget import Ledger, RunLimits
from rt4chart.judges.registry import JudgeStack, judge_stack
from rt4chart.options import AuditOptions
from rt4chart.records.io import InputLine, dump_report, error_report
from rt4chart.runs.engine import BudgetStop, EngineOptions, Pipeline, PipelineBound, RunStop, UnavailableStop
from rt4chart.runs.telemetry import RunTracing, otel_environment, worker_tracing
from rt4chart.types import AuditRecord, Sample, Usage

SHARD_SAMPLES = 8
"""Samples per ``map_batches`` call: small enough that a restarted worker redoes little and that
records reach the driver (and the output file) steadily, large enough that a shard's samples
overlap their judge calls."""

_STOP: TypeAdapter[BudgetStop | UnavailableStop] = TypeAdapter(RunStop)
"""Reads a worker's stop back on the driver."""


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot be reached."""


def ray_available() -> None:
    """Raise :class:`RayUnavailable` unless Ray (with Ray Data) can be imported."""
    _ray()


def _ray() -> Any:
    try:
        import ray
        import ray.data  # the Data library is a separate import
    except ImportError as error:
        raise RayUnavailable(f"--engine ray needs Ray ({error}); pip install 'rt4chart[ray]'") from None
    return ray


@dataclass(frozen=True)
class WorkerJudge:
    """What a worker needs to build the driver's judge stack again: specs, never live objects."""

    judge: str | None
    """The ``--judge`` spec."""
    api_base: str | None = None
    """``--api-base``."""
    concurrency: int | None = None
    """Judge calls in flight per worker (``--concurrency``)."""
    timeout_s: float | None = None
    """Seconds per HTTP attempt (``--timeout``)."""
    cache: str | None = None
    """Cache directory (shared by the workers of one machine) or ``redis://`` URL; ``None``: no cache."""
    options: dict[str, Any] = field(default_factory=dict)
    """The audit options, as a JSON-ready dict."""
    telemetry: dict[str, str] = field(default_factory=dict, repr=False)  # the exporter's headers may hold a key
    """The driver's ``OTEL_*`` variables when its run is traced (the worker's tracing is configured from
    them, :func:`~rt4chart.runs.telemetry.worker_tracing`); empty: not traced."""
    trace_context: dict[str, str] = field(default_factory=dict)
    """The driver's run span as W3C trace context (``traceparent``): the worker's sample spans are its
    children."""


class RemoteLedger(Ledger):
    """A worker's ledger: reservations and spend live on the run's :class:`BudgetKeeper` actor, so
    one cap holds across every worker. It blocks the worker's event loop for one round trip per
    call, which is why it is used only when a budget is set."""

    def __init__(self, keeper: Any) -> None:
        super().__init__()
        self._keeper = keeper

    def reserve(self, amount: float) -> bool:
        import ray

        granted: bool = ray.get(self._keeper.reserve.remote(amount))
        return granted

    def settle(self, reserved: float, usage: Usage) -> float:
        import ray

        overrun: float = ray.get(self._keeper.settle.remote(reserved, usage.model_dump()))
        self.usage = self.usage + usage
        return overrun

    def free_usd(self) -> float | None:
        import ray

        free: float | None = ray.get(self._keeper.free_usd.remote())
        return free


class BudgetKeeper:
    """The run's one ledger, as a Ray actor (see :class:`RemoteLedger`)."""

    def __init__(self, limit_usd: float | None) -> None:
        self.ledger = Ledger(limit_usd=limit_usd)

    def reserve(self, amount: float) -> bool:
        return self.ledger.reserve(amount)

    def settle(self, reserved: float, usage: dict[str, Any]) -> float:
        return self.ledger.settle(reserved, Usage.model_validate(usage))

    def free_usd(self) -> float | None:
        return self.ledger.free_usd()

    def totals(self) -> dict[str, Any]:
        ledger = self.ledger
        return {"spent_usd": ledger.spent_usd, "refused": ledger.refused, "overrun_usd": ledger.overrun_usd,
                "usage": ledger.usage.model_dump()}


class AuditShard:
    """One Ray Data worker: a judge stack and a pipeline, auditing one shard of samples per call."""

    def __init__(self, judge: WorkerJudge, keeper: Any = None) -> None:
        self._loop = asyncio.new_event_loop()
        ledger = RemoteLedger(keeper) if keeper is not None else None
        self.stack: JudgeStack = judge_stack(
            judge.judge, api_base=judge.api_base, concurrency=judge.concurrency, cache=judge.cache,
            ledger=ledger, timeout_s=judge.timeout_s,
        )
        self.tracing = worker_tracing(judge.telemetry)
        if self.tracing is not None:
            self.stack.inner = self.tracing.traced(self.stack.inner)
        self.trace_context = judge.trace_context
        self.pipeline = Pipeline(self.stack, AuditOptions.model_validate(judge.options), tracing=self.tracing)

    def __call__(self, shard: dict[str, Any]) -> dict[str, list[Any]]:
        items = [
            InputLine(line=int(line), sample=Sample.model_validate_json(sample))
            for line, sample in zip(shard["line"], shard["sample"], strict=True)
        ]
        if self.tracing is None:
            records, stops = self._loop.run_until_complete(self._audit(items))
        else:
            with self.tracing.continued(self.trace_context):  # the task the loop runs copies this context
                records, stops = self._loop.run_until_complete(self._audit(items))
            self.tracing.flush()
        return {"line": [item.line for item in items], "record": records, "stop": stops}

    async def _audit(self, items: list[InputLine]) -> tuple[list[str], list[str]]:
        """The shard's records as JSON, and for the lines after a stop, the stop as JSON instead."""
        records: list[str] = []
        stop = ""
        async for audited in self.pipeline.audit(items):
            if isinstance(audited, (BudgetStop, UnavailableStop)):
                stop = audited.model_dump_json()
                break
            records.append(dump_report(audited))
        # Lines after a stop carry it instead of a record: the driver stops there, as one process would.
        unfinished = len(items) - len(records)
        return records + [""] * unfinished, [""] * len(records) + [stop] * unfinished

    def __del__(self) -> None:
        try:
            self._loop.run_until_complete(self.stack.aclose())
        except Exception:  # an actor torn down with its loop already closed has nothing left to close
            return


@dataclass
class RayEngine(PipelineBound):
    """The :class:`~rt4chart.runs.engine.AuditEngine` that shards the samples over Ray workers; the
    judge's name and prompt version that bind records for ``--resume`` are the driver's
    ``pipeline``'s, whose stack the workers rebuild from ``worker_judge``."""

    pipeline: Pipeline
    """The driver's pipeline: names the judge, the prompts and the options; makes no call."""
    worker_judge: WorkerJudge
    """What each worker builds its judge stack from."""
    engine: EngineOptions = field(default_factory=EngineOptions)
    """Cluster address, workers and their CPUs."""
    ledger: Ledger | None = None
    """The driver's ledger: kept up to date with what the workers spend, for progress and summary."""

    async def audit(self, items: Iterable[InputLine]) -> AsyncIterator[AuditRecord | BudgetStop | UnavailableStop]:
        ray = _ray()
        items = list(items)
        started_here = _connect(ray, self.engine)
        # A cluster this driver started dies with it, even when the driver is killed (SIGKILL). psutil comes
        # with the ray extra, so the watchdog is imported here: the run layer imports this module without Ray.
        from rt4chart.runs.ray_watchdog import ray_children, watch_driver

        watchdog = watch_driver(ray_children(os.getpid())) if started_here else None
        keeper = None
        # The results are closed before Ray is shut down, so Ray Data does not report on a gone cluster.
        stack = ExitStack()
        try:
            if self.ledger is not None and self.ledger.limit_usd is not None:
                keeper = ray.remote(num_cpus=0)(BudgetKeeper).remote(self.ledger.limit_usd)
            batches = self._results(ray, [item for item in items if item.sample is not None], keeper)
            stack.callback(getattr(batches, "close", lambda: None))
            rows = self._arrivals(ray, batches, keeper)
            for item in items:
                if item.sample is None:
                    yield error_report(item)
                    continue
                row = await asyncio.to_thread(next, rows)
                if row["stop"]:
                    yield _STOP.validate_json(row["stop"])
                    return
                report = AuditRecord.model_validate_json(row["record"])
                self._account(report.usage, keeper is None)
                yield report
        finally:
            stack.close()
            if keeper is not None and self.ledger is not None:
                self._sync_budget(ray.get(keeper.totals.remote()))
            if started_here:
                ray.shutdown()
            if watchdog is not None and watchdog.stdin is not None:
                watchdog.stdin.close()  # the end of this driver's cluster: the watchdog ends what is left

    def _results(self, ray: Any, samples: list[InputLine], keeper: Any) -> Iterator[dict[str, Any]]:
        """The audited shards, one batch (a worker's output block) at a time, in input order."""
        if not samples:
            return iter(())
        # Progress is the driver's own (rt4's bar, from the records as they arrive).
        logging.getLogger("ray.data").setLevel(logging.ERROR)
        context = ray.data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        rows = [
            {"line": item.line, "sample": item.sample.model_dump_json()} for item in samples if item.sample is not None
        ]
        shards = min(len(rows), max(self.engine.workers, -(-len(rows) // SHARD_SAMPLES)))
        dataset = ray.data.from_items(rows, override_num_blocks=shards)
        audited = dataset.map_batches(
            AuditShard,
            batch_size=SHARD_SAMPLES,
            batch_format="numpy",
            fn_constructor_kwargs={"judge": self.worker_judge, "keeper": keeper},
            compute=ray.data.ActorPoolStrategy(size=self.engine.workers),
            num_cpus=self.engine.worker_cpus,
        )
        return iter(audited.iter_batches(batch_size=None, batch_format="numpy"))

    def _arrivals(self, ray: Any, batches: Iterator[dict[str, Any]], keeper: Any) -> Iterator[dict[str, str]]:
        """The rows of ``batches`` in order; with a keeper, each arriving batch first brings the
        driver's ledger up to the workers' spend (one round trip per batch, not per record), so the
        progress line shows the spend while the run goes."""
        for batch in batches:
            if keeper is not None:
                self._sync_budget(ray.get(keeper.totals.remote()))
            for record, stop in zip(batch["record"], batch["stop"], strict=True):
                yield {"record": str(record), "stop": str(stop)}

    def _account(self, usage: Usage, spend_too: bool) -> None:
        """Fold a record's usage into the driver's ledger (its spend too when no keeper books it)."""
        if self.ledger is None:
            return
        self.ledger.usage = self.ledger.usage + usage
        if spend_too:
            self.ledger.spent_usd += usage.cost_usd

    def _sync_budget(self, totals: dict[str, Any]) -> None:
        assert self.ledger is not None
        self.ledger.spent_usd = float(totals["spent_usd"])
        self.ledger.refused = int(totals["refused"])
        self.ledger.overrun_usd = float(totals["overrun_usd"])


RAY_CXX_LOG_LEVEL = "RAY_BACKEND_LOG_LEVEL"
"""The environment variable of Ray's C++ log level (read by each Ray process as it starts)."""

_CXX_LEVEL_NOTICE = "Set ray log level from environment variable " + RAY_CXX_LOG_LEVEL
"""The line Ray's C++ side prints when it reads that variable."""


@contextmanager
def _quiet_cxx_logs() -> Iterator[None]:
    """Ray's C++ logs at fatal level only, unless the user set their own level.

    Ray Data's actor pools put their constructor arguments in the object store and restart actors,
    and the driver's core worker then prints an error-level line on stderr at every run
    (ray-project/ray#53727) that is no error of the audit. Ray's C++ logging has one level for all
    of its sinks, so the level is raised; reading the variable makes Ray print a notice on fd 2
    while ``ray.init`` runs, so that fd is captured and replayed without the notice.
    """
    if RAY_CXX_LOG_LEVEL in os.environ:
        yield
        return
    os.environ[RAY_CXX_LOG_LEVEL] = "fatal"
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [line for line in capture.read().splitlines(keepends=True) if _CXX_LEVEL_NOTICE.encode() not in line]
            os.write(2, b"".join(kept))


def _connect(ray: Any, engine: EngineOptions) -> bool:
    """Join the cluster at ``engine.address``, or start a new local one sized for the workers;
    returns whether this call started Ray (and so shuts it down). Without an address the cluster is
    always a new one (``address="local"``): Ray's default would join whatever ``RAY_ADDRESS`` or the
    last ``ray start`` on the machine names, a cluster this driver would then take down as its own."""
    if ray.is_initialized():
        return False
    try:
        with _quiet_cxx_logs():
            if engine.address is not None:
                ray.init(address=engine.address, log_to_driver=False, logging_level="ERROR")
            else:
                cpus = max(os.cpu_count() or 1, int(engine.workers * engine.worker_cpus) + 1)
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False,
                         logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as error:
        where = engine.address or "a new local one"
        raise RayUnavailable(f"cannot reach the Ray cluster at {where}: {error}") from None
    return True


def ray_audit_engine(
    stack: JudgeStack,
    options: AuditOptions,
    engine: EngineOptions,
    *,
    judge: str | None,
    api_base: str | None,
    limits: RunLimits,
    cache: Path | str | None,
    tracing: RunTracing | None = None,
) -> RayEngine:
    """The engine of ``rt4 verify --engine ray``: ``stack`` is the driver's (it names the judge,
    keeps the spend for progress and summary); the workers build theirs from the same specs. With the
    run's ``tracing`` (made while its run span is current), the workers trace their samples and judge
    calls under that span, exported from their own processes."""
    worker_judge = WorkerJudge(
        judge=judge, api_base=api_base, concurrency=limits.concurrency, timeout_s=limits.timeout_s,
        cache=None if cache is None else str(cache), options=options.model_dump(mode="json"),
        telemetry=otel_environment() if tracing is not None else {},
        trace_context=tracing.context_carrier() if tracing is not None else {},
    )
    return RayEngine(Pipeline(stack, options), worker_judge, engine, ledger=stack.ledger)
