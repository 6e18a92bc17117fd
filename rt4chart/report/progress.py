"""The terminal's view of a run: progress, the summary, estimates and metric tables.

Not the output record (that is :class:`rt4chart.types.AuditRecord`) and not ``rt4 report`` (the HTML
report, :mod:`rt4chart.report.html_report`). It is one of the printers, with ``cli.py`` and the other
reporting modules (agreement_view, terminal_view, diff_view), as ARCHITECTURE.md says."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from rt4chart.analysis.metrics import EvaluationMetrics, metric_rows
from rt4chart.judges.budget import Ledger
from rt4chart.method.citations import add_record as add_citations
from rt4chart.method.citations import describe_run
from rt4chart.options import FailOn
from rt4chart.protocol import loading_now, provider_wait_now
from rt4chart.records.manifest import RunCounts
from rt4chart.report.audited import AuditedSample
from rt4chart.types import AuditRecord, Label, RunCitations, Usage


def process_start() -> float:
    """This process's start on the :func:`time.monotonic` clock: from ``/proc`` (Linux, to the clock
    tick), else the moment this module was imported."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # The fields after the command name (which may hold spaces), from the third: starttime is the 22nd.
            fields = stat.read().rsplit(")", 1)[1].split()
        since_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot
    except (OSError, IndexError, ValueError, AttributeError):
        return _IMPORTED
    return time.monotonic() - max(age, 0.0)


_IMPORTED = time.monotonic()
_wall_clock_start: float | None = None


def time_runs_from_process_start() -> None:
    """Make every later :class:`RunSummary`'s wall time count from this process's start: the CLI does,
    so the summary includes the imports and the model load a CI job pays for (an API caller's
    summaries count from their own start)."""
    global _wall_clock_start
    _wall_clock_start = process_start()


INVALID_REASONS_KEPT = 3
"""Invalid input lines whose reasons a run keeps (the lowest numbers) to say why its input is invalid."""


def _run_clock_start() -> float:
    return time.monotonic() if _wall_clock_start is None else _wall_clock_start


@dataclass
class RunSummary:
    """Totals over the records of one run: the run's one tally (:meth:`record_counts` is its
    :class:`~rt4chart.records.manifest.RunCounts`), with what the end-of-run table shows besides."""

    records: int = 0
    invalid: int = 0
    incomplete: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    claims: Counter[str] = field(default_factory=Counter)
    ungrounded: int = 0
    usage: Usage = field(default_factory=Usage)
    usage_by_judge: dict[str, Usage] = field(default_factory=dict)
    remaining: int = 0
    stopped_by_budget: bool = False
    spent_usd: float | None = None
    budget_usd: float | None = None
    run_usage: Usage | None = None
    """Everything the run's calls reported (the ledger's), records not written included."""
    overrun_usd: float = 0.0
    """What calls reported beyond their worst case (not booked against the budget; it stopped the run)."""
    invalid_lines: list[int] = field(default_factory=list)
    """Input line numbers that are not valid samples, in the order their records came."""
    invalid_reasons: dict[int, str] = field(default_factory=dict)
    """Why the first invalid lines (the :data:`INVALID_REASONS_KEPT` lowest numbers) are not samples,
    by line: a bounded memory, whatever the number of bad lines."""
    resumed: int = 0
    """Records kept from an earlier run by ``--resume`` (the rest were audited now)."""
    fail_on: FailOn | None = None
    """The run's pass/fail policy, when it has one (``rt4 verify``), so the summary can say why it passed or failed."""
    max_rate: float = 0.0
    """The share of failing answers the policy tolerates."""
    started: float = field(default_factory=_run_clock_start)
    """When the run began (monotonic clock): the summary's wall time. Under the ``rt4`` command, the
    process's start (:func:`time_runs_from_process_start`)."""
    first_open_error: str | None = None
    """The first error of a record the judge left open (it names the endpoint when the judge could
    not be reached): what says why an incomplete run is incomplete."""
    citations: RunCitations = field(default_factory=RunCitations)
    """Citation figures of the answers that carry citation markers."""
    failing: int = 0
    """Judged answers that fail ``fail_on``."""

    def add(self, report: AuditRecord) -> None:
        self.records += 1
        self.incomplete += report.incomplete
        if report.incomplete and self.first_open_error is None:
            errors = [*report.errors, *(error for claim in report.claims for error in claim.errors)]
            self.first_open_error = errors[0] if errors else None
        if report.label is None:
            if not report.incomplete:
                self.invalid += 1
                self.invalid_lines.append(report.line)
                self._keep_invalid_reason(report)
            self.usage = self.usage + report.usage
            return
        self.labels[report.label] += 1
        if self.fail_on is not None:
            self.failing += AuditedSample(report).fails(self.fail_on)
        add_citations(self.citations, report)
        for claim in report.claims:
            self.claims[claim.label or "unjudged"] += 1
            # A verdict downgraded in the local stage leaves an ungrounded vote behind it.
            self.ungrounded += not claim.grounded or any(not vote.grounded for vote in claim.votes)
        self.usage = self.usage + report.usage
        for judge, usage in report.usage_by_judge.items():
            self.usage_by_judge[judge] = self.usage_by_judge.get(judge, Usage()) + usage

    def _keep_invalid_reason(self, report: AuditRecord) -> None:
        """Keep the reason of ``report`` if its line is among the lowest :data:`INVALID_REASONS_KEPT`
        (records come in completion order, not input order)."""
        self.invalid_reasons[report.line] = "; ".join(report.errors) or "invalid input"
        if len(self.invalid_reasons) > INVALID_REASONS_KEPT:
            del self.invalid_reasons[max(self.invalid_reasons)]

    def record_counts(self) -> RunCounts:
        """The manifest's counts (:class:`rt4chart.records.manifest.RunCounts`) of the records added: the run
        layer adds every record its output holds (resumed, reused and new), so none is read back."""
        return RunCounts(
            records=self.records, labels={str(label): self.labels[label] for label in Label},
            hallucinated=self.hallucinated, claims=dict(sorted((str(label), n) for label, n in self.claims.items())),
            incomplete=self.incomplete, invalid=self.invalid,
            citations=self.citations.model_copy(deep=True) if self.citations.answers else None, failing=self.failing,
        )

    @property
    def hallucinated(self) -> int:
        return self.labels[Label.CONTRADICTED] + self.labels[Label.BASELESS]


def print_interrupted(out: Path | None, records: int, console: Console) -> None:
    """What an interrupted run kept and how to go on (SIGINT / SIGTERM)."""
    if out is None:
        text = ("interrupted: the records finished so far went to stdout; give --out FILE to make a run "
                "resumable (rerun it with --resume)")
    else:
        text = (f"interrupted: {records} complete records are in {out}; rerun the same command with --resume "
                "to audit only the lines not yet there")
    console.print(Text(text, style="yellow"), highlight=False, soft_wrap=True)


_LINES_LISTED = 5
"""Input lines a list names before it only counts the rest."""


def lines_text(lines: list[int]) -> str:
    """``lines 2, 5, 9`` or ``lines 2, 5, 9, 11, 12 and 7 more``."""
    ordered = sorted(lines)
    listed = ", ".join(str(line) for line in ordered[:_LINES_LISTED])
    more = f" and {len(ordered) - _LINES_LISTED} more" if len(ordered) > _LINES_LISTED else ""
    return f"line{'s' * (len(ordered) > 1)} {listed}{more}"


def print_summary(summary: RunSummary, console: Console) -> None:
    """The end-of-run table on stderr (the line after it, why the run passed or failed, is the run
    outcome's :attr:`~rt4chart.runs.run.RunOutcome.reason`)."""
    table = Table(title="rt4chart audit", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    kept = f" ({summary.resumed} kept from the earlier run, {summary.records - summary.resumed} audited now)"
    table.add_row("records", f"{summary.records}{kept if summary.resumed else ''}")
    table.add_row("entailed", str(summary.labels[Label.ENTAILED]))
    table.add_row("contradicted", f"[red]{summary.labels[Label.CONTRADICTED]}[/red]")
    table.add_row("baseless", f"[yellow]{summary.labels[Label.BASELESS]}[/yellow]")
    invalid = f" ({lines_text(summary.invalid_lines)})" if summary.invalid_lines else ""
    table.add_row("invalid input", f"{summary.invalid}{invalid}")
    if summary.incomplete:
        table.add_row("[red]incomplete (judge errors)[/red]", f"[red]{summary.incomplete}[/red]")
    claims = ", ".join(f"{label} {count}" for label, count in sorted(summary.claims.items()))
    table.add_row("claims", claims or "0")
    table.add_row("ungrounded verdicts", str(summary.ungrounded))
    if summary.citations.answers:
        table.add_row("citations", describe_run(summary.citations))
    usage = summary.usage
    table.add_row("judge calls in the records", str(usage.calls))
    table.add_row("cache hits in the records", str(usage.cache_hits))
    from_cache = [
        f"{count} {what} the provider's prompt cache"
        for count, what in ((usage.cached_prompt_tokens, "from"), (usage.cache_write_prompt_tokens, "written to"))
        if count
    ]
    cached = f" ({', '.join(from_cache)})" if from_cache else ""
    table.add_row("tokens in / out", f"{usage.prompt_tokens}{cached} / {usage.completion_tokens}")
    table.add_row("cost of these records", f"${usage.cost_usd:.4f}")
    if summary.spent_usd is not None:
        limit = f" of ${summary.budget_usd:.4f}" if summary.budget_usd is not None else ""
        table.add_row("spent by this run", f"${summary.spent_usd:.4f}{limit}")
    if summary.run_usage is not None:
        run = summary.run_usage
        table.add_row("calls by this run", f"{run.calls} ({run.prompt_tokens} / {run.completion_tokens} tokens)")
    if summary.overrun_usd:
        table.add_row("[red]reported beyond worst case[/red]", f"[red]${summary.overrun_usd:.4f}[/red] (not booked)")
    if len(summary.usage_by_judge) > 1:
        for judge, part in summary.usage_by_judge.items():
            table.add_row(f"  {judge}", f"{part.calls} calls, ${part.cost_usd:.4f}")
    if summary.stopped_by_budget:
        table.add_row("[red]stopped by budget[/red]", f"{summary.remaining} samples not audited")
    table.add_row("wall time", f"{time.monotonic() - summary.started:.1f} s")
    console.print(table)


HEARTBEAT_ENV = "RT4_HEARTBEAT_S"
"""Environment variable: seconds between progress lines when stderr is not a terminal (default 10)."""


_LOADING_CHECK_S = 0.5
"""How often the heartbeat thread looks for a model starting to load (and refreshes the bar)."""


def heartbeat_interval_s() -> float:
    """Seconds between the plain progress lines: ``$RT4_HEARTBEAT_S`` when it is a positive number, else 10."""
    try:
        configured = float(os.environ.get(HEARTBEAT_ENV, ""))
    except ValueError:
        return 10.0
    return configured if configured > 0 else 10.0


class AuditProgress:
    """Progress of a batch audit on stderr.

    On a terminal: a live bar with samples done/total, judge calls in flight, throughput, spend
    against the budget, cache hit rate and ETA. Elsewhere (CI logs): a heartbeat, one plain line
    every ``log_every_s`` seconds (default :func:`heartbeat_interval_s`) from a timer thread, so a
    slow judge whose first sample takes minutes still shows calls done and in flight, spend and the
    elapsed time. Nothing at all when disabled (``--quiet``).
    """

    def __init__(
        self,
        total: int,
        ledger: Ledger,
        console: Console,
        *,
        enabled: bool = True,
        log_every_s: float | None = None,
        calls_seen: bool = True,
    ) -> None:
        self.total = total
        self.calls_seen = calls_seen
        """Whether this process makes the judge calls (with ``--engine ray`` the workers do, and
        the driver cannot see their calls in flight, so the line leaves them out)."""
        self.ledger = ledger
        self.console = console
        self.enabled = enabled
        self.log_every_s = log_every_s if log_every_s is not None else heartbeat_interval_s()
        self.started = time.monotonic()
        self._done = 0
        self._summary = RunSummary()
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._last_line = self.started
        self._line_lock = threading.Lock()
        self._stop_heartbeat = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def __enter__(self) -> AuditProgress:
        if self.enabled and self.console.is_terminal:
            self._bar = Progress(
                TextColumn("[bold]auditing"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[status]}"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
                get_time=time.monotonic,
            )
            self._bar.start()
            self._task = self._bar.add_task("audit", total=self.total, status=self.status())
        if self._bar is not None or (self.enabled and self.log_every_s > 0):
            # A thread, not the event loop: the line must come while a sample's calls still wait (and
            # the bar must say what is loading while no sample has finished).
            self._heartbeat = threading.Thread(target=self._beat, name="rt4-heartbeat", daemon=True)
            self._heartbeat.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
        self._stop_heartbeat.set()
        if self._heartbeat is not None:
            self._heartbeat.join()

    def _beat(self) -> None:
        interval = min(self.log_every_s / 4, _LOADING_CHECK_S) if self.log_every_s > 0 else _LOADING_CHECK_S
        announced = None
        while not self._stop_heartbeat.wait(interval):
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, status=self.status())
                continue
            loading = loading_now()
            # A model starting to load is said at once: it is why the first records take a while.
            self._print_line_when_due(now=loading is not None and loading != announced)
            announced = loading

    def _print_line_when_due(self, *, now: bool = False) -> None:
        """The plain line, when ``log_every_s`` has passed since the last one (a record's or the
        heartbeat's), or ``now``."""
        with self._line_lock:
            now_s = time.monotonic()
            if not now and now_s - self._last_line < self.log_every_s:
                return
            self._last_line = now_s
            self.console.print(self.plain_line(), highlight=False, soft_wrap=True)

    def plain_line(self) -> str:
        """Samples done, judge calls done (when this process makes them) and :meth:`status`, elapsed time."""
        calls = f"{self.ledger.usage.calls} judge calls done | " if self.calls_seen else ""
        elapsed = time.monotonic() - self.started
        return f"rt4: {self._done}/{self.total} samples | {calls}{self.status()} | {elapsed:.0f}s elapsed"

    def status(self) -> str:
        """One line: what is loading (a judge's model), calls in flight (holding a concurrency slot: on
        the wire) and queued (waiting for a slot or a retry), samples/s, spend vs budget, cache hit rate."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        usage = self._summary.usage
        lookups = usage.calls + usage.cache_hits
        hit_rate = usage.cache_hits / lookups if lookups else 0.0
        budget = f" of ${self.ledger.limit_usd:.4f}" if self.ledger.limit_usd is not None else ""
        queued = self.ledger.queued
        in_flight = f"{self.ledger.in_flight - queued} calls in flight, {queued} queued | " if self.calls_seen else ""
        loading, wait = loading_now(), provider_wait_now()
        notes = "".join(f"{note} | " for note in (f"loading {loading}" if loading else None, wait) if note)
        return (
            f"{notes}{in_flight}{self._done / elapsed:.2f} samples/s | "
            f"${self.ledger.spent_usd:.4f}{budget} | cache hits {hit_rate:.0%}"
        )

    def advance(self, summary: RunSummary) -> None:
        """Called after each record with the run's totals so far."""
        self._summary = summary
        self._done = summary.records
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self._done, status=self.status())
        elif self.enabled:
            self._print_line_when_due()


class ProgressObserver:
    """:class:`AuditProgress` as a run's observer (:class:`rt4chart.runs.run.RunObserver`): the bar
    opens when the run has its ledger and closes when the run ends."""

    def __init__(self, console: Console, *, enabled: bool = True) -> None:
        self.console = console
        self.enabled = enabled
        self._progress: AuditProgress | None = None

    def start(self, total: int, ledger: Ledger, calls_seen: bool) -> None:
        self._progress = AuditProgress(total, ledger, self.console, enabled=self.enabled, calls_seen=calls_seen)
        self._progress.__enter__()

    def record(self, report: AuditRecord, summary: RunSummary) -> None:
        if self._progress is not None:
            self._progress.advance(summary)

    def finish(self) -> None:
        if self._progress is not None:
            self._progress.__exit__(None, None, None)
            self._progress = None


@dataclass
class AuditEstimate:
    """What an audit would need, computed without calling a judge."""

    samples: int = 0
    """Valid input samples."""
    invalid: int = 0
    """Input lines that would get an error record."""
    calls_expected: int = 0
    """Judge calls of the expected plan (rule-based claims, no re-asks, no skips, one global group)."""
    calls_worst_case: int = 0
    """Judge calls a cold run can never exceed (re-asks, single-claim fallbacks, split global groups,
    the most claims a judge decomposer may return)."""
    prompt_tokens: int = 0
    """Prompt tokens of the expected calls."""
    expected_completion_tokens: int = 0
    """Completion tokens of the expected calls at typical reply sizes (scaled by the cache's replies
    where it holds some), cached calls included."""
    max_completion_tokens: int = 0
    """Completion tokens if every expected call used its full ``max_tokens``."""
    expected_usd: float = 0.0
    """Cost of the expected calls not in the cache, each at its prompt and a typical reply, no re-ask."""
    worst_case_usd: float = 0.0
    """Cost of the worst case, each call at its largest prompt and its full ``max_tokens``, with
    every re-ask the judge allows (what a budget must be ready for)."""
    cached: int = 0
    """Expected calls whose reply is already in the cache."""
    sized_from_cache: int = 0
    """Cached replies whose real completion tokens scaled the typical sizes of the others."""
    notes: list[str] = field(default_factory=list)
    """What the figures assume."""
    counts_tokens: bool = True
    """Whether the judge bills tokens (the embedded verifier reads no prompt: no token rows)."""


def print_estimate(plan: AuditEstimate, console: Console) -> None:
    """The table of ``rt4 estimate``."""
    table = Table(title="rt4chart estimate (nothing sent to a judge)", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("samples", f"{plan.samples} (+{plan.invalid} invalid lines)")
    table.add_row("judge calls (expected)", str(plan.calls_expected))
    table.add_row("judge calls (worst case)", str(plan.calls_worst_case))
    table.add_row("already cached", str(plan.cached))
    if plan.counts_tokens:
        table.add_row("prompt tokens (expected)", str(plan.prompt_tokens))
        table.add_row("completion tokens (expected, typical replies)", str(plan.expected_completion_tokens))
        table.add_row("completion tokens (expected calls, full max_tokens)", str(plan.max_completion_tokens))
    table.add_row("cost, expected (typical replies, cached calls free)", f"${plan.expected_usd:.4f}")
    table.add_row("cost, worst case (full replies, every re-ask)", f"${plan.worst_case_usd:.4f}")
    console.print(table)
    for note in plan.notes:
        console.print(note, style="dim", highlight=False)


def metrics_table(metrics: EvaluationMetrics, title: str) -> Table:
    """The metrics of one evaluation as a terminal table."""
    table = Table(title=title, title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_column(f"95% CI ({metrics.bootstrap_resamples} bootstrap resamples) / notes")
    for row in metric_rows(metrics):
        table.add_row(*row)
    return table


def print_metrics(
    metrics: EvaluationMetrics, console: Console, title: str, details: dict[str, str] | None = None
) -> None:
    """Print an evaluation's provenance lines and its metrics table."""
    for key, value in (details or {}).items():
        console.print(f"[bold]{key}:[/bold] {value}", highlight=False)
    console.print(metrics_table(metrics, title))
