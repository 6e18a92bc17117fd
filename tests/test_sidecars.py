"""Sidecar files (issue 40): a records output's manifest and lock, and the temporary file of every
atomic write, are held to the outputs' rules. Each case used to overwrite a file silently (an input
named ``<out>.manifest.json``, a ``--report`` or ``--junit`` of that name or of the lock's) or to
overwrite the baseline's manifest and then crash (exit 5)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from audit_fixtures import write_rules, write_samples
from typer.testing import CliRunner

from rt4chart.cli.app import app

runner = CliRunner()


@pytest.fixture
def audit_inputs(tmp_path: Path) -> tuple[Path, list[str]]:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 3)
    return inputs, ["--judge", f"scripted:{rules}", "--decomposer", "rules", "--no-cache", "-q"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file()}


@pytest.mark.parametrize(
    ("input_name", "flags", "refusal"),
    [
        ("out.jsonl.manifest.json", [], "the manifest of --out"),
        ("in.jsonl", ["--report", "out.jsonl.manifest.json"], "--report out.jsonl.manifest.json is named as"),
        ("in.jsonl", ["--junit", "out.jsonl.manifest.json"], "--junit out.jsonl.manifest.json is named as"),
        ("in.jsonl", ["--report", ".out.jsonl.lock"], "--report .out.jsonl.lock is named as the lock file"),
        (".out.jsonl.tmp", [], "the temporary file of --out"),
    ],
)
def test_a_sidecar_of_the_out_is_never_an_input_or_another_output(
    audit_inputs: tuple[Path, list[str]], input_name: str, flags: list[str], refusal: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs, judge = audit_inputs
    folder = inputs.parent
    monkeypatch.chdir(folder)
    if input_name != inputs.name:
        shutil.copy(inputs, folder / input_name)
    before = snapshot(folder)
    done = runner.invoke(app, ["verify", input_name, "--out", "out.jsonl", *flags, *judge])
    assert done.exit_code == 2 and refusal in done.output and "Traceback" not in done.output, done.output
    assert snapshot(folder) == before  # nothing written: no records, no manifest, no lock


def test_a_symlinked_manifest_never_writes_through_to_the_input(audit_inputs: tuple[Path, list[str]]) -> None:
    inputs, judge = audit_inputs
    out = inputs.parent / "out.jsonl"
    (inputs.parent / "out.jsonl.manifest.json").symlink_to(inputs)
    before = inputs.read_bytes()
    done = runner.invoke(app, ["verify", str(inputs), "--out", str(out), *judge])
    assert done.exit_code == 2 and "is the input file" in done.output, done.output
    assert inputs.read_bytes() == before and not out.exists()


def test_out_named_as_the_baselines_manifest_is_refused_and_the_manifest_kept(
    audit_inputs: tuple[Path, list[str]],
) -> None:
    inputs, judge = audit_inputs
    base = inputs.parent / "base.jsonl"
    assert runner.invoke(app, ["verify", str(inputs), "--out", str(base), *judge]).exit_code == 1
    manifest = inputs.parent / "base.jsonl.manifest.json"
    kept = manifest.read_bytes()
    done = runner.invoke(app, ["verify", str(inputs), "--out", str(manifest), "--baseline", str(base), *judge])
    assert done.exit_code == 2 and "is named as the manifest of" in done.output, done.output
    assert manifest.read_bytes() == kept


def test_the_reports_of_other_commands_never_take_a_runs_sidecar(audit_inputs: tuple[Path, list[str]]) -> None:
    inputs, judge = audit_inputs
    results = inputs.parent / "out.jsonl"
    assert runner.invoke(app, ["verify", str(inputs), "--out", str(results), *judge]).exit_code == 1
    before = snapshot(inputs.parent)
    for flag, name in (("--html", "out.jsonl.manifest.json"), ("--junit", ".out.jsonl.lock")):
        done = runner.invoke(app, ["report", str(results), flag, str(inputs.parent / name)])
        assert done.exit_code == 2 and "is named as the" in done.output, done.output
    assert snapshot(inputs.parent) == before


def test_an_out_beside_its_earlier_manifest_and_lock_is_written_again(audit_inputs: tuple[Path, list[str]]) -> None:
    """The run's own sidecars from an earlier run are its own, not another run's."""
    inputs, judge = audit_inputs
    out = inputs.parent / "out.jsonl"
    for _ in range(2):
        done = runner.invoke(app, ["verify", str(inputs), "--out", str(out), *judge])
        assert done.exit_code == 1, done.output
    assert (inputs.parent / "out.jsonl.manifest.json").is_file() and (inputs.parent / ".out.jsonl.lock").is_file()
