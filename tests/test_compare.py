"""``rt4 compare``: one claim set per answer, verified by every judge, then agreement on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLES
from typer.testing import CliRunner

from rt4chart.cli.app import app

RULES = EXAMPLES / "free_trial.rules.json"


def test_every_judge_verifies_the_claims_of_the_chosen_decomposer(tmp_path: Path) -> None:
    flag = tmp_path / "flag.rules.json"
    flag.write_text(json.dumps({"default": "baseless"}), encoding="utf-8")
    inputs = tmp_path / "in.jsonl"
    lines = (EXAMPLES / "answers.jsonl").read_text(encoding="utf-8").splitlines()
    inputs.write_text("\n".join([*lines, "not json"]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, [
        "compare", str(inputs), "--judges", f"scripted:{flag},scripted:{RULES}",
        "--decompose-with", f"scripted:{RULES}", "--out-dir", str(out), "--no-cache", "-q", "--resamples", "20",
    ], catch_exceptions=False)
    # The invalid line gets its record in every file and makes the run exit 2, as rt4 verify does.
    assert result.exit_code == 2, result.output
    files = sorted(f for f in out.iterdir() if not f.name.startswith("."))  # not the outputs' lock files
    assert [f.name.split("-")[0] for f in files] == ["scripted", "scripted"] and len(files) == 2
    runs = [[json.loads(line) for line in f.read_text(encoding="utf-8").splitlines()] for f in files]
    assert [len(records) for records in runs] == [len(lines) + 1] * 2, "one record per input line"
    assert runs[0][-1]["errors"] and runs[0][-1]["label"] is None
    claim_sets = [[[c["text"] for c in r["claims"]] for r in records] for records in runs]
    assert claim_sets[0] == claim_sets[1]
    # Only the free-trial rules split the running example this way; the flag judge's own
    # decomposition would have kept the answer sentences whole.
    running_example = claim_sets[0][3]
    assert "Existing customers can start the free trial." in running_example
    assert "claims aligned shared claim set; 0 claims could not be aligned" in " ".join(result.stdout.split())


def test_compare_refuses_bad_judge_lists(tmp_path: Path) -> None:
    runner = CliRunner()
    common = ["compare", str(EXAMPLES / "answers.jsonl"), "--out-dir", str(tmp_path)]
    assert runner.invoke(app, [*common, "--judges", f"scripted:{RULES}"]).exit_code == 2
    assert runner.invoke(app, [*common, "--judges", f"scripted:{RULES},scripted:{RULES}"]).exit_code == 2
    unreadable = runner.invoke(app, [*common, "--judges", f"scripted:{RULES},scripted:{tmp_path}/x.json"])
    assert unreadable.exit_code == 2


def test_the_readme_agreement_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    root = EXAMPLES.parent
    out = tmp_path / "cmp"
    compare = subprocess.run(
        [sys.executable, "-m", "rt4chart", "compare", "examples/answers.jsonl", "--judges",
         "embedded,scripted:examples/answers.rules.json", "--decompose-with", "scripted:examples/answers.rules.json",
         "--out-dir", str(out), "--no-cache", "-q"],
        capture_output=True, text=True, timeout=600, cwd=root,
    )
    assert compare.returncode == 0, compare.stderr
    agree = subprocess.run(
        [sys.executable, "-m", "rt4chart", "agree", *sorted(str(p) for p in out.glob("*.jsonl")),
         "--level", "claim", "--json"],
        capture_output=True, text=True, timeout=600, cwd=root,
    )
    assert agree.returncode == 0, agree.stderr
    pair = json.loads(agree.stdout)["pairs"][0]
    kappa, observed = pair["kappa"], pair["observed"]
    row = (f"│ {kappa['n']} │    {observed['value']:.3f} │ {kappa['value']:.3f} │ "
           f"[{kappa['ci_low']:.3f}, {kappa['ci_high']:.3f}] │")
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert row in readme, f"README's worked example is stale: rerun it (now {row})"
    assert f"kappa {kappa['value']:.2f}" in readme


def test_compare_decomposes_as_verify_does_with_the_holistic_decomposer(tmp_path: Path) -> None:
    # compare draws its claims through the pipeline's own decomposition front: --decomposer
    # holistic gives the claim set rt4 verify --decomposer holistic gives (not sentence claims).
    inputs, rules = EXAMPLES / "free_trial.jsonl", f"scripted:{RULES}"
    flag = tmp_path / "flag.rules.json"
    flag.write_text(json.dumps({"default": "baseless"}), encoding="utf-8")
    holistic = ["--decomposer", "holistic", "--no-cache", "-q"]
    runner = CliRunner()
    verified = tmp_path / "verified.jsonl"
    runner.invoke(app, ["verify", str(inputs), "--judge", rules, *holistic, "-o", str(verified)])
    compared = runner.invoke(app, ["compare", str(inputs), "--judges", f"scripted:{flag},{rules}", "--decompose-with",
                                   rules, "--out-dir", str(tmp_path / "cmp"), "--resamples", "20", *holistic])
    assert compared.exit_code == 0, compared.output
    expected = json.loads(verified.read_text(encoding="utf-8"))
    assert expected["decomposition"]["mode"] == "holistic"
    for path in sorted((tmp_path / "cmp").glob("*.jsonl")):
        record = json.loads(path.read_text(encoding="utf-8"))
        assert record["decomposition"] == expected["decomposition"]
        assert [c["text"] for c in record["claims"]] == [c["text"] for c in expected["claims"]]


def test_compare_refuses_a_judge_decomposer_without_a_judge_to_decompose(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "compare", str(EXAMPLES / "free_trial.jsonl"), "--judges", f"embedded,scripted:{RULES}",
        "--decomposer", "holistic", "--out-dir", str(tmp_path), "--no-cache", "-q",
    ])
    assert result.exit_code == 2 and "needs --decompose-with" in result.output, result.output
