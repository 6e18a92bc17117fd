"""One outcome for every run: ``rt4 verify``, ``eval``, ``compare`` and ``repair`` each end in a
:class:`rt4chart.runs.run.RunOutcome` (what the command produced is its payload), and each one's exit
status is decided by the one function, :func:`rt4chart.runs.run.status_of`."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.records.io import read_jsonl
from rt4chart.records.manifest import RunCounts
from rt4chart.runs import run
from rt4chart.runs.engine import BudgetStop, UnavailableStop
from rt4chart.runs.run import RunSpec, RunStatus, exit_code

ANSWERS = EXAMPLES / "answers.jsonl"
JUDGE = f"scripted:{EXAMPLES / 'answers.rules.json'}"
OTHER_JUDGE = f"scripted:{EXAMPLES / 'cited_answers.rules.json'}"
DATASETS = Path(__file__).parent / "fixtures" / "datasets"
EVAL_JUDGE = f"scripted:{DATASETS / 'fixtures.rules.json'}"


def _other_commands(tmp_path: Path, verified: Path) -> dict[str, list[str]]:
    """The arguments of ``rt4 compare``, ``repair`` (of ``verified``'s records) and ``eval`` on the examples."""
    return {
        "compare": ["compare", str(ANSWERS), "--judges", f"{JUDGE},{OTHER_JUDGE}", "--no-cache",
                    "--out-dir", str(tmp_path / "compared"), "--resamples", "10"],
        "repair": ["repair", str(verified), "--input", str(ANSWERS), "--judge", JUDGE, "--no-cache",
                   "--out", str(tmp_path / "repaired.jsonl"), "--verify-after"],
        "eval": ["eval", "ragtruth-qa", "--path", str(DATASETS / "ragtruth-qa"), "--split", "dev",
                 "--judge", EVAL_JUDGE, "--results-dir", str(tmp_path / "results"), "--resamples", "10"],
    }


def test_every_command_s_run_ends_in_the_one_outcome_type_with_its_payload(tmp_path: Path) -> None:
    from rt4chart.runs.compare import Comparison, acompare
    from rt4chart.runs.evaluation import EvalConfig, EvaluationResult, aevaluate, load_samples
    from rt4chart.runs.repair import Repairs, arepair
    from rt4chart.runs.run import RunOutcome, aexecute, run_sync

    samples = list(read_jsonl(ANSWERS))
    spec = RunSpec(judge=JUDGE, input_file=ANSWERS)
    verified = run_sync(aexecute(spec, samples))
    compared = run_sync(acompare(spec, [JUDGE, OTHER_JUDGE], samples, tmp_path / "compared", resamples=10))
    repaired = run_sync(arepair(spec, verified.reports, samples, "remove"))
    config = EvalConfig(dataset="ragtruth-qa", path=str(DATASETS / "ragtruth-qa"), split="dev", resamples=10)
    evaluated = run_sync(aevaluate(RunSpec(judge=EVAL_JUDGE), config, load_samples(config)))

    outcomes = {"verify": verified, "compare": compared, "repair": repaired, "eval": evaluated}
    assert all(isinstance(outcome, RunOutcome) for outcome in outcomes.values()), outcomes
    payloads = {name: type(outcome.payload) for name, outcome in outcomes.items()}
    assert payloads == {"verify": type(None), "compare": Comparison, "repair": Repairs, "eval": EvaluationResult}
    for outcome in outcomes.values():
        assert outcome.status is run.status_of(outcome.counts, outcome.stop, outcome.fails)
        assert outcome.exit_code == exit_code(outcome.status)
    # The examples hold hallucinated answers (verify: 1); the rest measure or edit them (0).
    assert {name: outcome.exit_code for name, outcome in outcomes.items()} == {
        "verify": 1, "compare": 0, "repair": 0, "eval": 0
    }
    assert len(compared.payload.by_judge) == 2 and len(compared.payload.agreement) == 2
    assert len(repaired.payload.records) == len(samples)


def test_every_command_exits_with_the_status_that_status_of_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stand-in ``status_of`` that says "stopped by the budget" (no run here has a budget) makes
    every command exit 3: no command decides its status anywhere else."""
    cli = CliRunner()
    verified = tmp_path / "verified.jsonl"
    made = cli.invoke(app, ["verify", str(ANSWERS), "--judge", JUDGE, "--no-cache", "--out", str(verified), "-q"])
    assert made.exit_code == 1, made.output
    decided: list[RunCounts] = []

    def stopped_by_budget(counts: RunCounts, stop: BudgetStop | UnavailableStop | None, fails: bool) -> RunStatus:
        decided.append(counts)
        return RunStatus.STOPPED_BY_BUDGET

    monkeypatch.setattr(run, "status_of", stopped_by_budget)
    commands = {
        "verify": ["verify", str(ANSWERS), "--judge", JUDGE, "--no-cache", "--out", str(tmp_path / "again.jsonl")],
        **_other_commands(tmp_path, verified),
    }
    exits = {}
    for name, args in commands.items():
        before = len(decided)
        exits[name] = cli.invoke(app, [*args, "-q"]).exit_code
        assert len(decided) > before, f"rt4 {name} decided its status without status_of"
    assert exits == dict.fromkeys(commands, exit_code(RunStatus.STOPPED_BY_BUDGET))


def test_every_command_s_last_stderr_line_is_its_run_s_reason(tmp_path: Path) -> None:
    """``rt4 compare``, ``repair`` and ``eval`` end, like ``rt4 verify``, with the run layer's one
    line saying why they passed or failed (issue 46): a repair whose re-audit still flags an answer
    fails and says how many."""
    cli = CliRunner()
    verified = tmp_path / "verified.jsonl"
    made = cli.invoke(app, ["verify", str(ANSWERS), "--judge", JUDGE, "--no-cache", "--out", str(verified)])
    assert made.exit_code == 1, made.output
    commands = _other_commands(tmp_path, verified)
    last = {}
    for name, args in commands.items():
        done = cli.invoke(app, args)
        last[name] = (done.exit_code, " ".join(done.stderr.strip().splitlines()[-1].split()))
    assert last["compare"][0] == 0 and last["compare"][1].startswith("passed: 2 judges verified the same claims of 4")
    eval_exit, eval_line = last["eval"]
    assert eval_exit == 0 and eval_line.startswith("passed: ") and "scored against their gold" in eval_line
    repair_exit, repair_line = last["repair"]
    assert repair_line.startswith(("passed: none of the", "failed: ")), repair_line
    assert (repair_exit == 1) == repair_line.startswith("failed: ")
