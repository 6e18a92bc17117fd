"""``rt4 agree`` end to end: real ``rt4 verify`` outputs in, tables / JSON / PNG out, bad input refused."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES
from sklearn.metrics import cohen_kappa_score
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.types import AuditRecord, ClaimVerdict, Gold, Label, Span

EXIT_USAGE = 2
STRICT_RULES = {"verify": [], "default": "baseless"}
LENIENT_RULES = {
    "verify": [
        {"claim": "30 days", "label": "entailed", "evidence": ["can be returned within 30 days of delivery"]},
        {"claim": "original payment method", "label": "entailed",
         "evidence": ["Refunds are issued to the original payment method"]},
        {"claim": "60 days", "label": "contradicted",
         "evidence": ["can be returned within 30 days of delivery"]},
        {"claim": "56 Wh", "label": "entailed", "evidence": ["The X200 has a 56 Wh lithium-polymer battery."]},
    ],
    "default": "entailed",
}


def rt4(*args: str) -> subprocess.CompletedProcess[str]:
    """The real command line, in a fresh interpreter."""
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], capture_output=True, text=True, timeout=300)


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shipped answers verified by two scripted judges that disagree (through ``rt4 verify``)."""
    folder = tmp_path_factory.mktemp("agree")
    outputs = []
    for name, rules in (("strict", STRICT_RULES), ("lenient", LENIENT_RULES)):
        rules_path = folder / f"{name}.rules.json"
        rules_path.write_text(json.dumps(rules), encoding="utf-8")
        out = folder / f"{name}.jsonl"
        result = invoke("verify", str(EXAMPLES / "answers.jsonl"), "--judge", f"scripted:{rules_path}",
                        "--out", str(out), "--no-cache", "--quiet")
        assert result.exit_code in (0, 1), result.output
        outputs.append(out)
    return outputs[0], outputs[1]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_json_report_matches_scikit_learn_on_the_files(verified: tuple[Path, Path]) -> None:
    strict, lenient = verified
    result = invoke("agree", str(strict), str(lenient), "--labels", "label", "--json", "--resamples", "100")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    first = [r["label"] for r in records(strict)]
    second = [r["label"] for r in records(lenient)]
    assert first != second, "the two judges must really differ for this test to mean something"
    expected = cohen_kappa_score(first, second, labels=["entailed", "contradicted", "baseless"])
    assert report["pairs"][0]["kappa"]["value"] == pytest.approx(expected, abs=1e-9)
    assert report["items"] == len(first)
    assert report["judges"][0].startswith("scripted:strict.rules.json#")
    assert report["distributions"][0]["counts"]["baseless"] == len(first)


def test_tables_claim_level_and_plot(verified: tuple[Path, Path], tmp_path: Path) -> None:
    strict, lenient = verified
    png = tmp_path / "kappa.png"
    result = rt4("agree", str(strict), str(lenient), "--level", "claim", "--plot", str(png), "--resamples", "50")
    assert result.returncode == 0, result.stderr
    assert "Cohen's kappa" in result.stdout and "labels per judge" in result.stdout
    assert "claims aligned shared claim set; 0 claims could not be aligned" in " ".join(result.stdout.split())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_is_a_clear_error(verified: tuple[Path, Path], tmp_path: Path) -> None:
    # A package named matplotlib that cannot be imported stands in for an install without the extra.
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n", encoding="utf-8")
    strict, lenient = verified
    env_path = f"{shim.parent}:{Path(__file__).resolve().parent.parent}"
    result = subprocess.run(
        [sys.executable, "-m", "rt4chart", "agree", str(strict), str(lenient), "--plot", str(tmp_path / "x.png")],
        capture_output=True, text=True, timeout=300, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == EXIT_USAGE
    assert "pip install 'rt4chart[plot]'" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def bad_files(tmp_path: Path, verified: tuple[Path, Path]) -> dict[str, tuple[Path, str]]:
    strict, _ = verified
    lines = strict.read_text(encoding="utf-8").splitlines()
    shorter = tmp_path / "shorter.jsonl"
    shorter.write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    renamed = tmp_path / "renamed.jsonl"
    second = json.loads(lines[1])
    second["id"] = "someone-else"
    renamed.write_text("\n".join([lines[0], json.dumps(second), *lines[2:]]) + "\n", encoding="utf-8")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    return {
        "shorter": (shorter, "has 3 records"),
        "renamed": (renamed, "at record 2: id 'someone-else' line 2"),
        "input, not output": (EXAMPLES / "answers.jsonl", "not an rt4chart output record"),
        "empty": (empty, "no output records"),
        "missing": (tmp_path / "nothing.jsonl", "not found"),
    }


@pytest.mark.parametrize("case", ["shorter", "renamed", "input, not output", "empty", "missing"])
def test_bad_input_is_one_line_and_exit_2(case: str, verified: tuple[Path, Path], tmp_path: Path) -> None:
    path, message = bad_files(tmp_path, verified)[case]
    result = rt4("agree", str(verified[0]), str(path))
    assert result.returncode == EXIT_USAGE, result.stdout
    assert message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and result.stderr.count("error:") == 1


def test_one_file_and_bad_flags_are_refused(verified: tuple[Path, Path]) -> None:
    assert invoke("agree", str(verified[0])).exit_code == EXIT_USAGE
    assert invoke("agree", *map(str, verified), "--level", "word").exit_code == EXIT_USAGE
    assert invoke("agree", *map(str, verified), "--runs").exit_code == EXIT_USAGE  # no gold


def write_records(path: Path, reports: list[AuditRecord]) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in reports), encoding="utf-8")
    return path


def run_records(judge: str, gold: list[bool], accuracy: float, rng: random.Random) -> list[AuditRecord]:
    reports = []
    for line, truth in enumerate(gold, start=1):
        flagged = truth if rng.random() < accuracy else not truth
        label = Label.BASELESS if flagged else Label.ENTAILED
        claim = ClaimVerdict(index=0, text="c", sentence_index=0, answer_span=Span(start=0, end=5), label=label)
        reports.append(AuditRecord(id=f"s{line}", line=line, label=label, hallucinated=flagged, claims=[claim],
                              judge=judge, gold=Gold(hallucinated=truth)))
    return reports


def test_runs_mode_reports_spread_and_the_difference(tmp_path: Path) -> None:
    rng = random.Random(0)
    gold = [rng.random() < 0.5 for _ in range(60)]
    files = [
        str(write_records(tmp_path / f"{judge}-{run}.jsonl", run_records(judge, gold, accuracy, rng)))
        for judge, accuracy in (("good", 0.9), ("poor", 0.6))
        for run in range(3)
    ]
    result = invoke("agree", *files, "--runs", "--json", "--resamples", "200")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert [(j["judge"], len(j["files"])) for j in report["judges"]] == [("good", 3), ("poor", 3)]
    balanced = next(d for d in report["differences"] if d["metric"] == "balanced_accuracy")
    assert balanced["difference"]["ci_low"] > 0 and balanced["welch_p"] < 0.05
    tables = invoke("agree", *files, "--runs", "--resamples", "50")
    assert tables.exit_code == 0 and "Welch" in tables.stdout


def test_gold_file_is_matched_by_id(tmp_path: Path) -> None:
    rng = random.Random(1)
    gold = [rng.random() < 0.5 for _ in range(30)]
    first = run_records("a", gold, 0.8, rng)
    second = run_records("b", gold, 0.7, rng)
    for report in first + second:
        report.gold = None
    gold_path = tmp_path / "gold.jsonl"
    gold_path.write_text("".join(
        json.dumps({"id": f"s{i}", "context": "x", "answer": "y", "gold": {"hallucinated": g}}) + "\n"
        for i, g in enumerate(gold, start=1)
    ), encoding="utf-8")
    a, b = write_records(tmp_path / "a.jsonl", first), write_records(tmp_path / "b.jsonl", second)
    result = invoke("agree", str(a), str(b), "--gold", str(gold_path), "--json", "--resamples", "0")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    flagged = [r.hallucinated for r in first]
    expected = cohen_kappa_score(gold, flagged)
    assert report["gold"][0]["kappa"]["value"] == pytest.approx(expected, abs=1e-9)
    assert report["gold"][0]["kappa"]["ci_low"] is None  # no resampling asked for


@pytest.mark.parametrize("resamples", ["-1", "100001", "1000000000"])
def test_resamples_are_bounded_before_any_work(tmp_path: Path, resamples: str) -> None:
    from audit_fixtures import write_rules, write_samples

    inputs, rules, out = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json"), tmp_path / "out.jsonl"
    write_samples(inputs, 3)
    assert CliRunner().invoke(app, ["verify", str(inputs), "--judge", f"scripted:{rules}", "--no-cache",
                                    "--out", str(out), "-q"]).exit_code == 1
    for command in (["agree", str(out), str(out)], ["score", str(out)]):
        result = CliRunner().invoke(app, [*command, "--resamples", resamples])
        assert result.exit_code == 2 and "--resamples" in result.output, (command, result.output)
