"""Progress and summary output of an audit."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from rt4chart.judges.budget import Ledger
from rt4chart.options import FailOn
from rt4chart.report.progress import (
    HEARTBEAT_ENV,
    AuditProgress,
    RunSummary,
    lines_text,
    print_summary,
)
from rt4chart.types import AuditRecord, Label, Usage
from tests.faults import FaultServer, fault_server, judge_every_claim


def finished(label: Label, calls: int, hits: int) -> AuditRecord:
    return AuditRecord(id="x", line=1, label=label, hallucinated=label != Label.ENTAILED,
                  usage=Usage(calls=calls, cache_hits=hits, cost_usd=0.01 * calls))


def test_plain_progress_lines_when_stderr_is_not_a_terminal() -> None:
    stream = io.StringIO()
    ledger = Ledger(limit_usd=1.0, spent_usd=0.25, in_flight=3)
    summary = RunSummary()
    with AuditProgress(4, ledger, Console(file=stream, force_terminal=False), log_every_s=0) as progress:
        for report in (finished(Label.ENTAILED, 3, 1), finished(Label.BASELESS, 0, 4)):
            summary.add(report)
            progress.advance(summary)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[-1].startswith("rt4: 2/4 samples")
    assert "3 calls in flight, 0 queued" in lines[-1] and "$0.2500 of $1.0000" in lines[-1]
    assert "cache hits 62%" in lines[-1], "5 hits of 8 lookups"


def test_progress_leaves_out_calls_it_cannot_see() -> None:
    """With --engine ray the workers make the calls: the driver's line must not claim 0 in flight."""
    stream = io.StringIO()
    ledger = Ledger(limit_usd=1.0, spent_usd=0.25, in_flight=0)
    console = Console(file=stream, force_terminal=False)
    with AuditProgress(1, ledger, console, log_every_s=0, calls_seen=False) as progress:
        summary = RunSummary()
        summary.add(finished(Label.ENTAILED, 2, 0))
        progress.advance(summary)
    line = stream.getvalue().strip()
    assert line.startswith("rt4: 1/1 samples") and "$0.2500 of $1.0000" in line
    assert "in flight" not in line


def test_quiet_progress_prints_nothing() -> None:
    stream = io.StringIO()
    summary = RunSummary()
    with AuditProgress(1, Ledger(), Console(file=stream), enabled=False, log_every_s=0) as progress:
        summary.add(finished(Label.ENTAILED, 1, 0))
        progress.advance(summary)
    assert stream.getvalue() == ""


def test_live_bar_on_a_terminal() -> None:
    stream = io.StringIO()
    summary = RunSummary()
    console = Console(file=stream, force_terminal=True, width=160)
    with AuditProgress(2, Ledger(), console, log_every_s=0) as progress:
        summary.add(finished(Label.CONTRADICTED, 2, 0))
        progress.advance(summary)
        progress._bar.refresh()  # type: ignore[union-attr]
    assert "auditing" in stream.getvalue() and "1/2" in stream.getvalue()


def test_summary_reports_budget_stop_and_spend() -> None:
    stream = io.StringIO()
    summary = RunSummary(stopped_by_budget=True, remaining=7, spent_usd=0.19, budget_usd=0.2)
    summary.add(finished(Label.CONTRADICTED, 4, 0))
    print_summary(summary, Console(file=stream, width=120))
    text = stream.getvalue()
    assert "7 samples not audited" in text and "$0.1900 of $0.2000" in text


def test_a_heartbeat_reaches_a_redirected_stderr_before_the_first_sample_finishes(tmp_path: Path) -> None:
    """A CI job on a slow judge: the fault server holds every answer until the job's stderr (a file)
    shows a progress line, so that line provably came while the first sample was still waiting."""
    input_path = tmp_path / "in.jsonl"
    sample = {"id": "a", "context": "Plans vary. The trial lasts 14 days.", "answer": "The trial lasts 14 days."}
    input_path.write_text(json.dumps(sample) + "\n", encoding="utf-8")
    log = tmp_path / "stderr.log"
    environment = {**os.environ, HEARTBEAT_ENV: "0.2"}
    with fault_server(judge_every_claim("entailed")) as server:
        server.gate.clear()
        command = [str(Path(sys.executable).with_name("rt4")), "verify", str(input_path), "--judge", "openai/judge",
                   "--api-base", server.base_url, "-o", str(tmp_path / "out.jsonl"), "--cache-dir", str(tmp_path / "c")]
        with log.open("w", encoding="utf-8") as stderr:
            job = subprocess.Popen(command, stderr=stderr, stdout=subprocess.DEVNULL, env=environment)
            try:
                waiting = re.compile(r"rt4: 0/1 samples \| \d+ judge calls done \| 1 calls in flight, 0 queued")
                heartbeat = _wait_for_line(log, waiting)
            finally:
                server.gate.set()
                returncode = job.wait(timeout=300)
    assert returncode in (0, 1), log.read_text(encoding="utf-8")
    assert len((tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()) == 1
    assert "elapsed" in heartbeat and "$" in heartbeat
    assert server.requests, "the held call was answered after the heartbeat"
    text = log.read_text(encoding="utf-8")
    assert text.index(heartbeat) < text.index("rt4chart audit"), "the heartbeat precedes the summary"


def test_the_heartbeat_tells_calls_on_the_wire_from_calls_queued(tmp_path: Path) -> None:
    """``--concurrency 2`` with more calls ready: the server holds its answers, so it holds exactly the
    two calls that have a slot, and the heartbeat must say 2 in flight and the rest queued."""
    input_path = tmp_path / "in.jsonl"
    samples = [{"id": str(n), "context": f"Plans vary. The trial lasts {n} days.",
                "answer": f"The trial lasts {n} days."} for n in range(1, 7)]
    input_path.write_text("".join(json.dumps(sample) + "\n" for sample in samples), encoding="utf-8")
    log = tmp_path / "stderr.log"
    environment = {**os.environ, HEARTBEAT_ENV: "0.2"}
    with fault_server(judge_every_claim("entailed")) as server:
        server.gate.clear()
        command = [sys.executable, "-m", "rt4chart", "verify", str(input_path), "--judge", "openai/judge",
                   "--api-base", server.base_url, "--concurrency", "2", "-o", str(tmp_path / "out.jsonl"),
                   "--no-cache"]
        with log.open("w", encoding="utf-8") as stderr:
            job = subprocess.Popen(command, stderr=stderr, stdout=subprocess.DEVNULL, env=environment)
            try:
                _wait_for_line(log, re.compile(r"2 calls in flight, [1-9]\d* queued"))
                held = _held_calls(server)
            finally:
                server.gate.set()
                returncode = job.wait(timeout=300)
    assert returncode in (0, 1), log.read_text(encoding="utf-8")
    assert held == 2 and server.max_in_flight == 2, "the server saw what the heartbeat calls in flight"


def _held_calls(server: FaultServer, attempts: int = 60) -> int:
    """The requests the server holds, once it holds two (a call counts as in flight from the moment
    it has its slot, a moment before its request arrives), else what it holds at the end."""
    for _ in range(attempts):
        if server.in_flight >= 2:
            break
        time.sleep(0.1)
    return server.in_flight


def _wait_for_line(path: Path, pattern: re.Pattern[str], attempts: int = 240) -> str:
    """The first line of ``path`` matching ``pattern``, polled until it is written (a stuck run fails the test)."""
    for _ in range(attempts):
        match = pattern.search(path.read_text(encoding="utf-8"))
        if match:
            line_start = path.read_text(encoding="utf-8").rfind("\n", 0, match.start()) + 1
            return path.read_text(encoding="utf-8")[line_start:].splitlines()[0]
        time.sleep(0.5)
    tail = path.read_text(encoding="utf-8")[-1500:]
    raise AssertionError(f"no line matching {pattern.pattern!r}; stderr ends {tail!r}")


def test_sigterm_says_what_was_kept_and_how_to_resume(tmp_path: Path) -> None:
    """A cancelled CI job: SIGTERM while the second sample's call is held by the server (its reply
    waits on an event the test never sets before the signal)."""
    input_path = tmp_path / "in.jsonl"
    samples = [{"id": "a", "context": "Plans vary. The trial lasts 14 days.", "answer": "The trial lasts 14 days."},
               {"id": "b", "context": "Plans vary. The trial lasts 30 days.", "answer": "The trial lasts 30 days."}]
    input_path.write_text("".join(json.dumps(sample) + "\n" for sample in samples), encoding="utf-8")
    out, log = tmp_path / "out.jsonl", tmp_path / "stderr.log"
    release = threading.Event()
    entailed = judge_every_claim("entailed")

    def hold_the_second_sample(body: dict[str, Any]) -> str:
        if "30 days" in json.dumps(body):
            release.wait(timeout=120)
        return entailed(body)

    with fault_server(hold_the_second_sample) as server:
        command = [str(Path(sys.executable).with_name("rt4")), "verify", str(input_path), "--judge", "openai/judge",
                   "--api-base", server.base_url, "-o", str(out), "--no-cache", "--concurrency", "1",
                   "--samples-in-flight", "1"]
        with log.open("w", encoding="utf-8") as stderr:
            job = subprocess.Popen(command, stderr=stderr, stdout=subprocess.DEVNULL,
                                   env={**os.environ, HEARTBEAT_ENV: "0.2"})
            try:
                _wait_for_line(log, re.compile(r"rt4: 1/2 samples .* 1 calls in flight"))
                job.send_signal(signal.SIGTERM)
                returncode = job.wait(timeout=120)
            finally:
                release.set()
                if job.poll() is None:
                    job.kill()
    message = " ".join(log.read_text(encoding="utf-8").split())
    assert returncode == 130, message[-2000:]
    assert f"interrupted: 1 complete records are in {out}" in message and "--resume" in message
    assert [json.loads(line)["id"] for line in out.read_text(encoding="utf-8").splitlines()] == ["a"]


def _reason(fail_on: FailOn, labels: list[Label]) -> str:
    """The run layer's reason for records with ``labels`` under ``fail_on`` (max rate 0.5)."""
    from rt4chart.report.outputs import PublishOptions
    from rt4chart.runs.run import policy_fails, reason_of, status_of

    summary = RunSummary(fail_on=fail_on, max_rate=0.5)
    for label in labels:
        summary.add(finished(label, 1, 0))
    counts = summary.record_counts()
    fails = policy_fails(counts, PublishOptions(fail_on=fail_on, max_rate=0.5))
    return reason_of(status_of(counts, None, fails), summary, None, "judge")


def test_the_reason_says_which_policy_failed_and_by_how_much() -> None:
    labels = [Label.CONTRADICTED, Label.BASELESS, Label.BASELESS, Label.ENTAILED]
    assert _reason(FailOn.HALLUCINATED, labels) == "failed: 3 of 4 answers hallucinated (75%) > --max-rate 0.50"
    assert _reason(FailOn.CONTRADICTED, labels) == "passed: 1 of 4 answers contradicted (25%) <= --max-rate 0.50"


def test_the_summary_names_invalid_lines_and_what_a_resume_kept() -> None:
    summary = RunSummary(resumed=2)
    for line in (9, 3, 4, 12, 15, 20, 30):
        summary.add(AuditRecord(id=None, line=line, label=None, errors=["not JSON"]))
    summary.add(finished(Label.ENTAILED, 0, 1))
    assert lines_text(summary.invalid_lines) == "lines 3, 4, 9, 12, 15 and 2 more"
    # Records come in completion order: the reasons kept are the lowest lines', however many are bad.
    assert sorted(summary.invalid_reasons) == [3, 4, 9]
    stream = io.StringIO()
    print_summary(summary, Console(file=stream, width=160))
    text = stream.getvalue()
    assert "7 (lines 3, 4, 9, 12, 15 and 2 more)" in text
    assert "8 (2 kept from the earlier run, 6 audited now)" in text
