"""The run layer: one status-to-exit-code map, typed stops, and every entry point through it.

Judges that cannot be reached are real: a port on 127.0.0.1 that was bound and closed again, and
the fault server of ``tests/faults.py`` answering 401. ``rt4 compare`` and ``rt4 repair
--verify-after`` exit 4 with the endpoint named, on one sample and on many.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from audit_fixtures import read_records, write_rules, write_samples
from conftest import EXAMPLES
from faults import Fault, fault_server
from pydantic import TypeAdapter
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.records.io import read_jsonl
from rt4chart.records.manifest import RunCounts
from rt4chart.report.outputs import PublishOptions
from rt4chart.runs.engine import BudgetStop, RunStop, UnavailableStop
from rt4chart.runs.run import RunSpec, RunStatus, RunUsageError, execute, exit_code, status_of

EXIT_JUDGE_UNAVAILABLE = 4


def test_each_status_has_the_documented_exit_code_and_precedence_is_3_2_4_1() -> None:
    documented = {
        RunStatus.STOPPED_BY_BUDGET: 3, RunStatus.INVALID_INPUT: 2, RunStatus.JUDGE_UNAVAILABLE: 4,
        RunStatus.INCOMPLETE: 4, RunStatus.FAILED: 1, RunStatus.PASSED: 0,
    }
    assert {status: exit_code(status) for status in documented} == documented
    unavailable = UnavailableStop(endpoint="e", failures=1, last_error="x")
    assert status_of(RunCounts(invalid=1, incomplete=1), None, True) is RunStatus.INVALID_INPUT
    assert status_of(RunCounts(invalid=1), BudgetStop(detail="cap"), True) is RunStatus.STOPPED_BY_BUDGET
    assert status_of(RunCounts(incomplete=1), unavailable, True) is RunStatus.JUDGE_UNAVAILABLE
    assert status_of(RunCounts(incomplete=1), None, True) is RunStatus.INCOMPLETE
    assert status_of(RunCounts(), None, True) is RunStatus.FAILED
    assert status_of(RunCounts(), None, False) is RunStatus.PASSED


def test_a_stop_crosses_a_process_boundary_as_a_typed_value() -> None:
    reader: TypeAdapter[BudgetStop | UnavailableStop] = TypeAdapter(RunStop)
    unavailable = UnavailableStop(endpoint="openai/x@http://127.0.0.1:1/v1", failures=3, last_error="HTTP 401")
    assert reader.validate_json(unavailable.model_dump_json()) == unavailable
    assert reader.validate_json(BudgetStop(detail="cap").model_dump_json()) == BudgetStop(detail="cap")
    assert "127.0.0.1:1" in str(unavailable) and "HTTP 401" in str(unavailable)


def test_the_python_api_resumes_publishes_and_reports_status_as_rt4_verify_does(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 3)
    out, junit = tmp_path / "out.jsonl", tmp_path / "junit.xml"
    spec = RunSpec(judge=f"scripted:{rules}", cache=tmp_path / "cache", input_file=inputs, out=out,
                   outputs=PublishOptions(junit=junit))
    first = execute(spec, read_jsonl(inputs))
    assert first.status is RunStatus.FAILED and first.exit_code == 1  # "also sells cakes" is baseless
    assert first.counts.written == 3 and first.counts.hallucinated == 3 and junit.is_file()
    again = execute(spec.model_copy(update={"resume": True}), read_jsonl(inputs))
    assert again.counts.resumed == 3 and again.counts.written == 0
    assert [r["id"] for r in read_records(out)] == ["s0", "s1", "s2"]
    with pytest.raises(RunUsageError, match="--resume needs --out"):
        execute(spec.model_copy(update={"resume": True, "out": None}), read_jsonl(inputs))


def test_an_invalid_line_is_exit_2_even_when_answers_fail(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 2)
    inputs.write_text(inputs.read_text(encoding="utf-8") + "not json\n", encoding="utf-8")
    outcome = execute(RunSpec(judge=f"scripted:{rules}"), read_jsonl(inputs))
    assert outcome.status is RunStatus.INVALID_INPUT and outcome.counts.invalid == 1 and outcome.fails


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@contextmanager
def unreachable(kind: str) -> Iterator[str]:
    """The base URL of a judge that cannot be reached (closed port) or refuses every call (401)."""
    if kind == "closed":
        yield closed_port_url()
        return
    with fault_server("{}", default=Fault("echo_key")) as server:
        yield server.base_url


def samples_file(tmp_path: Path, count: int) -> Path:
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, count)
    return inputs


def squeezed(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("kind", ["closed", "401"])
@pytest.mark.parametrize("count", [1, 4])
def test_compare_against_an_unreachable_judge_exits_4_naming_the_endpoint(
    tmp_path: Path, kind: str, count: int
) -> None:
    inputs, rules = samples_file(tmp_path, count), write_rules(tmp_path / "rules.json")
    with unreachable(kind) as url:
        result = CliRunner().invoke(app, [
            "compare", str(inputs), "--judges", f"openai/fault,scripted:{rules}", "--api-base", url,
            "--out-dir", str(tmp_path / "cmp"), "--decomposer", "rules", "--no-cache", "-q",
        ], catch_exceptions=False)
    assert result.exit_code == EXIT_JUDGE_UNAVAILABLE, result.output
    assert squeezed(url) in squeezed(result.stderr)
    assert "Agreement" not in result.stdout, "no agreement over verdicts the judge never gave"
    files = sorted((tmp_path / "cmp").glob("*.jsonl"))
    assert [len(read_records(path)) for path in files] == [count, count], "one record per input line"


@pytest.mark.parametrize("kind", ["closed", "401"])
@pytest.mark.parametrize("count", [1, 4])
def test_repair_verify_after_against_an_unreachable_judge_exits_4_naming_the_endpoint(
    tmp_path: Path, kind: str, count: int
) -> None:
    inputs, rules = samples_file(tmp_path, count), write_rules(tmp_path / "rules.json")
    verified, repaired = tmp_path / "verified.jsonl", tmp_path / "repaired.jsonl"
    runner = CliRunner()
    audit = runner.invoke(app, ["verify", str(inputs), "--judge", f"scripted:{rules}", "--decomposer", "rules",
                                "--out", str(verified), "--no-cache", "-q"])
    assert audit.exit_code == 1  # every sample has a baseless claim for repair to remove
    with unreachable(kind) as url:
        result = runner.invoke(app, [
            "repair", str(verified), "--input", str(inputs), "--out", str(repaired), "--verify-after",
            "--judge", "openai/fault", "--api-base", url, "--decomposer", "rules", "--no-cache", "-q",
        ], catch_exceptions=False)
    assert result.exit_code == EXIT_JUDGE_UNAVAILABLE, result.output
    assert squeezed(url) in squeezed(result.stderr)
    records = [json.loads(line) for line in repaired.read_text(encoding="utf-8").splitlines()]
    assert len(records) == count and all(r["verified_after"]["hallucinated"] is None for r in records)


def test_verify_signals_need_no_out_flag_now(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["verify", str(EXAMPLES / "answers.jsonl"), "--signals", "csr"])
    assert result.exit_code == 2 and "--signal-model" in result.stderr and "--out" not in result.stderr


def test_records_written_with_the_old_signal_fields_read_into_the_open_maps() -> None:
    from rt4chart.types import AuditRecord

    old = {
        "id": "a", "line": 1, "label": "entailed", "hallucinated": False,
        "claims": [{"index": 0, "text": "x", "sentence_index": 0, "answer_span": {"start": 0, "end": 1},
                    "label": "entailed", "csr_mean": 0.25, "csr_max": 0.5, "probe_mean": None, "probe_max": None}],
        "signals": {"signal": "csr", "model": "m#1", "template_version": "t", "delta": 0.2, "tokens": [],
                    "spans": [], "flagged": False, "cached": False},
    }
    report = AuditRecord.model_validate(old)
    assert report.claims[0].signals == {"csr_mean": 0.25, "csr_max": 0.5}
    assert set(report.signal_tokens) == {"csr"} and report.signals == {}
    assert AuditRecord.model_validate_json(report.model_dump_json()) == report


def test_the_run_layer_decides_the_exit_of_rt4_signals_and_counts_flagged_records(tmp_path: Path) -> None:
    from rt4chart.runs.run import write_signal_records
    from rt4chart.signals.csr import SignalRecord
    from rt4chart.types import SignalReport

    def report(flagged: bool) -> SignalReport:
        return SignalReport(signal="csr", model="m", template_version="t", delta=0.2, flagged=flagged)

    records = [SignalRecord(id="a", line=1, signals=report(True)), SignalRecord(id="b", line=2, signals=report(False))]
    out = tmp_path / "signals.jsonl"
    outcome = write_signal_records(out, records)
    assert (outcome.status, outcome.exit_code, outcome.counts.flagged, outcome.counts.invalid) == (
        RunStatus.PASSED, 0, 1, 0)
    broken = [*records, SignalRecord(id=None, line=3, errors=["line 3: not JSON"])]
    outcome = write_signal_records(out, broken)
    assert (outcome.status, outcome.exit_code, outcome.counts.records) == (RunStatus.INVALID_INPUT, 2, 3)
    assert [json.loads(line)["line"] for line in out.read_text().splitlines()] == [1, 2, 3]  # every line has its record
