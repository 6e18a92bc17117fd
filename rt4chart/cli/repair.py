"""``rt4 repair``: repair the flagged answers of verify records (remove, extract or rewrite their
unsupported sentences), optionally re-audit them, and print what the repair kept."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from rt4chart.cli.common import _guard_outputs, _print_reason, _read_input, _run
from rt4chart.cli.flags import AUDIT_FLAGS, CACHE_FLAGS, fail, run_spec, stderr
from rt4chart.options import HelpPanel
from rt4chart.runs.spec import RunSpec

if TYPE_CHECKING:
    from rt4chart.method.repair import RepairSummary
    from rt4chart.types import AuditRecord

commands = typer.Typer()


def _read_verify_records(path: Path) -> list[AuditRecord | str]:
    """Each non-blank line of a file of ``rt4 verify`` records: the record, or why it is not one."""
    from rt4chart.records.io import read_records

    return [r.report or f"{path.name} line {r.number}: not an rt4 verify record ({r.problem})" for r in read_records(path)]


def _print_repair_summary(summary: RepairSummary, verify_judge: str | None) -> None:
    def share(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    # Short headers keep the table readable in 80 columns; the caption says what they mean.
    table = Table("answers", "edited", "empty", "text kept", "claims kept", "still flagged", "unsupported",
                  "clean edited", title=f"rt4 repair --strategy {summary.strategy}",
                  caption="kept: retention; still flagged / unsupported: answers / claims after re-audit; "
                          "clean edited: gold-clean answers edited")
    table.add_row(
        f"{summary.answers - summary.invalid} (+{summary.invalid} invalid)" if summary.invalid else str(summary.answers),
        str(summary.edited),
        str(summary.empty),
        share(summary.text_retention),
        share(summary.claim_retention),
        f"{summary.residual_hallucinated}/{summary.reverified} = {share(summary.residual_rate)}"
        if summary.reverified else "-",
        share(summary.residual_claim_rate),
        f"{summary.gold_clean_edited}/{summary.gold_clean}" if summary.gold_clean else "-",
    )
    stderr.print(table)
    if verify_judge:
        stderr.print(f"re-audited by {verify_judge}; empty repairs are not re-audited", highlight=False, markup=False)


@commands.command()
@run_spec("api_base", "limits.concurrency", "limits.batch", "limits.batch_poll_s", *CACHE_FLAGS, *AUDIT_FLAGS)
def repair(
    verified: Annotated[Path, typer.Argument(metavar="VERIFIED.jsonl", help="Output records of rt4 verify.")],
    strategy: Annotated[str, typer.Option(help="remove, extract or rewrite (rewrite needs --judge).")] = "remove",
    input_path: Annotated[Path | None, typer.Option("--input", help="The samples JSONL that was verified: verify records hold neither the answer nor the context.")] = None,
    judge: Annotated[str | None, typer.Option(help="Judge that rewrites sentences (rewrite; remove/extract: sentences whose claims are not clauses). Must write text: not the embedded verifier.", rich_help_panel=HelpPanel.JUDGE)] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Output JSONL (default: stdout).")] = None,
    verify_after: Annotated[bool, typer.Option("--verify-after", help="Re-audit the repaired answers (with the audit options) and report the residual hallucination rate.")] = False,
    verify_judge: Annotated[str | None, typer.Option(help="Judge of the re-audit (default: --judge, else the embedded verifier).", rich_help_panel=HelpPanel.JUDGE)] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Keep the finished repair records already in --out; repair only the rest.", rich_help_panel=HelpPanel.RESUME)] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No summary on stderr.")] = False,
    *,
    spec: RunSpec,
) -> None:
    """Repair the flagged answers of VERIFIED.jsonl; one record per verify record: original, repaired, edits.

    Exit codes: 0 done; 1 with --verify-after, some repaired answer is still flagged; 2 bad input or usage;
    3 stopped by the budget; 4 the repairing or re-auditing judge could not be reached or left verdicts open.
    """
    from rt4chart.method.repair import STRATEGIES
    from rt4chart.runs.repair import arepair

    if strategy not in STRATEGIES:
        raise fail(f"--strategy must be one of {', '.join(STRATEGIES)} (got {strategy!r})")
    chosen = STRATEGIES[STRATEGIES.index(strategy)]  # the same string, typed as a strategy
    if strategy == "rewrite" and judge is None:
        raise fail("--strategy rewrite needs --judge: a judge that writes text")
    if input_path is None:
        raise fail("--input SAMPLES.jsonl is required: rt4 verify records hold neither the answer nor the context")
    if not verified.is_file():
        raise fail(f"verify records not found: {verified}")
    out = _guard_outputs({"--out": out}, [verified, input_path]).get("--out")
    items = _read_input(input_path)
    records = _read_verify_records(verified)
    if not records:
        raise fail(f"the verify records {verified} hold no record (the file is empty or blank)")
    spec = spec.model_copy(update={"judge": judge, "out": out, "resume": resume})
    outcome = _run(arepair(spec, records, items, chosen, input_name=input_path.name, verify_after=verify_after,
                           verify_judge=verify_judge, stdout=sys.stdout), out)
    repairs = outcome.payload
    if not quiet:
        judged_by = next((r.verified_after.judge for r in repairs.records if r.verified_after), None)
        _print_repair_summary(repairs.summary, judged_by)
    if repairs.summary.invalid:
        for result in repairs.records:
            if result.repaired is None:
                stderr.print(Text.assemble(("error:", "red"), " " + "; ".join(result.errors)), highlight=False, soft_wrap=True)
    _print_reason(outcome, note="the repairs are written; rerun once the judge is reachable")
    raise typer.Exit(outcome.exit_code)
