"""The pytest plugin, driven through pytester in real pytest processes (the plugin loads from its
``pytest11`` entry point, as in a user's suite; no conftest.py): messages in the terminal and in
JUnit XML, the samples marker, judge failures as errors, budget stops as skips, the HTML report in
a real chromium, pytest-xdist with a shared cache (calls counted at the fault server) and a shared
budget, pytest-asyncio tests, and a session that never audits staying untouched."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from conftest import EXAMPLES
from faults import fault_server, grounded
from test_html_report import OpenedReport, debian_chromium
from test_judge_unavailable import closed_port_url

pytest_plugins = ["pytester"]

RUN_TIMEOUT_S = 300
"""Ceiling on one pytest process (a hung run fails instead of blocking the suite)."""

def module(body: str, **constants: object) -> str:
    """A test module's source: ``constants`` as module-level names, then ``body``."""
    return "".join(f"{name} = {value!r}\n" for name, value in constants.items()) + body


RULES = EXAMPLES / "answers.rules.json"
JUDGE = f"--rt4-judge=scripted:{RULES}"

REFUND = [
    "Laptops bought from our online store can be returned within 30 days of delivery. "
    "The laptop must be in its original packaging.",
    "Refunds are issued to the original payment method within 5 business days after we receive the item.",
]
REFUND_FILE = module("""
from rt4chart.testing.asserts import assert_grounded

def test_grounded():
    assert_grounded("You can return a laptop within 30 days of delivery, in its original packaging.", CONTEXT)

def test_wrong_number():
    assert_grounded("You can return a laptop within 60 days of delivery.", CONTEXT)
""", CONTEXT=REFUND)
SKY = "The sky is blue. Grass is green. Snow is white. Coal is black."


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A test directory of its own; pytest-asyncio's loop scope set so its warning stays out."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    return pytester


def run(suite: pytest.Pytester, *args: str) -> pytest.RunResult:
    return suite.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=RUN_TIMEOUT_S)


def profile_at(directory: Path, name: str, api_base: str) -> Path:
    """A litellm judge profile calling ``api_base`` (an OpenAI-compatible server), retrying fast."""
    path = directory / f"{name}.toml"
    path.write_text(f'name = "{name}"\nmodel = "openai/{name}"\napi_base = "{api_base}"\n'
                    "backoff_s = 0.01\nbackoff_max_s = 0.05\n", encoding="utf-8")
    return path


def test_a_failing_assertion_names_the_claim_and_its_evidence_in_the_terminal_and_in_junit(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(test_refund=REFUND_FILE)
    result = run(suite, JUDGE, "--junitxml=junit.xml")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    claim = "[0] contradicted  You can return a laptop within 60 days of delivery."
    quote = "«Laptops bought from our online store can be returned within 30 days of delivery.»"
    where = "[context 0-80, sentence 0, 1 \u00b7 characters 0\u201380]"  # passage 1 of the two
    assert claim in output and quote in output and where in output
    assert "2 answers audited, 1 with failing claims (1 claims)" in output
    assert "test_refund.py::test_wrong_number: contradicted, 1 claims, 1 failing, " in output
    assert "test_refund.py::test_grounded:" not in output, "without -v only answers with failing claims are listed"
    cases = {case.get("name"): case for case in ElementTree.parse(suite.path / "junit.xml").iter("testcase")}
    failure = cases["test_wrong_number"].find("failure")
    assert failure is not None and cases["test_grounded"].find("failure") is None
    assert "1 of 1 claims not grounded" in failure.get("message", "")
    assert claim in (failure.text or "") and quote in (failure.text or "")


def test_the_samples_marker_runs_a_test_once_per_line_and_an_invalid_line_errors(suite: pytest.Pytester) -> None:
    lines = (EXAMPLES / "answers.jsonl").read_text(encoding="utf-8").splitlines()
    (suite.path / "answers.jsonl").write_text("\n".join([*lines, '{"id": "no-answer", "context": "x"}']) + "\n",
                                              encoding="utf-8")
    suite.makepyfile(test_file="""
import pytest
from rt4chart.testing.asserts import assert_grounded

@pytest.mark.rt4_samples("answers.jsonl")
def test_answer(rt4_sample):
    assert_grounded(rt4_sample.answer, rt4_sample.context, rt4_sample.question)
""")
    result = run(suite, JUDGE, "-v")
    # refund-faithful holds; the other three example answers hallucinate; the last line is no sample.
    result.assert_outcomes(passed=1, failed=3, errors=1)
    output = result.stdout.str()
    for sample_id in ("refund-faithful", "refund-wrong-number", "battery-unsupported", "paper-running-example"):
        assert f"test_answer[{sample_id}]" in output
    assert f"answers.jsonl line {len(lines) + 1}: answer: Field required" in output


def test_an_unreachable_judge_stops_the_session_as_a_usage_error_named_once(suite: pytest.Pytester) -> None:
    url = closed_port_url()
    profile = profile_at(suite.path, "closed", url)
    suite.makepyfile(test_refund=REFUND_FILE.replace(", CONTEXT)", ", CONTEXT, decomposer='rules')"))
    (suite.path / "test_second.py").write_text(REFUND_FILE.replace(", CONTEXT)", ", CONTEXT, decomposer='rules')")
                                             .replace("def test_", "def test_more_"), encoding="utf-8")
    result = run(suite, f"--rt4-judge={profile}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert output.count("rt4chart: the judge cannot be reached") == 1 and url in output
    outcomes = result.parseoutcomes()
    # The circuit opens after 3 failed requests: the audit that met them first may be its test's error
    # (a verdict left open); the open circuit then stops the session before the other tests run.
    assert outcomes.get("errors", 0) <= 1 and "passed" not in outcomes and "failed" not in outcomes
    assert "test_more_wrong_number" not in output, "the session stopped before its last test"
    assert "AssertionError" not in output, "not a finding"


def test_an_unreachable_judge_stops_an_xdist_session_as_a_usage_error_named_once(suite: pytest.Pytester) -> None:
    profile = profile_at(suite.path, "closed", closed_port_url())
    for module_number in range(4):
        (suite.path / f"test_refund_{module_number}.py").write_text(
            REFUND_FILE.replace(", CONTEXT)", ", CONTEXT, decomposer='rules')")
            .replace("def test_", f"def test_{module_number}_"), encoding="utf-8")
    result = run(suite, "-n", "2", f"--rt4-judge={profile}")
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert output.count("rt4chart: the judge cannot be reached") == 1
    assert "passed" not in result.parseoutcomes() and "failed" not in result.parseoutcomes()


@pytest.mark.parametrize(
    ("judge", "message"),
    [("gpt4o-mini", "unknown judge"), ("gpt-4o-mini", "OPENAI_API_KEY")],
)
def test_a_judge_that_cannot_be_configured_is_a_usage_error_before_any_test(
    suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, judge: str, message: str
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    suite.makepyfile(test_refund=REFUND_FILE)
    result = run(suite, f"--rt4-judge={judge}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = result.stderr.str()
    assert errors.count("the session's judge cannot be used") == 1 and message in errors
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()


def judges_of(records: Path) -> set[str]:
    return {json.loads(line)["judge"] for line in records.read_text(encoding="utf-8").splitlines()}


def test_the_project_config_file_gives_the_judge_and_a_flag_overrides_it(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_refund=REFUND_FILE)
    (suite.path / "rt4chart.toml").write_text(f'judge = "scripted:{RULES}"\n', encoding="utf-8")
    from_file = run(suite, "--rt4-out=file.jsonl")
    from_file.assert_outcomes(passed=1, failed=1)
    assert {judge.split("#")[0] for judge in judges_of(suite.path / "file.jsonl")} == {f"scripted:{RULES.name}"}
    from_flag = run(suite, "--rt4-judge=embedded", "--rt4-out=flag.jsonl")
    assert {judge.split("#")[0] for judge in judges_of(suite.path / "flag.jsonl")} == {"embedded"}
    assert from_flag.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)


def test_a_bad_project_config_file_is_a_usage_error_naming_file_and_key(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_refund=REFUND_FILE)
    (suite.path / "pyproject.toml").write_text('[tool.rt4chart]\njudgee = "embedded"\n', encoding="utf-8")
    result = run(suite)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = result.stderr.str()
    assert "pyproject.toml" in errors and "unknown key 'judgee'" in errors
    assert "passed" not in result.stdout.str() and "failed" not in result.stdout.str()


def test_a_failing_assertion_shows_no_rt4chart_frames(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_refund=REFUND_FILE)
    result = run(suite, JUDGE, "--tb=long")
    result.assert_outcomes(passed=1, failed=1)
    output = result.stdout.str()
    failing_line = REFUND_FILE.splitlines().index('    assert_grounded("You can return a laptop within 60 days '
                                                  'of delivery.", CONTEXT)') + 1
    assert f"test_refund.py:{failing_line}: GroundingError" in output, "the test's own line is the last frame"
    assert "rt4chart/testing" not in output and "asserts.py" not in output


def test_a_budget_stop_skips_the_remaining_audits_with_the_reason(suite: pytest.Pytester, tmp_path: Path) -> None:
    paid = tmp_path / "paid.rules.json"
    paid.write_text(json.dumps({**json.loads(RULES.read_text(encoding="utf-8")), "cost_per_call": 0.01}),
                    encoding="utf-8")
    tests = 6
    suite.makepyfile(test_many=module("""
import pytest
from rt4chart.testing.asserts import assert_grounded

@pytest.mark.parametrize("attempt", range(TESTS))
def test_refund(attempt):
    assert_grounded("You can return a laptop within 30 days of delivery, in its original packaging.", CONTEXT)

def test_a_budget_of_its_own():  # not the session's: its stop fails the test like any exception
    import rt4chart
    rt4chart.verify({"id": "own", "context": CONTEXT, "answer": "Laptops can be returned."}, JUDGE, budget=0.0)
""", TESTS=tests, CONTEXT=REFUND, JUDGE=f"scripted:{paid}"))
    budget = 0.05
    result = run(suite, f"--rt4-judge=scripted:{paid}", f"--rt4-budget={budget}", "-rfs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 1 and outcomes.get("skipped", 0) >= 1 and outcomes.get("failed") == 1
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) == tests
    result.stdout.fnmatch_lines(
        ["FAILED test_many.py::test_a_budget_of_its_own - rt4chart.protocol.BudgetExha*"]
    )
    output = result.stdout.str()
    assert "rt4chart budget:" in output and "would cross the budget" in output
    assert f"{outcomes['skipped'] - 1} audits skipped" in output  # the first skip is the stop itself
    spent = float(re.search(r"budget: \$([0-9.]+) spent of \$", output).group(1))  # type: ignore[union-attr]
    assert 0 < spent <= budget


def test_the_report_option_writes_the_sessions_audits_as_one_html_report(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_refund=REFUND_FILE)
    result = run(suite, JUDGE, "--rt4-report=audits.html", "--rt4-out=audits.jsonl", "-v")
    result.assert_outcomes(passed=1, failed=1)
    assert "test_refund.py::test_grounded: entailed, 1 claims, 0 failing" in result.stdout.str()  # -v: every answer
    records = [json.loads(line) for line in (suite.path / "audits.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["id"], r["line"], r["label"]) for r in records] == [
        ("test_refund.py::test_grounded", 1, "entailed"), ("test_refund.py::test_wrong_number", 2, "contradicted"),
    ]
    with debian_chromium() as browser:
        report = OpenedReport(browser, suite.path / "audits.html")
        card = report.page.locator(report.card("test_refund.py::test_wrong_number"))
        text = card.inner_text()
    assert "You can return a laptop within 60 days of delivery." in text and "contradicted" in text
    assert report.errors == [] and all(url.startswith("file:") for url in report.requests)


def test_xdist_workers_share_a_warm_cache_and_make_no_judge_call(suite: pytest.Pytester) -> None:
    answers = SKY.split(". ")
    suite.makepyfile(test_sky=module("""
import pytest
from rt4chart.testing.asserts import assert_grounded

@pytest.mark.parametrize("answer", ANSWERS)
def test_sky(answer):
    assert_grounded(answer, CONTEXT, decomposer="rules")
""", ANSWERS=answers, CONTEXT=SKY))
    with fault_server(grounded) as server:
        profile = profile_at(suite.path, "recording", server.base_url)
        options = (f"--rt4-judge={profile}", f"--rt4-cache-dir={suite.path / 'cache'}")
        warm = run(suite, *options)
        warm.assert_outcomes(passed=len(answers))
        calls = len(server.requests)
        assert calls > 0
        distributed = run(suite, *options, "-n", "2")
        distributed.assert_outcomes(passed=len(answers))
        assert len(server.requests) == calls, "every call came from the shared cache"
    output = distributed.stdout.str()
    assert "2 workers" in output
    summary = f"{len(answers)} answers audited, 0 with failing claims (0 claims); judge calls 0, cache hits {calls}"
    assert summary in output


def test_one_budget_holds_across_xdist_workers(suite: pytest.Pytester, tmp_path: Path) -> None:
    paid = tmp_path / "paid.rules.json"
    paid.write_text(json.dumps({**json.loads(RULES.read_text(encoding="utf-8")), "cost_per_call": 0.01}),
                    encoding="utf-8")
    suite.makepyfile(test_many=module("""
import pytest
from rt4chart.testing.asserts import assert_grounded

@pytest.mark.parametrize("attempt", range(8))
def test_refund(attempt):
    assert_grounded("You can return a laptop within 30 days of delivery, in its original packaging.", CONTEXT)
""", CONTEXT=REFUND))
    # One audit (three calls) costs more than half the budget: two workers with a budget each would
    # both finish one. With one budget at most one finishes; none does when the two workers'
    # audits interleave and the third call of each finds the budget taken.
    budget = 0.045
    result = run(suite, f"--rt4-judge=scripted:{paid}", f"--rt4-budget={budget}", "-n", "2", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) <= 1 and outcomes.get("passed", 0) + outcomes.get("skipped", 0) == 8
    assert "rt4chart budget:" in result.stdout.str()
    spent = float(re.search(r"budget: \$([0-9.]+) spent of \$", result.stdout.str()).group(1))  # type: ignore[union-attr]
    assert 0 < spent <= budget


def test_async_tests_and_sync_assertions_inside_their_loops(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_async=module("""
import pytest
from rt4chart.testing.asserts import aassert_grounded, assert_grounded

@pytest.mark.asyncio
async def test_async_assertion():
    await aassert_grounded("The sky is blue.", CONTEXT, decomposer="rules")

@pytest.mark.asyncio
async def test_sync_assertion_in_a_running_loop():
    assert_grounded("Grass is green.", CONTEXT, decomposer="rules")

@pytest.mark.asyncio
async def test_async_failure():
    await aassert_grounded("The sky is green.", CONTEXT, decomposer="rules")

def test_the_session_judge_as_a_fixture(rt4_judge):
    assert type(rt4_judge).__name__ == "JudgeStack" and rt4_judge.name.startswith("recording@")
    assert_grounded("Snow is white.", CONTEXT, judge=rt4_judge, decomposer="rules")
""", CONTEXT=SKY))
    with fault_server(grounded) as server:
        profile = profile_at(suite.path, "recording", server.base_url)
        result = run(suite, f"--rt4-judge={profile}", "-W", "error::RuntimeWarning")
    result.assert_outcomes(passed=3, failed=1)
    output = result.stdout.str() + result.stderr.str()
    assert "[0] baseless  The sky is green." in output
    assert "4 answers audited, 1 with failing claims (1 claims)" in output  # the fixture's audit too
    for trouble in ("Event loop is closed", "Task was destroyed", "was never awaited", "Unclosed", "unclosed"):
        assert trouble not in output


def test_a_session_that_never_audits_is_left_alone(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_plain="""
import sys, threading

def test_plain():
    assert "rt4chart.testing.asserts" not in sys.modules
    assert not [t for t in threading.enumerate() if t.name == "rt4chart-judge"]
""")
    result = run(suite)
    result.assert_outcomes(passed=1)
    assert "rt4chart" not in result.stdout.str().split("collected", 1)[1]


def test_the_example_test_file_runs_offline(suite: pytest.Pytester) -> None:
    for name in ("test_rag_answers.py", "answers.jsonl", "answers.rules.json"):
        shutil.copy(EXAMPLES / name, suite.path / name)
    result = run(suite, f"--rt4-judge=scripted:{suite.path / 'answers.rules.json'}")
    result.assert_outcomes(passed=6)


@pytest.mark.parametrize(
    ("options", "message"),
    [(["--rt4-budget=nan"], "--rt4-budget must be a finite amount"),
     (["--rt4-budget=-1"], "--rt4-budget must be a finite amount"),
     (["--rt4-cache-dir=cache", "--rt4-cache-url=redis://127.0.0.1:1/0"], "not both")],
)
def test_options_that_make_no_sense_are_refused_before_any_test(
    suite: pytest.Pytester, options: list[str], message: str
) -> None:
    suite.makepyfile(test_refund=REFUND_FILE)
    result = run(suite, JUDGE, *options)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str() and "passed" not in result.stdout.str()
