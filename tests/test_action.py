"""The reusable GitHub Action (action.yml at the repository root): its `run:` steps executed with bash as
GitHub runs them (`bash --noprofile --norc -eo pipefail`), in a temporary directory, offline, with the
scripted judge of the examples. `uses:` steps (setup-python, the pip cache) and the install step are
GitHub's and the network's: the install is switched off by its input (`install: false`), as a job that
already has `rt4` would; the baseline download needs GitHub's API and is exercised only by its
condition (skipped without `baseline-artifact`). The expression syntax the action uses is checked to
be the small subset evaluated here, so a new construct fails this test instead of going untested."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import EXAMPLES

ACTION = Path(__file__).resolve().parents[1] / "action.yml"
JUDGE = f"scripted:{EXAMPLES / 'answers.rules.json'}"
EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
CONDITION = re.compile(r"^inputs\.([\w-]+) (==|!=) '([^']*)'$")


class Runner:
    """The part of GitHub's runner a composite action's `run:` steps meet: inputs with defaults,
    `${{ }}` in `env:`, `if:` conditions, $GITHUB_OUTPUT, $GITHUB_STEP_SUMMARY and $RUNNER_TEMP."""

    def __init__(self, directory: Path, inputs: dict[str, str]) -> None:
        self.action: dict[str, Any] = yaml.safe_load(ACTION.read_text(encoding="utf-8"))
        declared = self.action["inputs"]
        unknown = set(inputs) - set(declared)
        assert not unknown, f"not inputs of the action: {unknown}"
        self.inputs = {name: str(spec.get("default", "")) for name, spec in declared.items()} | inputs
        self.directory = directory
        self.temp = directory / "runner-temp"
        self.temp.mkdir()
        self.summary = directory / "step-summary.md"
        self.outputs: dict[str, dict[str, str]] = {}
        self.ran: list[str] = []

    def value(self, expression: str) -> str:
        scope, _, name = expression.partition(".")
        if scope == "inputs":
            return self.inputs[name]
        if scope == "steps":
            step, outputs, output = name.split(".")
            assert outputs == "outputs"
            return self.outputs.get(step, {}).get(output, "")
        known = {"github.action_path": str(ACTION.parent), "github.token": "", "github.workflow": "audit"}
        assert expression in known, f"an expression this test does not evaluate: {expression}"
        return known[expression]

    def substituted(self, text: str) -> str:
        return EXPRESSION.sub(lambda match: self.value(match.group(1)), text)

    def applies(self, step: dict[str, Any]) -> bool:
        condition = step.get("if")
        if condition is None:
            return True
        verdicts = []
        for part in str(condition).split(" && "):
            match = CONDITION.match(part.strip())
            assert match, f"a condition this test does not evaluate: {condition}"
            name, operator, literal = match.groups()
            verdicts.append((self.inputs[name] == literal) == (operator == "=="))
        return all(verdicts)

    def run(self) -> subprocess.CompletedProcess[str]:
        """Every step in order, as GitHub would; the failing step's result, or the last one's."""
        result = subprocess.CompletedProcess[str]([], 0, "", "")
        for step in self.action["runs"]["steps"]:
            if "uses" in step or not self.applies(step):
                continue
            script = step["run"]
            assert "${{" not in script, f"step {step['name']!r}: inputs reach scripts through env only"
            assert step["shell"] == "bash"
            output = self.temp / f"output-{len(self.ran)}"
            output.touch()
            env = {**os.environ, **{key: self.substituted(str(value)) for key, value in step.get("env", {}).items()},
                   "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(self.summary),
                   "RUNNER_TEMP": str(self.temp), "COLUMNS": "80",
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
            result = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                                    cwd=self.directory, env=env, capture_output=True, text=True, timeout=600,
                                    check=False)
            self.ran.append(step["name"])
            if "id" in step:
                lines = output.read_text(encoding="utf-8").splitlines()
                self.outputs[step["id"]] = dict(line.split("=", 1) for line in lines)
            if result.returncode != 0:
                return result
        return result


@pytest.fixture(scope="module")
def first_audit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Runner, subprocess.CompletedProcess[str]]:
    runner = Runner(tmp_path_factory.mktemp("action"), {
        "answers": str(EXAMPLES / "answers.jsonl"), "judge": JUDGE, "install": "false", "args": "--no-cache",
    })
    return runner, runner.run()


def test_the_audit_fails_the_job_on_hallucinated_answers_and_writes_the_summary(
    first_audit: tuple[Runner, subprocess.CompletedProcess[str]],
) -> None:
    runner, result = first_audit
    assert runner.ran == ["Audit", "Summary", "Gate"], "no install (install: false), no download (no artifact)"
    assert result.returncode == 1 and runner.outputs["audit"]["exit-code"] == "1"
    records = runner.directory / "rt4chart-audit" / "audit.jsonl"
    assert records.is_file() and Path(f"{records}.manifest.json").is_file()
    summary = runner.summary.read_text(encoding="utf-8")
    assert summary.startswith(f"## rt4chart audit of `{EXAMPLES / 'answers.jsonl'}`")
    log = (runner.temp / "rt4chart-verify.log").read_text(encoding="utf-8")
    assert log.strip() and log.strip().splitlines()[-1] in summary, "the run's last line says why it failed"
    assert "failed:" in summary


def test_a_baseline_gates_on_new_hallucinations_only_and_the_diff_joins_the_summary(
    first_audit: tuple[Runner, subprocess.CompletedProcess[str]], tmp_path: Path,
) -> None:
    baseline = first_audit[0].directory / "rt4chart-audit" / "audit.jsonl"
    runner = Runner(tmp_path, {
        "answers": str(EXAMPLES / "answers.jsonl"), "judge": JUDGE, "install": "false", "baseline": str(baseline),
        "args": "--no-cache",
    })
    result = runner.run()
    assert result.returncode == 0, result.stderr  # the same answers: nothing new, though 3 are hallucinated
    assert runner.outputs["audit"]["baseline"] == str(baseline)
    summary = runner.summary.read_text(encoding="utf-8")
    assert "## rt4chart audit of" in summary and f"baseline {baseline}" in summary
    run_summary_end = summary.index("```\n", summary.index("```text") + 1)
    assert summary.index("rt4chart diff:") > run_summary_end, "the diff's Markdown follows the run's summary"


def test_a_usage_error_fails_the_job_with_its_exit_code(tmp_path: Path) -> None:
    runner = Runner(tmp_path, {"answers": str(tmp_path / "absent.jsonl"), "judge": JUDGE, "install": "false"})
    result = runner.run()
    assert result.returncode == 2 and runner.ran[-1] == "Gate"
    assert "input file not found" in runner.summary.read_text(encoding="utf-8")
