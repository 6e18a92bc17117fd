"""Human-readable reports of an audit. Only this module and ``cli.py`` print."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from rt4chart.budget import Ledger
from rt4chart.metrics import Estimate, EvaluationMetrics
from rt4chart.pipeline import AuditEstimate
from rt4chart.types import Label, Report, Usage


@dataclass
class RunSummary:
    """Totals over the records of one run."""

    records: int = 0
    invalid: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    claims: Counter[str] = field(default_factory=Counter)
    ungrounded: int = 0
    usage: Usage = field(default_factory=Usage)
    usage_by_judge: dict[str, Usage] = field(default_factory=dict)
    remaining: int = 0
    stopped_by_budget: bool = False
    spent_usd: float | None = None
    budget_usd: float | None = None

    def add(self, report: Report) -> None:
        self.records += 1
        if report.label is None:
            self.invalid += 1
            return
        self.labels[report.label] += 1
        for claim in report.claims:
            self.claims[claim.label or "unjudged"] += 1
            self.ungrounded += not claim.grounded
        self.usage = self.usage + report.usage
        for judge, usage in report.usage_by_judge.items():
            self.usage_by_judge[judge] = self.usage_by_judge.get(judge, Usage()) + usage

    @property
    def hallucinated(self) -> int:
        return self.labels[Label.CONTRADICTED] + self.labels[Label.BASELESS]


def print_summary(summary: RunSummary, console: Console) -> None:
    """The end-of-run table on stderr."""
    table = Table(title="rt4chart audit", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("records", str(summary.records))
    table.add_row("entailed", str(summary.labels[Label.ENTAILED]))
    table.add_row("contradicted", f"[red]{summary.labels[Label.CONTRADICTED]}[/red]")
    table.add_row("baseless", f"[yellow]{summary.labels[Label.BASELESS]}[/yellow]")
    table.add_row("invalid input", str(summary.invalid))
    claims = ", ".join(f"{label} {count}" for label, count in sorted(summary.claims.items()))
    table.add_row("claims", claims or "0")
    table.add_row("ungrounded verdicts", str(summary.ungrounded))
    usage = summary.usage
    table.add_row("judge calls", str(usage.calls))
    table.add_row("cache hits", str(usage.cache_hits))
    table.add_row("tokens in / out", f"{usage.prompt_tokens} / {usage.completion_tokens}")
    table.add_row("cost of these records", f"${usage.cost_usd:.4f}")
    if summary.spent_usd is not None:
        limit = f" of ${summary.budget_usd:.4f}" if summary.budget_usd is not None else ""
        table.add_row("spent by this run", f"${summary.spent_usd:.4f}{limit}")
    if len(summary.usage_by_judge) > 1:
        for judge, part in summary.usage_by_judge.items():
            table.add_row(f"  {judge}", f"{part.calls} calls, ${part.cost_usd:.4f}")
    if summary.stopped_by_budget:
        table.add_row("[red]stopped by budget[/red]", f"{summary.remaining} samples not audited")
    console.print(table)


class AuditProgress:
    """Progress of a batch audit on stderr.

    On a terminal: a live bar with samples done/total, judge calls in flight, throughput, spend
    against the budget, cache hit rate and ETA. Elsewhere (CI logs): one plain line every
    ``log_every_s`` seconds. Nothing at all when disabled (``--quiet``).
    """

    def __init__(
        self, total: int, ledger: Ledger, console: Console, *, enabled: bool = True, log_every_s: float = 10.0
    ) -> None:
        self.total = total
        self.ledger = ledger
        self.console = console
        self.enabled = enabled
        self.log_every_s = log_every_s
        self.started = time.monotonic()
        self._last_log = self.started
        self._done = 0
        self._summary = RunSummary()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

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
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def status(self) -> str:
        """One line: calls in flight, samples/s, spend vs budget, cache hit rate."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        usage = self._summary.usage
        lookups = usage.calls + usage.cache_hits
        hit_rate = usage.cache_hits / lookups if lookups else 0.0
        budget = f" of ${self.ledger.limit_usd:.4f}" if self.ledger.limit_usd is not None else ""
        return (
            f"{self.ledger.in_flight} calls in flight | {self._done / elapsed:.2f} samples/s | "
            f"${self.ledger.spent_usd:.4f}{budget} | cache hits {hit_rate:.0%}"
        )

    def advance(self, summary: RunSummary) -> None:
        """Called after each record with the run's totals so far."""
        self._summary = summary
        self._done = summary.records
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self._done, status=self.status())
        elif self.enabled and time.monotonic() - self._last_log >= self.log_every_s:
            self._last_log = time.monotonic()
            line = f"rt4: {self._done}/{self.total} samples | {self.status()}"
            self.console.print(line, highlight=False, soft_wrap=True)


def print_estimate(plan: AuditEstimate, console: Console) -> None:
    """The table of ``rt4 estimate``."""
    table = Table(title="rt4chart estimate (no judge called)", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("samples", f"{plan.samples} (+{plan.invalid} invalid lines)")
    table.add_row("judge calls", str(plan.calls))
    table.add_row("already cached", str(plan.cached))
    table.add_row("prompt tokens", str(plan.prompt_tokens))
    table.add_row("completion tokens (max)", str(plan.max_completion_tokens))
    table.add_row("worst-case cost", f"${plan.worst_case_usd:.4f}")
    console.print(table)
    console.print(
        "Planned with rule-based claims, no skipped chunks and one global call per batch of claims; "
        "a judge decomposer changes the claim count.",
        style="dim",
    )


HEADLINE_NAMES = {
    "answer_precision": "answer precision",
    "answer_recall": "answer recall",
    "answer_f1": "answer F1",
    "balanced_accuracy": "balanced accuracy",
    "auroc": "AUROC (answer score)",
    "span_precision": "span precision (chars)",
    "span_recall": "span recall (chars)",
    "span_f1": "span F1 (chars)",
    "mean_iou": "mean IoU",
    "evidence_f1": "evidence F1 (chars)",
    "contradiction_precision": "contradiction precision",
    "contradiction_recall": "contradiction recall",
    "contradiction_f1": "contradiction F1",
    "baseless_f1": "baseless F1",
}
"""Display names of the headline metrics, in display order."""


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _interval(estimate: Estimate) -> str:
    if estimate.low is None or estimate.high is None:
        return ""
    return f"[{estimate.low:.3f}, {estimate.high:.3f}]"


def format_estimate(estimate: Estimate | None) -> str:
    """``value [low, high]`` for a table cell; ``n/a`` when there is no value."""
    if estimate is None or estimate.value is None:
        return "n/a"
    interval = _interval(estimate)
    return f"{_figure(estimate.value)} {interval}" if interval else _figure(estimate.value)


def metric_rows(metrics: EvaluationMetrics) -> list[tuple[str, str, str]]:
    """(metric, value, 95% CI or counts) rows shared by the terminal and Markdown tables."""
    rows = [
        ("samples scored", str(metrics.scored), f"of {metrics.samples}; {metrics.invalid} invalid, "
         f"{metrics.missing} missing"),
        ("gold / predicted hallucinated", f"{metrics.gold_positive} / {metrics.predicted_positive}", ""),
    ]
    for key, name in HEADLINE_NAMES.items():
        estimate = metrics.headline.get(key)
        if estimate is not None:
            rows.append((name, _figure(estimate.value), _interval(estimate)))
    answer, span = metrics.answer, metrics.span
    rows.append(("answer TP / FP / FN", f"{answer.tp} / {answer.fp} / {answer.fn}", ""))
    rows.append(("span chars TP / FP / FN", f"{span.tp} / {span.fp} / {span.fn}" if span else "n/a",
                 "" if span else "claims are not mapped to answer spans (holistic decomposition)"))
    for name, typed in (("contradiction", metrics.contradiction), ("baseless", metrics.baseless)):
        rows.append((f"{name} TP / FP / FN", f"{typed.tp} / {typed.fp} / {typed.fn}" if typed else "n/a",
                     f"over {metrics.typed} samples with typed gold"))
    rows.append(("evidence samples", str(metrics.evidence_samples),
                 "correctly detected contradictions with alignable gold evidence"))
    if len(metrics.by_task_type) > 1:
        for task, result in metrics.by_task_type.items():
            rows.append((f"answer F1 [{task}]", _figure(result.f1), f"P {result.precision:.3f}, R {result.recall:.3f}"))
    claims = metrics.claims
    rows.append(("claims aligned / unaligned", f"{claims.aligned} / {claims.unaligned}",
                 f"{claims.gold_unsupported} gold unsupported"))
    operating = claims.at_operating_point
    rows.append(("claim precision / recall / F1",
                 f"{operating.precision:.3f} / {operating.recall:.3f} / {operating.f1:.3f}", "label != entailed"))
    rows.append(("claim AUROC", _figure(claims.auroc), f"{claims.scored} claims with a confidence"))
    return rows


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


def metrics_markdown(metrics: EvaluationMetrics, title: str, details: dict[str, str] | None = None) -> str:
    """An evaluation's provenance and metrics as a Markdown section."""
    lines = [f"### {title}", ""]
    for key, value in (details or {}).items():
        lines.append(f"- {key}: {value}")
    lines += [
        "",
        f"| metric | value | 95% CI ({metrics.bootstrap_resamples} bootstrap resamples, seed {metrics.seed}) / notes |",
        "|---|---:|---|",
    ]
    lines += [f"| {name} | {value} | {note} |" for name, value, note in metric_rows(metrics)]
    return "\n".join(lines) + "\n"
