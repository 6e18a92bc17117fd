"""The ``rt4`` command: a thin shell over the library: it parses flags, calls one library function and
prints (as do the reporting modules: progress, agreement_view, terminal_view, diff_view).

This module is the app: the command group, ``--version``, :func:`main` (the console script) and the
command groups it is made of, one module each: :mod:`~rt4chart.cli.audit` (verify, estimate),
:mod:`~rt4chart.cli.results` (report, export, show, diff, review-plan), :mod:`~rt4chart.cli.evaluation` (eval, score,
convert, calibrate, agree, compare), :mod:`~rt4chart.cli.repair`, :mod:`~rt4chart.cli.judges` (judges, serve,
cache), :mod:`~rt4chart.cli.signals` and :mod:`~rt4chart.cli.config` (rt4 config; the project config
file's settings as every command's flag defaults, applied before a command runs); what they share is in
:mod:`~rt4chart.cli.common`.

Exit codes of ``rt4 verify`` and ``rt4 report`` (the first that applies): 3 stopped early by the
budget; 2 bad input or usage (any invalid input line, unknown judge, missing key, bad flags);
4 audit incomplete (judge errors left a verdict open); 1 the answers fail ``--fail-on`` (default:
at least one answer hallucinated; with ``--max-rate R``, more than a share R of them); 0 they pass.

No flag of an audit or a run is declared in a command: they are fields of
:class:`rt4chart.options.AuditOptions` and :class:`rt4chart.runs.spec.RunSpec`, and
:func:`rt4chart.cli.flags.run_spec` gives a command a flag per field (``--window``, ``--budget``, ...) with
the field's default, docstring and help panel, and calls it with the ``RunSpec`` they make. Modules that
pull in heavy dependencies (nltk, torch, litellm) are imported inside the commands that need them,
so ``rt4 --help``, ``rt4 judges`` and ``rt4 cache`` start quickly (asyncio included: the commands
that run an event loop import it themselves).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from rt4chart.cli import audit, config, evaluation, guard, judges, repair, results, signals
from rt4chart.cli.common import _ReadableGroup
from rt4chart.cli.flags import stderr

app = typer.Typer(
    cls=_ReadableGroup,
    name="rt4",
    help="Audit RAG answers against their context: claim-level verdicts with evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# In this order in `rt4 --help`; a group without a name adds its commands, one with a name (cache,
# signals) is a command with subcommands.
for group in (audit.commands, results.commands, evaluation.commands, repair.commands, judges.commands,
              judges.cache_commands, judges.models_commands, signals.commands, guard.commands, config.commands):
    app.add_typer(group)


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        print(f"rt4chart {version('rt4chart')}")
        raise typer.Exit()


@app.callback()
def _commands(
    ctx: typer.Context,
    _version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Audit RAG answers against their context: claim-level verdicts with evidence."""
    config.apply_project_config(ctx)


def main() -> None:
    """The ``rt4`` command; an exception no command handled exits 2 (a full disk, an unwritable
    output) or 5 (a bug, its traceback in a log), never 1 (:mod:`rt4chart.cli.crash`)."""
    from rt4chart.report.progress import time_runs_from_process_start

    time_runs_from_process_start()
    try:
        app()
    except Exception as error:  # the last stop before a traceback, by design
        from rt4chart.cli.crash import exit_for

        crash = exit_for(error)
        stderr.print(Text.assemble(("error:", "red"), " ", crash.message), highlight=False, soft_wrap=True)
        sys.exit(crash.code)
