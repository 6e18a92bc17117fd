"""Exit codes when something goes wrong outside the audit: a full disk or an unwritable output is
exit 2 with what was kept, a bug is exit 5 with a log of its traceback, and brackets in paths or ids
(rich markup) never raise. Never exit 1, the code a CI job reads as "hallucinations found"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_fixtures import write_rules, write_samples
from typer.testing import CliRunner

from rt4chart.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def rt4(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def tiny_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A 64 KiB file system of its own (tmpfs; another size by indirect parametrization), so the
    disk really fills up."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    size = getattr(request, "param", "64k")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


def test_a_full_disk_is_exit_2_with_what_was_kept(tmp_path: Path, tiny_disk: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 400)  # about 1 KiB of records each: far more than the disk holds
    out = tiny_disk / "out.jsonl"
    done = rt4("verify", str(inputs), "--judge", f"scripted:{rules}", "--no-cache", "--out", str(out), "-q",
               cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "No space left on device" in done.stderr and "kept" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 3


@pytest.mark.parametrize("tiny_disk", ["2m"], indirect=True)
def test_a_cache_on_a_full_disk_is_read_and_the_run_goes_on(tmp_path: Path, tiny_disk: Path) -> None:
    """Issue 27: a cache whose disk had filled up made every later run exit 2 (diskcache writes its
    settings on open). The run now reads the cache, stores nothing, and says so once."""
    import json

    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    samples = write_samples(inputs, 25)
    cache = tiny_disk / "cache"
    first = tmp_path / "first.jsonl"
    inputs.write_text("".join(json.dumps(sample) + "\n" for sample in samples[:20]), encoding="utf-8")
    audit = ["--judge", f"scripted:{rules}", "--decomposer", "rules", "--cache-dir", str(cache), "-q"]
    assert rt4("verify", str(inputs), "--out", str(first), *audit, cwd=tmp_path).returncode == 1
    # The rest of the disk, until it is full.
    with open(tiny_disk / "filler", "wb", buffering=0) as filler, pytest.raises(OSError, match="No space left"):
        while True:
            filler.write(b"\0" * 4096)
    write_samples(inputs, 25)  # the 20 cached samples and 5 the cache has never seen
    again = tmp_path / "again.jsonl"
    done = rt4("verify", str(inputs), "--out", str(again), *audit, cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # the findings, not a usage error
    assert done.stderr.count("full disk") == 1 and "Traceback" not in done.stderr
    records = [json.loads(line) for line in again.read_text(encoding="utf-8").splitlines()]
    assert [record["id"] for record in records] == [sample["id"] for sample in samples]
    assert all(r["usage"]["calls"] == 0 and r["usage"]["cache_hits"] > 0 for r in records[:20]), "read from the cache"
    assert all(r["usage"]["calls"] > 0 and r["label"] == "baseless" for r in records[20:]), "judged, not stored"
    assert "did not store" in done.stderr


def test_an_unexpected_error_is_exit_5_with_its_traceback_in_a_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import rt4chart.records.io
    from rt4chart.cli.app import main

    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 1)

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("a bug in the reader")

    monkeypatch.setattr(rt4chart.records.io, "read_jsonl", broken)
    monkeypatch.setattr(sys, "argv", ["rt4", "verify", str(inputs), "--judge", f"scripted:{rules}", "--no-cache"])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 5
    message = capsys.readouterr().err
    assert "internal error (RuntimeError: a bug in the reader)" in message and "Traceback" not in message
    [log] = tmp_path.glob("rt4chart-crash-*.log")
    assert str(log) in message.replace("\n", "")
    assert "Traceback" in log.read_text(encoding="utf-8") and "a bug in the reader" in log.read_text(encoding="utf-8")


def test_brackets_in_paths_and_ids_are_text_never_markup(tmp_path: Path) -> None:
    folder = tmp_path / "x["
    folder.mkdir()
    inputs, rules = folder / "]y.jsonl", write_rules(tmp_path / "rules.json")
    samples = write_samples(inputs, 2)
    samples[0]["id"] = "[/]"
    inputs.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    out = folder / "]out[/].jsonl".replace("/", "")
    commands = [
        ["verify", str(inputs), "--judge", f"scripted:{rules}", "--no-cache", "--out", str(out)],
        ["show", str(out), "--input", str(inputs)],
        ["show", str(out), "--id", "[/]nothing"],
        ["report", str(out), "--input", str(inputs), "--html", str(folder / "r[/b].html".replace("/", ""))],
        ["repair", str(out), "--input", str(inputs), "--no-cache", "--out", str(folder / "[red]fixed.jsonl")],
        ["show", str(folder / "[/]missing.jsonl".replace("/", ""))],
        ["verify", str(folder / "[bold]missing.jsonl"), "--judge", "embedded"],
    ]
    for command in commands:
        done = runner.invoke(app, command)
        assert done.exception is None or isinstance(done.exception, SystemExit), (command, repr(done.exception))
        assert done.exit_code in (0, 1, 2), (command, done.output)
    assert runner.invoke(app, ["show", str(out), "--id", "[/]"]).output.count("[/]") >= 1


# --- the precedence table: of 3, 2, 4, 1 the first that applies, in every combination ---------------

EXPECTED_ORDER = (("budget", 3), ("invalid", 2), ("unavailable", 4), ("incomplete", 4), ("fails", 1))
"""README "Exit codes", written out independently of rt4chart.runs.run."""


@pytest.mark.parametrize("stop", [None, "budget", "unavailable"])
@pytest.mark.parametrize("invalid", [False, True])
@pytest.mark.parametrize("incomplete", [False, True])
@pytest.mark.parametrize("fails", [False, True])
def test_every_combination_of_outcomes_exits_with_the_first_code_that_applies(
    stop: str | None, invalid: bool, incomplete: bool, fails: bool
) -> None:
    from rt4chart.judges.budget import Ledger
    from rt4chart.report.progress import RunSummary
    from rt4chart.runs.engine import AuditResult, BudgetStop, UnavailableStop
    from rt4chart.runs.run import outcome_of

    summary = RunSummary(records=3, invalid=int(invalid), incomplete=int(incomplete))
    unavailable = UnavailableStop(endpoint="http://127.0.0.1:9/v1", failures=3, last_error="connection refused")
    result = AuditResult(written=3, stop={None: None, "budget": BudgetStop(), "unavailable": unavailable}[stop])
    outcome = outcome_of([], result, summary, fails, Ledger(), "scripted")
    applies = {"budget": stop == "budget", "invalid": invalid, "unavailable": stop == "unavailable",
               "incomplete": incomplete, "fails": fails}
    expected = next((code for name, code in EXPECTED_ORDER if applies[name]), 0)
    assert outcome.exit_code == expected


def test_an_invalid_line_and_an_unreachable_judge_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as probe:  # a port nothing listens on: every call is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 3)
    with open(inputs, "a", encoding="utf-8") as handle:
        handle.write("{not json\n")
    done = rt4("verify", str(inputs), "--judge", "openai/refused", "--api-base", f"http://127.0.0.1:{port}/v1",
               "--decomposer", "rules", "--no-cache", "-q", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert len(done.stdout.splitlines()) == 4, "every line still has its record"


def test_the_pass_fail_decision_is_taken_once_from_the_tally_or_the_gate() -> None:
    from rt4chart.analysis.diff import GateOutcome
    from rt4chart.options import FailOn
    from rt4chart.records.manifest import RunCounts
    from rt4chart.report.outputs import PublishOptions
    from rt4chart.runs.run import policy_fails

    counts = RunCounts(labels={"entailed": 3, "contradicted": 1}, failing=1)
    assert policy_fails(counts, PublishOptions()) is True, "any failing answer fails at --max-rate 0"
    assert policy_fails(counts, PublishOptions(max_rate=0.25)) is False, "25% is not over 25%"
    assert policy_fails(counts, PublishOptions(max_rate=0.2)) is True
    assert policy_fails(counts, PublishOptions(fail_on=FailOn.NEVER)) is False
    assert policy_fails(RunCounts(invalid=2), PublishOptions()) is False, "nothing judged fails nothing"
    # Under --fail-on new|worse the gate decides, whatever the share; under another policy it does not.
    passing_gate = GateOutcome.model_construct(fails=False, pre_existing_lines=[4])
    assert policy_fails(counts, PublishOptions(fail_on=FailOn.NEW, baseline=Path("b")), passing_gate) is False
    assert policy_fails(counts, PublishOptions(baseline=Path("b")), passing_gate) is True


def test_verify_and_report_pass_a_baseline_gate_that_the_share_would_fail(tmp_path: Path) -> None:
    # The case publish() used to decide over the run's own tally: every hallucination is in the baseline too.
    from conftest import EXAMPLES

    inputs, judge = EXAMPLES / "free_trial.jsonl", f"scripted:{EXAMPLES / 'free_trial.rules.json'}"
    base, again, junit = tmp_path / "base.jsonl", tmp_path / "again.jsonl", tmp_path / "junit.xml"
    runner = CliRunner()
    first = runner.invoke(app, ["verify", str(inputs), "--judge", judge, "--no-cache", "-q", "-o", str(base)])
    assert first.exit_code == 1, first.output
    gated = ["--baseline", str(base), "--fail-on", "new"]
    verified = runner.invoke(app, ["verify", str(inputs), "--judge", judge, "--no-cache", "-q", "-o", str(again),
                                   *gated])
    reported = runner.invoke(app, ["report", str(again), "--junit", str(junit), *gated])
    ungated = runner.invoke(app, ["report", str(again), "--junit", str(junit), "--baseline", str(base)])
    assert (verified.exit_code, reported.exit_code, ungated.exit_code) == (0, 0, 1), verified.output + reported.output
