"""Damaged baselines and unreadable records files (issue 40): a truncated, garbage or deeply nested
baseline manifest was exit 5 after the whole audit, with the run's own manifest never written (in
the README's CI recipe, a truncated artifact download turned every PR run into "internal error");
``rt4 diff`` on a manifest nested 100k deep was exit 5, and on ``/dev/null`` or a folder it said
"file not found". A report that meets a full disk named no file and left a torn HTML."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from audit_fixtures import write_rules, write_samples
from test_exit_codes import rt4, tiny_disk  # noqa: F401 - the fixture: a 64 KiB tmpfs of its own
from typer.testing import CliRunner

from rt4chart.cli.app import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent

DAMAGE = {
    "truncated": lambda manifest: manifest[:300],
    "garbage": lambda _: "\x00garbage{",
    "nested": lambda _: "[" * 100_000 + "]" * 100_000,
    "long integer": lambda _: '{"schema_version": ' + "9" * 5000 + "}",
    "not a manifest": lambda _: json.dumps({"schema_version": "something else"}),
}


@pytest.fixture
def baseline(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """An input, its audit as a baseline (records and manifest), and the scripted judge's flags."""
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 3)
    judge = ["--judge", f"scripted:{rules}", "--decomposer", "rules", "--no-cache", "-q"]
    base = tmp_path / "base.jsonl"
    assert runner.invoke(app, ["verify", str(inputs), "--out", str(base), *judge]).exit_code == 1
    return inputs, base, judge


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_baseline_manifest_is_exit_2_before_any_judge_call(
    baseline: tuple[Path, Path, list[str]], damage: str
) -> None:
    inputs, base, judge = baseline
    manifest = base.with_name(base.name + ".manifest.json")
    manifest.write_text(DAMAGE[damage](manifest.read_text(encoding="utf-8")), encoding="utf-8")
    out = inputs.parent / "out.jsonl"
    done = runner.invoke(app, ["verify", str(inputs), "--out", str(out), "--baseline", str(base),
                               "--fail-on", "new", *judge])
    assert done.exit_code == 2, done.output
    assert f"--baseline: {manifest}: not an rt4chart run manifest" in done.output.replace("\n", "")
    assert "internal error" not in done.output
    assert not out.exists()  # refused before the audit: no record, so no judge call was made
    diffed = runner.invoke(app, ["diff", str(base), str(base)])
    assert diffed.exit_code == 2 and "not an rt4chart run manifest" in diffed.output, diffed.output


@pytest.mark.parametrize(("other", "message"), [("/dev/null", "is not a regular file"), ("folder", "is a directory"),
                                                ("missing.jsonl", "predictions file not found")])
def test_diff_names_what_is_wrong_with_a_records_path(
    baseline: tuple[Path, Path, list[str]], other: str, message: str
) -> None:
    _, base, _ = baseline
    path = other if other.startswith("/") else str(base.parent / other)
    if other == "folder":
        Path(path).mkdir()
    done = runner.invoke(app, ["diff", str(base), path])
    assert done.exit_code == 2 and message in done.output, done.output


def test_a_report_on_a_full_disk_names_it_keeps_the_earlier_one_and_the_manifest_is_written(
    tmp_path: Path,
    tiny_disk: Path,  # noqa: F811 - the fixture imported above
) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 200)  # an HTML report far larger than the 64 KiB disk
    report = tiny_disk / "report.html"
    report.write_text("<html>the earlier report</html>\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    done = rt4("verify", str(inputs), "--out", str(out), "--report", str(report), "--judge", f"scripted:{rules}",
               "--decomposer", "rules", "--no-cache", "-q", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert f"cannot write {report}: No space left on device" in done.stderr and "Traceback" not in done.stderr
    assert report.read_text(encoding="utf-8") == "<html>the earlier report</html>\n"  # never a torn one
    assert sorted(path.name for path in tiny_disk.iterdir()) == ["report.html"]  # no temporary left
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text(encoding="utf-8"))
    assert manifest["counts"]["records"] == 200


def test_a_baseline_damaged_during_the_run_is_exit_2_and_the_runs_manifest_is_written(tmp_path: Path) -> None:
    """The baseline passes the check before the audit, then is replaced while the audit runs (a CI
    cache restored over it): the gate cannot read it, and the run's own records and manifest stay."""
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 6)
    fast, slow = write_rules(tmp_path / "fast.json"), write_rules(tmp_path / "slow.json", latency_s=0.5)
    base, out = tmp_path / "base.jsonl", tmp_path / "out.jsonl"
    judge = ["--decomposer", "rules", "--no-cache", "-q"]
    first = runner.invoke(app, ["verify", str(inputs), "--out", str(base), "--judge", f"scripted:{fast}", *judge])
    assert first.exit_code == 1, first.output
    manifest = base.with_name(base.name + ".manifest.json")
    # One answer at a time, so the run is still going when its first record appears (with every answer in
    # flight, all six finished together and the gate could read the baseline before it was damaged).
    judge += ["--samples-in-flight", "1"]
    run = subprocess.Popen([sys.executable, "-m", "rt4chart", "verify", str(inputs), "--out", str(out), "--baseline",
                            str(base), "--fail-on", "new", "--judge", f"scripted:{slow}", *judge],
                           cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    try:
        while run.poll() is None and not (out.exists() and out.read_bytes().count(b"\n") >= 1):
            time.sleep(0.05)  # waits for the first record, whatever the machine's speed
        manifest.write_text(manifest.read_text(encoding="utf-8")[:300], encoding="utf-8")
        _, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 2, stderr
    assert f"--baseline: {manifest}: not an rt4chart run manifest" in stderr and "internal error" not in stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == 6
    written = json.loads((tmp_path / "out.jsonl.manifest.json").read_text(encoding="utf-8"))
    assert written["counts"]["records"] == 6
