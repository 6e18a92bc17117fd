"""Resumable audits: a run killed with SIGKILL and resumed yields every record exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from audit_fixtures import read_records, write_rules, write_samples
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.cache import JudgeCache

SAMPLES = 40


def complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_sigkill_at_a_random_point_then_resume(tmp_path: Path) -> None:
    inputs = tmp_path / "in.jsonl"
    # Slow enough that the run is still going well after the kill point, even on a loaded machine.
    rules = write_rules(tmp_path / "rules.json", latency_s=0.05)
    write_samples(inputs, SAMPLES)
    out, cache_dir = tmp_path / "out.jsonl", tmp_path / "cache"
    command = [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--judge", f"scripted:{rules}",
               "--out", str(out), "--cache-dir", str(cache_dir), "--samples-in-flight", "3", "-q"]
    kill_after = random.Random(os.getpid()).randint(1, SAMPLES // 2)
    run = subprocess.Popen(command)
    deadline = time.monotonic() + 240
    while complete_lines(out) < kill_after and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    run.send_signal(signal.SIGKILL)
    run.wait()
    assert run.returncode == -signal.SIGKILL, "the run must have been killed, not finished"
    killed_records = read_records(out) if complete_lines(out) else []
    cached_after_kill = JudgeCache(cache_dir).stats().entries

    resumed = subprocess.run([*command, "--resume"], timeout=240)
    assert resumed.returncode == 1
    records = read_records(out)
    assert [r["id"] for r in records] == [f"s{i}" for i in range(SAMPLES)], "each input once, in order"
    assert records[: len(killed_records)] == killed_records
    # Every call the resumed run made is new: a repeated call would have been a cache hit instead,
    # so the cache grows by exactly the number of calls the resumed run reports.
    new_calls = sum(r["usage"]["calls"] for r in records[len(killed_records) :])
    assert JudgeCache(cache_dir).stats().entries - cached_after_kill == new_calls


def test_a_torn_last_line_is_not_trusted(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 4)
    out = tmp_path / "out.jsonl"
    args = ["verify", str(inputs), "--judge", f"scripted:{rules}", "--out", str(out), "--no-cache", "-q"]
    assert CliRunner().invoke(app, args).exit_code == 1
    whole = out.read_text(encoding="utf-8").splitlines(keepends=True)
    out.write_text("".join(whole[:2]) + whole[2][: len(whole[2]) // 2], encoding="utf-8")

    assert CliRunner().invoke(app, [*args, "--resume"]).exit_code == 1
    records = read_records(out)
    assert [r["id"] for r in records] == ["s0", "s1", "s2", "s3"]
    assert [json.dumps(r, separators=(",", ":")) + "\n" for r in records[:2]] == whole[:2], "kept as written"
    assert records[2]["label"] is not None, "the torn record was audited again"


def test_resume_needs_an_output_file(tmp_path: Path) -> None:
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 1)
    result = CliRunner().invoke(app, ["verify", str(inputs), "--resume"])
    assert result.exit_code == 2 and "--resume needs --out" in result.output
