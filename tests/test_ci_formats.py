"""CI formats through the real CLI: JUnit XML read back by junitparser and validated against the
JUnit schema, GitHub Actions annotations on the offending input lines, and the exit-code policy
(``--fail-on``, ``--max-rate``) of ``rt4 verify`` and ``rt4 report``."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import xmlschema
from fixtures.reports.runs import ANSWERS, JUNIT_SCHEMA, RULES, copy_answers, read_records, rt4, verify
from junitparser import Error, Failure, JUnitXml

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding answers.jsonl (three samples) and the results of auditing them."""
    directory = tmp_path_factory.mktemp("audited")
    completed = verify(directory)
    assert completed.returncode == EXIT_FAIL, completed.stderr
    return directory


def test_junit_has_one_case_per_line_failures_for_hallucinated_and_errors_for_invalid(tmp_path: Path) -> None:
    completed = verify(tmp_path, "--junit", "junit.xml", with_invalid_line=True)
    assert completed.returncode == EXIT_USAGE, completed.stderr  # an invalid line outranks hallucination
    junit = tmp_path / "junit.xml"
    xmlschema.XMLSchema(JUNIT_SCHEMA).validate(junit)
    xml = JUnitXml.fromfile(str(junit))
    [suite] = list(xml)
    cases = {case.name: case for case in suite}
    assert list(cases) == ["paris", "berlin-wrong", "script-injection", "no-answer"]
    assert (suite.tests, suite.failures, suite.errors) == (4, 2, 1)
    assert cases["paris"].is_passed
    [failure] = cases["berlin-wrong"].result
    assert isinstance(failure, Failure) and failure.type == "contradicted"
    assert failure.message == "line 2: contradicted, 1 of 2 claims not entailed"
    assert "[contradicted] claim 1: It has 10 million inhabitants." in failure.text
    assert 'evidence (context ' in failure.text and '"It has 3.7 million inhabitants."' in failure.text
    [baseless] = cases["script-injection"].result
    assert isinstance(baseless, Failure) and baseless.type == "baseless"
    assert "<script>window.__pwned = 'answer'</script>" in baseless.text  # escaped in XML, intact when read
    [error] = cases["no-answer"].result
    assert isinstance(error, Error) and error.type == "invalid input" and "answer" in error.message


def test_junit_with_fail_on_contradicted_lets_baseless_answers_pass(audited: Path) -> None:
    completed = rt4("report", "results.jsonl", "--input", "answers.jsonl", "--junit", "junit.xml",
                    "--fail-on", "contradicted", cwd=audited)
    assert completed.returncode == EXIT_FAIL, completed.stderr
    xmlschema.XMLSchema(JUNIT_SCHEMA).validate(audited / "junit.xml")
    [suite] = list(JUnitXml.fromfile(str(audited / "junit.xml")))
    assert (suite.tests, suite.failures, suite.errors) == (3, 1, 0)
    assert [case.name for case in suite if not case.is_passed] == ["berlin-wrong"]


def _unescape(text: str) -> str:
    return text.replace("%0A", "\n").replace("%0D", "\r").replace("%3A", ":").replace("%2C", ",").replace("%25", "%")


ANNOTATION = re.compile(
    r"^::(?P<level>error|warning) file=(?P<file>[^,]+),line=(?P<line>\d+),title=(?P<title>[^:]*)::(?P<message>.*)$"
)


def test_github_annotations_point_at_the_offending_input_lines(tmp_path: Path) -> None:
    completed = verify(tmp_path, "--github", "--fail-on", "contradicted", with_invalid_line=True)
    assert completed.returncode == EXIT_USAGE, completed.stderr
    annotations = [ANNOTATION.match(line) for line in completed.stdout.splitlines()]
    assert all(annotations), completed.stdout
    found = {(m["level"], m["file"], int(m["line"]), _unescape(m["title"])) for m in annotations if m}
    assert found == {
        ("error", "answers.jsonl", 2, "rt4chart: contradicted (berlin-wrong)"),
        ("warning", "answers.jsonl", 3, "rt4chart: baseless (script-injection)"),  # --fail-on contradicted
        ("error", "answers.jsonl", 4, "rt4chart: not judged (no-answer)"),
    }
    berlin = next(m for m in annotations if m and m["line"] == "2")
    assert "\n" not in berlin["message"]  # one workflow command per line
    assert _unescape(berlin["message"]).splitlines()[0] == "[contradicted] claim 1: It has 10 million inhabitants."
    assert '"It has 3.7 million inhabitants."' in _unescape(berlin["message"])


def test_github_without_out_is_a_usage_error_and_with_dev_null_only_annotations(tmp_path: Path) -> None:
    # Workflow commands are read from stdout; records there too would make one stream that is
    # neither JSONL nor clean annotations: refused before any work, and --out /dev/null keeps none.
    copy_answers(tmp_path)
    audit = ("verify", "answers.jsonl", "--judge", f"scripted:{RULES}", "--no-cache", "--quiet", "--github")
    mixed = rt4(*audit, cwd=tmp_path)
    assert mixed.returncode == EXIT_USAGE and mixed.stdout == "", mixed.stdout
    assert "--github" in mixed.stderr and "--out" in mixed.stderr and "Traceback" not in mixed.stderr
    annotations_only = rt4(*audit, "--out", os.devnull, cwd=tmp_path)
    assert annotations_only.returncode == EXIT_FAIL, annotations_only.stderr
    lines = annotations_only.stdout.splitlines()
    assert lines and all(ANNOTATION.match(line) for line in lines), annotations_only.stdout


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), EXIT_FAIL),  # default: any hallucinated answer fails (2 of 3)
        (("--fail-on", "never"), EXIT_OK),
        (("--fail-on", "contradicted"), EXIT_FAIL),  # 1 of 3 contradicted
        (("--max-rate", "0.7"), EXIT_OK),  # 2/3 hallucinated does not exceed 0.7
        (("--max-rate", "0.6"), EXIT_FAIL),
        (("--fail-on", "contradicted", "--max-rate", "0.34"), EXIT_OK),  # 1/3 does not exceed 0.34
        (("--fail-on", "contradicted", "--max-rate", "0.3"), EXIT_FAIL),
        (("--max-rate", "1.5"), EXIT_USAGE),
        (("--fail-on", "sometimes"), EXIT_USAGE),
    ],
)
def test_report_exit_code_follows_fail_on_and_max_rate(audited: Path, flags: tuple[str, ...], expected: int) -> None:
    completed = rt4("report", "results.jsonl", "--junit", "junit.xml", *flags, cwd=audited)
    assert completed.returncode == expected, completed.stderr


def test_verify_applies_the_same_policy(tmp_path: Path) -> None:
    completed = verify(tmp_path, "--fail-on", "never")
    assert completed.returncode == EXIT_OK, completed.stderr
    assert [r["label"] for r in read_records(tmp_path / "results.jsonl")] == ["entailed", "contradicted", "baseless"]
    completed = verify(tmp_path, "--fail-on", "contradicted", "--max-rate", "0.5")
    assert completed.returncode == EXIT_OK, completed.stderr


def test_report_rejects_results_that_are_not_records_or_belong_to_another_input(audited: Path) -> None:
    (audited / "broken.jsonl").write_text('{"id": "x", "line": 1}\nnot json\n', encoding="utf-8")
    completed = rt4("report", "broken.jsonl", "--junit", "j.xml", cwd=audited)
    assert completed.returncode == EXIT_USAGE
    assert "broken.jsonl line 2" in completed.stderr and "Traceback" not in completed.stderr
    (audited / "other.jsonl").write_text('{"id": "zzz", "context": "c", "answer": "a"}\n', encoding="utf-8")
    completed = rt4("report", "results.jsonl", "--input", "other.jsonl", "--junit", "j.xml", cwd=audited)
    assert completed.returncode == EXIT_USAGE
    assert "does not match input line 1" in completed.stderr
    first_line = (audited / "answers.jsonl").read_text(encoding="utf-8").splitlines()[0]
    (audited / "short.jsonl").write_text(first_line + "\n", encoding="utf-8")
    completed = rt4("report", "results.jsonl", "--input", "short.jsonl", "--junit", "j.xml", cwd=audited)
    assert completed.returncode == EXIT_USAGE
    assert "names input line 2, which the input file does not have" in completed.stderr
    completed = rt4("report", "results.jsonl", cwd=audited)
    assert completed.returncode == EXIT_USAGE and "nothing to write" in completed.stderr


def test_a_claim_left_unjudged_by_a_judge_error_is_an_error_not_a_failure(audited: Path, tmp_path: Path) -> None:
    records = read_records(audited / "results.jsonl")
    paris, berlin = records[0], records[1]
    # A failed judge call: the claim keeps no label, the answer counts as baseless (see README, Output).
    paris["claims"][0].update(label=None, evidence=[], errors=["chunk 0: judge call failed: timed out"])
    paris.update(label="baseless", hallucinated=True)
    berlin["claims"][0]["errors"] = ["chunk 1: judge call failed: timed out"]  # its contradicted claim stands
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    completed = rt4("report", "results.jsonl", "--input", str(ANSWERS), "--junit", "junit.xml", cwd=tmp_path)
    assert completed.returncode == EXIT_FAIL, completed.stderr
    xmlschema.XMLSchema(JUNIT_SCHEMA).validate(tmp_path / "junit.xml")
    [suite] = list(JUnitXml.fromfile(str(tmp_path / "junit.xml")))
    results = {case.name: [(type(r).__name__, r.type) for r in case.result] for case in suite}
    assert results == {
        "paris": [("Error", "judge error")],
        "berlin-wrong": [("Error", "judge error"), ("Failure", "contradicted")],
        "script-injection": [("Failure", "baseless")],
    }
    assert (suite.tests, suite.failures, suite.errors) == (3, 2, 2)


@pytest.mark.parametrize("flag", ["--report", "--junit"])
def test_an_unwritable_report_path_stops_verify_before_any_judge_call(tmp_path: Path, flag: str) -> None:
    completed = verify(tmp_path, flag, "missing-folder/out.file")
    assert completed.returncode == EXIT_USAGE
    assert "missing-folder/out.file" in completed.stderr and "Traceback" not in completed.stderr
    assert not (tmp_path / "results.jsonl").exists()  # nothing was audited
