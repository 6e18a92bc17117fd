"""Progress and summary output of an audit."""

from __future__ import annotations

import io

from rich.console import Console

from rt4chart.budget import Ledger
from rt4chart.report import AuditProgress, RunSummary, print_summary
from rt4chart.types import Label, Report, Usage


def finished(label: Label, calls: int, hits: int) -> Report:
    return Report(id="x", line=1, label=label, hallucinated=label != Label.ENTAILED,
                  usage=Usage(calls=calls, cache_hits=hits, cost_usd=0.01 * calls))


def test_plain_progress_lines_when_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    ledger = Ledger(limit_usd=1.0, spent_usd=0.25, in_flight=3)
    summary = RunSummary()
    with AuditProgress(4, ledger, Console(file=stream, force_terminal=False), log_every_s=0) as progress:
        for report in (finished(Label.ENTAILED, 3, 1), finished(Label.BASELESS, 0, 4)):
            summary.add(report)
            progress.advance(summary)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[-1].startswith("rt4: 2/4 samples")
    assert "3 calls in flight" in lines[-1] and "$0.2500 of $1.0000" in lines[-1]
    assert "cache hits 62%" in lines[-1], "5 hits of 8 lookups"


def test_progress_leaves_out_calls_it_cannot_see() -> None:
    """With --engine ray the workers make the calls: the driver's line must not claim 0 in flight."""
    stream = io.StringIO()
    ledger = Ledger(limit_usd=1.0, spent_usd=0.25, in_flight=0)
    console = Console(file=stream, force_terminal=False)
    with AuditProgress(1, ledger, console, log_every_s=0, calls_seen=False) as progress:
        summary = RunSummary()
        summary.add(finished(Label.ENTAILED, 2, 0))
        progress.advance(summary)
    line = stream.getvalue().strip()
    assert line.startswith("rt4: 1/1 samples") and "$0.2500 of $1.0000" in line
    assert "in flight" not in line


def test_quiet_progress_prints_nothing() -> None:
    stream = io.StringIO()
    summary = RunSummary()
    with AuditProgress(1, Ledger(), Console(file=stream), enabled=False, log_every_s=0) as progress:
        summary.add(finished(Label.ENTAILED, 1, 0))
        progress.advance(summary)
    assert stream.getvalue() == ""


def test_live_bar_on_a_terminal() -> None:
    stream = io.StringIO()
    summary = RunSummary()
    console = Console(file=stream, force_terminal=True, width=160)
    with AuditProgress(2, Ledger(), console, log_every_s=0) as progress:
        summary.add(finished(Label.CONTRADICTED, 2, 0))
        progress.advance(summary)
        progress._bar.refresh()  # type: ignore[union-attr]
    assert "auditing" in stream.getvalue() and "1/2" in stream.getvalue()


def test_summary_reports_budget_stop_and_spend() -> None:
    stream = io.StringIO()
    summary = RunSummary(stopped_by_budget=True, remaining=7, spent_usd=0.19, budget_usd=0.2)
    summary.add(finished(Label.CONTRADICTED, 4, 0))
    print_summary(summary, Console(file=stream, width=120))
    text = stream.getvalue()
    assert "7 samples not audited" in text and "$0.1900 of $0.2000" in text
