"""The pytest plugin as a CI gate: a session whose budget refused audits fails (exit 1, a line saying
why), whatever its tests' outcomes, unless ``--rt4-allow-budget-skips`` or the ini option
``rt4_allow_budget_skips`` accepts the skips. Real pytest processes (pytester), a scripted judge that
charges for its calls, a tiny budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_pytest_plugin import REFUND, RULES, module, run, suite

pytest_plugins = ["pytester"]
__all__ = ["suite"]  # the fixture, used here by name

FAILED_LINE = "rt4chart: session FAILED: the budget refused *audits, so their tests were skipped unaudited*"

TESTS = module("""
import pytest
from rt4chart.testing import assert_grounded

@pytest.mark.parametrize("attempt", range(4))
def test_refund(attempt):
    assert_grounded("You can return a laptop within 30 days of delivery, in its original packaging.", CONTEXT)
""", CONTEXT=REFUND)


def paid_judge(directory: Path) -> str:
    """The example rules as a judge that charges $0.01 a call (one audit makes three calls)."""
    paid = directory / "paid.rules.json"
    paid.write_text(json.dumps({**json.loads(RULES.read_text(encoding="utf-8")), "cost_per_call": 0.01}),
                    encoding="utf-8")
    return f"--rt4-judge=scripted:{paid}"


@pytest.mark.parametrize(
    ("budget", "workers"),
    [("0.035", []), ("0", []), ("0.035", ["-n", "2"])],
    ids=["stopped-half-way", "nothing-audited", "xdist"],
)
def test_a_session_whose_budget_refused_audits_fails_with_the_reason(
    suite: pytest.Pytester, tmp_path: Path, budget: str, workers: list[str]
) -> None:
    suite.makepyfile(test_many=TESTS)
    result = run(suite, paid_judge(tmp_path), f"--rt4-budget={budget}", *workers)
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("skipped", 0) >= 1, "no test failed: only the gate"
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([FAILED_LINE])
    assert "--rt4-allow-budget-skips" in result.stdout.str()


@pytest.mark.parametrize(
    ("options", "ini"),
    [(["--rt4-allow-budget-skips"], ""), ([], "rt4_allow_budget_skips = true\n")],
    ids=["option", "ini"],
)
def test_an_explicit_opt_out_lets_a_session_stopped_by_its_budget_pass(
    suite: pytest.Pytester, tmp_path: Path, options: list[str], ini: str
) -> None:
    suite.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n" + ini)
    suite.makepyfile(test_many=TESTS)
    result = run(suite, paid_judge(tmp_path), "--rt4-budget=0.035", *options)
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) >= 1 and outcomes.get("failed", 0) == 0
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*audits refused by the budget were accepted as skips (--rt4-allow-budget-skips)"])
    assert "session FAILED" not in result.stdout.str()


def test_a_session_within_its_budget_passes(suite: pytest.Pytester, tmp_path: Path) -> None:
    suite.makepyfile(test_many=TESTS)
    result = run(suite, paid_judge(tmp_path), "--rt4-budget=1")
    result.assert_outcomes(passed=4)
    assert result.ret == pytest.ExitCode.OK and "session FAILED" not in result.stdout.str()
