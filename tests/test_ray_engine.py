"""``rt4 verify --engine ray``: the same records as a single-process run, in order, none lost.

One Ray cluster per module (2 CPUs, a small object store), started here as a new local cluster
(``address="local"``); every run is the real CLI in a subprocess that joins it by its address
(never ``--address auto``, which attaches to whatever cluster was started last on the machine),
auditing against the fault server of ``tests/faults.py`` (or the examples' scripted judge). A run
interrupted by killing its driver, or one of whose workers is killed mid-shard, still ends with
every record, each once. Every test is bounded by pytest-timeout (pyproject's ``timeout``, or its own
mark), so a cluster whose workers died fails the test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="needs Ray (the ray extra)")

import ray
from audit_fixtures import read_records, write_rules, write_samples
from faults import FaultServer, fault_server, grounded

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SHARD_WORKER = "MapBatches(AuditShard)"
LINES = 202
"""Input lines of the generated file: 200 samples and two invalid lines."""


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """The address of a new local cluster this module started (never one found on the machine)."""
    ray.init(address="local", num_cpus=2, object_store_memory=80 * 2**20, include_dashboard=False,
             logging_level="ERROR", log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def rt4(*args: str, cwd: Path, otel: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in _environment().items() if not key.startswith("OTEL_")} | (otel or {})
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=600)


def _environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def fault_judge(server: FaultServer) -> list[str]:
    return ["--judge", "openai/smollm2", "--api-base", server.base_url, "--concurrency", "4"]


def ray_flags(address: str) -> list[str]:
    """The flags of a run on the module's cluster, joined by its address."""
    return ["--engine", "ray", "--address", address, "--workers", "2", "--worker-cpus", "0.5"]


def write_inputs(path: Path, count: int) -> None:
    """``count`` generated samples with two invalid lines among them (they get error records)."""
    write_samples(path, count)
    lines = path.read_text(encoding="utf-8").splitlines()
    lines.insert(7, "{not json")
    lines.insert(count // 2, json.dumps({"id": "no-answer", "context": "Nothing here."}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_examples_give_the_single_process_records(tmp_path: Path, ray_cluster: str) -> None:
    """The records of a Ray run equal one process's; and with an OTLP endpoint configured (rt4chart's own spans,
    tests/test_telemetry.py for one process), the workers, other processes configured from the driver's OTEL_*
    variables, trace their samples and calls under the driver's run span (checked on the first run: one Ray run
    serves both checks)."""
    pytest.importorskip("opentelemetry.proto", reason="needs the otel extra")
    from otlp_receiver import otlp_receiver

    for name in ("answers", "free_trial"):
        judge = ["--judge", f"scripted:{EXAMPLES / f'{name}.rules.json'}", "--no-cache", "-q"]
        local = rt4("verify", str(EXAMPLES / f"{name}.jsonl"), "--out", f"{name}.local.jsonl", *judge, cwd=tmp_path)
        with otlp_receiver() as receiver:
            otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "rt4-ray-test"}
            on_ray = rt4("verify", str(EXAMPLES / f"{name}.jsonl"), "--out", f"{name}.ray.jsonl", *judge,
                         *ray_flags(ray_cluster), cwd=tmp_path, otel=otel if name == "answers" else None)
            spans = list(receiver.spans)
        assert on_ray.returncode == local.returncode, on_ray.stderr
        local_text = (tmp_path / f"{name}.local.jsonl").read_text(encoding="utf-8")
        assert (tmp_path / f"{name}.ray.jsonl").read_text(encoding="utf-8") == local_text
        if name != "answers":
            assert spans == []  # no endpoint configured: nothing sent
            continue
        written = read_records(tmp_path / f"{name}.ray.jsonl")
        [run] = [span for span in spans if span.name == "rt4chart.run"]
        samples = [span for span in spans if span.name == "rt4chart.sample"]
        assert {s.service_name for s in spans} == {"rt4-ray-test"} and {s.trace_id for s in spans} == {run.trace_id}
        assert all(s.parent_span_id == run.span_id for s in samples)
        assert sorted((s.attributes["rt4chart.sample.line"], s.attributes["rt4chart.verdict.label"])
                      for s in samples) == sorted((r["line"], r["label"]) for r in written)
        calls = [s for s in spans if s.name.startswith("chat ")]
        assert len(calls) == sum(r["usage"]["calls"] for r in written) > 0
        assert {c.parent_span_id for c in calls} <= {s.span_id for s in samples}


@dataclass
class Generated:
    """A few hundred generated samples, the fault server judging them, and the records of a
    single-process run (the reference every Ray run must reproduce)."""

    directory: Path
    server: FaultServer
    audit: list[str]
    expected: list[dict[str, Any]]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Generated]:
    directory = tmp_path_factory.mktemp("generated")
    write_inputs(directory / "in.jsonl", LINES - 2)
    with fault_server(grounded) as server:
        audit = [*fault_judge(server), "--decomposer", "rules", "--no-cache", "-q"]
        local = rt4("verify", "in.jsonl", "--out", "local.jsonl", *audit, cwd=directory)
        assert local.returncode == 2, local.stderr  # 2: the invalid lines
        yield Generated(directory, server, audit, read_records(directory / "local.jsonl"))


def test_generated_samples_give_the_single_process_records_in_order(generated: Generated, ray_cluster: str) -> None:
    calls_local = len(generated.server.requests)
    on_ray = rt4("verify", "in.jsonl", "--out", "ray.jsonl", *generated.audit, *ray_flags(ray_cluster),
                cwd=generated.directory)
    assert on_ray.returncode == 2, on_ray.stderr
    assert len(generated.server.requests) == 2 * calls_local, "each sample judged once by the workers, none twice"
    records = read_records(generated.directory / "ray.jsonl")
    assert [r["line"] for r in records] == list(range(1, LINES + 1))
    assert records == generated.expected


def _shard_workers() -> list[int]:
    """Process ids of the AuditShard actors, among this test's descendants only."""
    mine = {os.getpid()}
    found = []
    entries = sorted((int(p.name), p) for p in Path("/proc").iterdir() if p.name.isdigit())
    for pid, proc in entries:
        try:
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (proc / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if parent in mine:
            mine.add(pid)
            if SHARD_WORKER in command:
                found.append(pid)
    return found


def _wait_for(condition: Callable[[], bool], timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the run"
        time.sleep(0.2)


def test_a_killed_worker_and_a_killed_driver_lose_no_record(generated: Generated, ray_cluster: str) -> None:
    server, audit, directory = generated.server, generated.audit, generated.directory
    partial = directory / "killed.jsonl"
    server.gate.clear()
    try:
        run = subprocess.Popen([sys.executable, "-m", "rt4chart", "verify", "in.jsonl", "--out", partial.name,
                                *audit, *ray_flags(ray_cluster)], cwd=directory, env=_environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        # A worker killed while its shard's calls are held: Ray restarts it and runs the shard again.
        _wait_for(lambda: server.in_flight > 0 and bool(_shard_workers()))
        os.kill(_shard_workers()[0], signal.SIGKILL)
        server.latency_s = 0.3
        server.gate.set()
        # Then the driver, once the shards in flight at the first kill are long written (answers held
        # again first, so the run cannot finish between the check and the kill).
        _wait_for(lambda: partial.exists() and partial.read_text(encoding="utf-8").count("\n") >= LINES // 3)
        server.gate.clear()
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    finally:
        server.latency_s = 0.0
        server.gate.set()
    written = read_records(partial)
    assert len(written) < LINES, "killed before the end"
    assert written == generated.expected[: len(written)], "what was written is final and in order"
    resumed = rt4("verify", "in.jsonl", "--out", partial.name, "--resume", *audit, *ray_flags(ray_cluster),
                  cwd=directory)
    assert resumed.returncode == 2, resumed.stderr
    assert read_records(partial) == generated.expected


def test_without_ray_the_engine_is_refused_with_exit_2(tmp_path: Path) -> None:
    blocker = tmp_path / "no-ray" / "ray"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named ray (blocked by the test)')\n")
    write_samples(tmp_path / "in.jsonl", 2)
    environment = {**_environment(), "PYTHONPATH": f"{blocker.parent}{os.pathsep}{ROOT}"}
    done = subprocess.run([sys.executable, "-m", "rt4chart", "verify", "in.jsonl", "--engine", "ray", "--no-cache"],
                          cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "--engine ray needs Ray" in done.stderr and "rt4chart[ray]" in done.stderr
    assert "Traceback" not in done.stderr


def test_workers_share_one_budget(ray_cluster: str) -> None:
    """Two workers' ledgers reserve on one keeper actor: together they never pass the cap."""
    from rt4chart.runs.ray_engine import BudgetKeeper, RemoteLedger
    from rt4chart.types import Usage

    keeper = ray.remote(num_cpus=0)(BudgetKeeper).remote(1.0)
    first, second = RemoteLedger(keeper), RemoteLedger(keeper)
    granted = [ledger.reserve(0.3) for ledger in (first, second, first, second)]
    assert granted == [True, True, True, False]
    assert first.settle(0.3, Usage(calls=1, cost_usd=0.2)) == 0.0
    assert second.reserve(0.1) and not second.reserve(0.2)
    totals = ray.get(keeper.totals.remote())
    assert totals["spent_usd"] == pytest.approx(0.2) and totals["refused"] == 2


# The audit runs in this process and waits on Ray Data from a worker thread (asyncio.to_thread): a
# SIGALRM would fail the test, and asyncio.run would then wait for that thread for ever. The thread
# method dumps every stack and ends the session (exit 1): CI fails instead of hanging.
@pytest.mark.timeout(900, method="thread")
def test_progress_shows_the_workers_spend_while_the_run_goes(tmp_path: Path, ray_cluster: str) -> None:
    """With a budget the workers book their spend on the keeper; the driver's progress line follows
    it as the shards' records arrive, not only once the run is over."""
    from rich.console import Console

    from rt4chart.judges.budget import Ledger, RunLimits
    from rt4chart.judges.registry import judge_stack
    from rt4chart.options import AuditOptions
    from rt4chart.records.io import read_jsonl
    from rt4chart.report.progress import AuditProgress, RunSummary
    from rt4chart.runs.engine import EngineOptions, run_audit
    from rt4chart.runs.ray_engine import SHARD_SAMPLES, ray_audit_engine

    samples = 3 * SHARD_SAMPLES
    write_samples(tmp_path / "in.jsonl", samples)
    judge = f"scripted:{write_rules(tmp_path / 'rules.json', cost_per_call=0.01)}"
    ledger = Ledger(limit_usd=100.0)
    stack = judge_stack(judge, ledger=ledger)
    pipeline = ray_audit_engine(stack, AuditOptions(), EngineOptions(engine="ray", workers=2, worker_cpus=0.5),
                            judge=judge, api_base=None, limits=RunLimits(budget_usd=100.0), cache=None)
    log = io.StringIO()
    summary = RunSummary()
    # log_every_s=0: one plain progress line per record, as a CI log shows them (every 10 s there).
    with AuditProgress(samples, ledger, Console(file=log, width=300), log_every_s=0.0, calls_seen=False) as progress:

        def on_record(report: Any) -> None:
            summary.add(report)
            progress.advance(summary)

        async def audit() -> None:
            try:
                await run_audit(pipeline, list(read_jsonl(tmp_path / "in.jsonl")), tmp_path / "out.jsonl", on_record)
            finally:
                await stack.aclose()

        asyncio.run(audit())
    lines = re.findall(r"rt4: (\d+)/\d+ samples .* \$([0-9.]+) of \$100\.0000", log.getvalue())
    spent = [float(spend) for _, spend in lines]
    assert [int(done) for done, _ in lines] == list(range(1, samples + 1)), log.getvalue()
    assert spent[0] > 0, "the first record's line already shows what its shard spent"
    assert spent == sorted(spent)
    spent_by_records = sum(record["usage"]["cost_usd"] for record in read_records(tmp_path / "out.jsonl"))
    assert spent_by_records > 0
    assert ledger.spent_usd == pytest.approx(spent_by_records)
    assert spent[-1] == pytest.approx(spent_by_records, abs=1e-4), "the last line shows the whole spend"


def test_a_budget_stop_under_ray_exits_3_with_the_summary(tmp_path: Path) -> None:
    """Issue 27: a Ray run stopped by its budget once exited 1 (the "hallucinated" code), no summary."""
    write_samples(tmp_path / "in.jsonl", 12)
    rules = write_rules(tmp_path / "rules.json", cost_per_call=0.01)
    done = rt4("verify", "in.jsonl", "--judge", f"scripted:{rules}", "--engine", "ray", "--workers", "1",
               "--worker-cpus", "0.5", "--budget", "0.05", "--no-cache", "--out", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "stopped by budget" in done.stderr and "spent by this run" in done.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert 0 < len(records) < 12 and sum(r["usage"]["cost_usd"] for r in records) <= 0.05


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_driver_leaves_no_ray_process_behind(tmp_path: Path, kill: signal.Signals) -> None:
    """Issue 27: a driver that started its own cluster, once killed, left two Ray agents alive for
    25 s and more. Every process under the driver while it ran is gone soon after it dies."""
    import psutil

    write_samples(tmp_path / "in.jsonl", 40)
    rules = write_rules(tmp_path / "rules.json", latency_s=0.5)  # slow enough to be killed mid-run
    run = subprocess.Popen([sys.executable, "-m", "rt4chart", "verify", "in.jsonl", "--judge", f"scripted:{rules}",
                            "--engine", "ray", "--workers", "1", "--worker-cpus", "0.5", "--no-cache", "--out",
                            "out.jsonl", "-q"], cwd=tmp_path, env=_environment(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    driver = psutil.Process(run.pid)

    def cluster() -> list[psutil.Process]:
        return driver.children(recursive=True)

    try:
        _wait_for(lambda: any(SHARD_WORKER in " ".join(p.cmdline()) for p in cluster()), timeout_s=300)
        started = cluster()
        assert any("raylet" in " ".join(p.cmdline()) for p in started), "the driver started its own cluster"
    finally:
        os.kill(run.pid, kill)
        run.wait(timeout=120)
    def alive(process: psutil.Process) -> bool:
        try:
            return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + 15.0  # a bound on the wait, not a measured figure
    while (left := [p for p in started if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"Ray processes outlived the driver: {[' '.join(p.cmdline())[:80] for p in left]}"


def test_a_run_without_an_address_starts_its_own_cluster_whatever_the_environment_names(
    tmp_path: Path, ray_cluster: str
) -> None:
    """Without ``--address`` the driver starts a new local cluster: Ray's default would join the one
    ``RAY_ADDRESS`` names (here the module's, whose size it cannot set: exit 2 before) and take it
    down at the end as its own."""
    judge = ["--judge", f"scripted:{EXAMPLES / 'answers.rules.json'}", "--no-cache", "-q"]
    local = rt4("verify", str(EXAMPLES / "answers.jsonl"), "--out", "local.jsonl", *judge, cwd=tmp_path)
    environment = {**_environment(), "RAY_ADDRESS": ray_cluster}
    on_ray = subprocess.run([sys.executable, "-m", "rt4chart", "verify", str(EXAMPLES / "answers.jsonl"), "--out",
                             "ray.jsonl", *judge, "--engine", "ray", "--workers", "1", "--worker-cpus", "0.5"],
                            cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert on_ray.returncode == local.returncode, on_ray.stderr
    local_records = (tmp_path / "local.jsonl").read_text(encoding="utf-8")
    assert (tmp_path / "ray.jsonl").read_text(encoding="utf-8") == local_records
    resources = ray.cluster_resources()  # type: ignore[no-untyped-call]
    assert ray.is_initialized() and resources.get("CPU") == 2, "the module's cluster is still up"


RAY_CXX_LOG_LINE = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+ [DIWEF] \d+ \d+\] \S+\.cc:\d+", re.MULTILINE)
"""A line of Ray's C++ logging (``[2026-12-01 14:18:19,412 E 6458 7529] core_worker.cc:2465: ...``)."""


def test_a_ray_run_prints_no_ray_cxx_log_line(tmp_path: Path, ray_cluster: str) -> None:
    # Ray Data's actor pool makes the driver's core worker log an error-level line at every run.
    environment = {key: value for key, value in _environment().items() if key != "RAY_BACKEND_LOG_LEVEL"}
    judge = ["--judge", f"scripted:{EXAMPLES / 'answers.rules.json'}", "--no-cache"]
    run = subprocess.run([sys.executable, "-m", "rt4chart", "verify", str(EXAMPLES / "answers.jsonl"), "--out",
                          "ray.jsonl", *judge, *ray_flags(ray_cluster)], cwd=tmp_path, env=environment,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stderr  # some example answers are hallucinated
    assert "wall time" in run.stderr  # the summary: stderr was read to its end
    assert RAY_CXX_LOG_LINE.search(run.stderr) is None, run.stderr
