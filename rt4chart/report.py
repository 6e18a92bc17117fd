"""Human-readable reports of an audit. Only this module and ``cli.py`` print."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

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
    table.add_row("judge calls", f"{usage.calls} ({usage.cache_hits} from cache)")
    table.add_row("tokens in / out", f"{usage.prompt_tokens} / {usage.completion_tokens}")
    table.add_row("cost", f"${usage.cost_usd:.4f}")
    if len(summary.usage_by_judge) > 1:
        for judge, part in summary.usage_by_judge.items():
            table.add_row(f"  {judge}", f"{part.calls} calls, ${part.cost_usd:.4f}")
    if summary.stopped_by_budget:
        table.add_row("[red]stopped by budget[/red]", f"{summary.remaining} samples not audited")
    console.print(table)
