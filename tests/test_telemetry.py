"""rt4chart's own runs as OpenTelemetry traces (rt4chart/runs/telemetry.py): a real ``rt4 verify`` sends its
spans to a local OTLP/HTTP receiver (tests/otlp_receiver.py) when ``OTEL_EXPORTER_OTLP_*`` is set: one run
span, a sample span per line with the verdict, a GenAI span per judge call, scrubbed; unset, OpenTelemetry
is never imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from audit_fixtures import write_samples
from conftest import require_module
from faults import fault_server, judge_every_claim

require_module("opentelemetry.sdk", "the otel extra")
from otlp_receiver import ReceivedSpan, otlp_receiver  # noqa: E402 (needs the otel extra, checked above)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "answers.jsonl"
RULES = ROOT / "examples" / "answers.rules.json"
SECRET = "sk-rt4oteltest-0c9d8e7f6a5b4c3d"
STATUS_ERROR = 2
"""OTLP's STATUS_CODE_ERROR."""
KIND_CLIENT = 3
"""OTLP's SPAN_KIND_CLIENT."""


def rt4(*args: str, cwd: Path, otel: dict[str, str], importtime: bool = False) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    environment |= {"PYTHONPATH": str(ROOT), "RT4_OTEL_TEST_API_KEY": SECRET, **otel}
    probe = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *probe, "-m", "rt4chart", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300, check=False)


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.name == name]


def test_a_verify_run_sends_run_sample_and_judge_call_spans_linked_and_attributed(tmp_path: Path) -> None:
    # The first answer's id holds a key: traces leave the machine, so it reaches them scrubbed.
    lines = EXAMPLES.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0]) | {"id": f"refund-{SECRET}"}
    (tmp_path / "in.jsonl").write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n", encoding="utf-8")
    with otlp_receiver() as receiver:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
                "OTEL_EXPORTER_OTLP_HEADERS": f"authorization=Bearer {SECRET}"}
        done = rt4("verify", "in.jsonl", "--judge", f"scripted:{RULES}", "--no-cache", "-o", "out.jsonl",
                   cwd=tmp_path, otel=otel)
        spans = list(receiver.spans)
        headers = list(receiver.headers)
    assert done.returncode == 1, done.stderr  # three of the four answers are hallucinated
    written = records(tmp_path / "out.jsonl")
    assert headers and all(h["authorization"] == f"Bearer {SECRET}" for h in headers), "the exporter's own headers"

    [run] = by_name(spans, "rt4chart.run")
    assert run.parent_span_id == "" and run.service_name == "rt4chart"
    assert run.attributes["rt4chart.judge"] == run.attributes["gen_ai.request.model"] == written[0]["judge"]
    assert run.attributes["rt4chart.run.records"] == len(written)
    assert run.attributes["rt4chart.run.hallucinated"] == sum(bool(r["hallucinated"]) for r in written)
    assert run.attributes["rt4chart.run.status"] == "failed" and run.status_code != STATUS_ERROR
    samples = by_name(spans, "rt4chart.sample")
    assert len(samples) == len(written)
    assert {s.trace_id for s in spans} == {run.trace_id}
    assert all(s.parent_span_id == run.span_id for s in samples)
    by_line = {s.attributes["rt4chart.sample.line"]: s for s in samples}
    for record in written:
        span = by_line[record["line"]]
        assert span.attributes["rt4chart.verdict.label"] == record["label"]
        assert span.attributes["rt4chart.verdict.hallucinated"] == record["hallucinated"]
        assert span.attributes["rt4chart.verdict.claims"] == len(record["claims"])  # type: ignore[arg-type]
    assert by_line[1].attributes["rt4chart.sample.id"] == "refund-***"
    assert by_line[2].attributes["rt4chart.sample.id"] == written[1]["id"]

    calls = [s for s in spans if s.name not in ("rt4chart.run", "rt4chart.sample")]
    judge = str(written[0]["judge"])
    assert calls and all(c.name == f"chat {judge}" and c.kind == KIND_CLIENT for c in calls)
    assert all(c.parent_span_id in {s.span_id for s in samples} for c in calls)
    assert all(c.attributes["gen_ai.request.model"] == judge for c in calls)
    assert all(c.attributes["gen_ai.operation.name"] == "chat" for c in calls)
    # One span per judge call each sample's usage counts.
    for record in written:
        usage = record["usage"]
        assert isinstance(usage, dict)
        children = [c for c in calls if c.parent_span_id == by_line[record["line"]].span_id]
        assert len(children) == usage["calls"] > 0
    assert not [s for s in spans if SECRET in json.dumps(s.attributes) + s.name + s.status_message]


def test_judge_call_spans_carry_the_servers_tokens_and_cost(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", 2)
    with otlp_receiver() as receiver, fault_server(judge_every_claim("entailed")) as server:
        server.prompt_tokens = lambda body: 1234
        otel = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{receiver.url}/v1/traces", "OPENAI_API_KEY": SECRET}
        done = rt4("verify", "in.jsonl", "--judge", "gpt-4o-mini", "--api-base", server.base_url, "--no-cache",
                   "--decomposer", "rules", "-o", "out.jsonl", cwd=tmp_path, otel=otel)
        spans = list(receiver.spans)
    assert done.returncode == 1, done.stderr  # evidence-free "entailed" replies are not trusted: baseless
    calls = [s for s in spans if s.name.startswith("chat ")]
    written = records(tmp_path / "out.jsonl")
    assert len(calls) == sum(r["usage"]["calls"] for r in written)  # type: ignore[index]
    assert all(c.attributes["gen_ai.usage.input_tokens"] == 1234 for c in calls)
    assert all(c.attributes["gen_ai.usage.output_tokens"] > 0 for c in calls)
    assert sum(c.attributes["rt4chart.cost_usd"] for c in calls) == pytest.approx(
        sum(r["usage"]["cost_usd"] for r in written)  # type: ignore[index]
    )
    assert all(c.attributes["rt4chart.cached"] is False for c in calls)
    assert not [s for s in spans if SECRET in json.dumps(s.attributes)]


def test_a_judge_that_cannot_be_reached_makes_error_spans(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", 1)
    with otlp_receiver() as receiver:
        with fault_server(judge_every_claim("entailed")) as server:
            base_url = server.base_url  # closed below: nothing answers there any more
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OPENAI_API_KEY": SECRET}
        done = rt4("verify", "in.jsonl", "--judge", "gpt-4o-mini", "--api-base", base_url, "--no-cache",
                   "--decomposer", "rules", "--timeout", "2", "-o", "out.jsonl", cwd=tmp_path, otel=otel)
        spans = list(receiver.spans)
    assert done.returncode != 0
    [run] = by_name(spans, "rt4chart.run")
    assert run.status_code == STATUS_ERROR and run.attributes["rt4chart.run.status"] == "incomplete"
    [sample] = by_name(spans, "rt4chart.sample")
    assert sample.status_code == STATUS_ERROR and sample.attributes["rt4chart.verdict.incomplete"] is True
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert calls and all(c.status_code == STATUS_ERROR and c.attributes["error.type"] for c in calls)


DISABLED = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}


@pytest.mark.parametrize("otel", [{}, DISABLED], ids=["unset", "disabled"])
def test_without_an_endpoint_opentelemetry_is_never_imported(tmp_path: Path, otel: dict[str, str]) -> None:
    done = rt4("verify", str(EXAMPLES), "--judge", f"scripted:{RULES}", "--no-cache", "-o", "out.jsonl",
               cwd=tmp_path, otel=otel, importtime=True)
    assert done.returncode == 1, done.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "rt4chart.runs.run" in imported, "the probe sees the run layer's imports"
    assert not {name for name in imported if name.split(".")[0] == "opentelemetry"}


def test_an_endpoint_without_the_otel_extra_is_a_usage_error(tmp_path: Path) -> None:
    blocked = ROOT / "tests" / "blocked_imports.py"
    environment = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    environment |= {"PYTHONPATH": str(ROOT), "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, str(blocked), "opentelemetry", "--", "verify", str(EXAMPLES), "--judge", f"scripted:{RULES}",
         "--no-cache", "-o", "out.jsonl"],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 2
    assert "pip install 'rt4chart[otel]'" in " ".join(done.stderr.split()) and "Traceback" not in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


def test_a_collector_that_cannot_be_reached_changes_neither_records_nor_exit_code(tmp_path: Path) -> None:
    closed = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    traced = rt4("verify", str(EXAMPLES), "--judge", f"scripted:{RULES}", "--no-cache", "-o", "traced.jsonl",
                 cwd=tmp_path, otel=closed)
    plain = rt4("verify", str(EXAMPLES), "--judge", f"scripted:{RULES}", "--no-cache", "-o", "plain.jsonl",
                cwd=tmp_path, otel={})
    assert traced.returncode == plain.returncode == 1 and "Traceback" not in traced.stderr
    labels = [[r["label"], r["claims"]] for r in records(tmp_path / "traced.jsonl")]
    assert labels == [[r["label"], r["claims"]] for r in records(tmp_path / "plain.jsonl")]


def test_a_compare_run_sends_one_run_span_per_judge_under_the_comparison(tmp_path: Path) -> None:
    flag = tmp_path / "flag.rules.json"
    flag.write_text(json.dumps({"default": "baseless"}), encoding="utf-8")
    judges = [f"scripted:{flag}", f"scripted:{RULES}"]
    with otlp_receiver() as receiver:
        done = rt4("compare", str(EXAMPLES), "--judges", ",".join(judges), "--decompose-with", f"scripted:{RULES}",
                   "--out-dir", "out", "--no-cache", "-q", "--resamples", "20", cwd=tmp_path,
                   otel={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        spans = list(receiver.spans)
    assert done.returncode == 0, done.stderr
    [comparison] = by_name(spans, "rt4chart.compare")
    assert comparison.parent_span_id == "" and {s.trace_id for s in spans} == {comparison.trace_id}
    assert comparison.attributes["rt4chart.command"] == "compare"
    assert comparison.attributes["rt4chart.run.status"] == "passed"
    runs = by_name(spans, "rt4chart.run")
    assert all(run.parent_span_id == comparison.span_id for run in runs)
    files = sorted((tmp_path / "out").glob("*.jsonl"))
    written = {str(records(f)[0]["judge"]): records(f) for f in files}
    assert sorted(str(run.attributes["rt4chart.judge"]) for run in runs) == sorted(written)
    for run in runs:
        judged = written[str(run.attributes["rt4chart.judge"])]
        assert run.attributes["rt4chart.run.records"] == len(judged)
        assert run.attributes["rt4chart.run.hallucinated"] == sum(bool(r["hallucinated"]) for r in judged)
        samples = [s for s in by_name(spans, "rt4chart.sample") if s.parent_span_id == run.span_id]
        assert sorted((s.attributes["rt4chart.sample.line"], s.attributes["rt4chart.verdict.label"]) for s in samples) \
            == sorted((r["line"], r["label"]) for r in judged)
        calls = [c for c in spans if c.parent_span_id in {s.span_id for s in samples}]
        assert calls and all(c.name == f"chat {run.attributes['rt4chart.judge']}" for c in calls)
    decomposing = [c for c in spans if c.parent_span_id == comparison.span_id and c.name.startswith("chat ")]
    assert decomposing and all(c.attributes["rt4chart.task"] == "decompose" for c in decomposing)


def test_a_repair_run_traces_each_line_and_its_reaudit_as_a_child_run(tmp_path: Path) -> None:
    verified = tmp_path / "verified.jsonl"
    done = rt4("verify", str(EXAMPLES), "--judge", f"scripted:{RULES}", "--no-cache", "-o", str(verified),
               cwd=tmp_path, otel={})
    assert done.returncode == 1, done.stderr
    with otlp_receiver() as receiver:
        done = rt4("repair", str(verified), "--strategy", "extract", "--input", str(EXAMPLES),
                   "--out", "repaired.jsonl", "--verify-after", "--verify-judge", f"scripted:{RULES}", "--no-cache",
                   cwd=tmp_path, otel={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        spans = list(receiver.spans)
    assert done.returncode in (0, 1), done.stderr
    repaired = records(tmp_path / "repaired.jsonl")
    [repair] = [run for run in by_name(spans, "rt4chart.run") if run.attributes["rt4chart.command"] == "repair"]
    [reaudit] = [run for run in by_name(spans, "rt4chart.run") if run.attributes["rt4chart.command"] == "verify"]
    assert repair.parent_span_id == "" and reaudit.parent_span_id == repair.span_id
    assert {s.trace_id for s in spans} == {repair.trace_id}
    lines = [s for s in by_name(spans, "rt4chart.sample") if s.parent_span_id == repair.span_id]
    assert sorted(s.attributes["rt4chart.sample.line"] for s in lines) == [r["line"] for r in repaired]
    by_line = {s.attributes["rt4chart.sample.line"]: s for s in lines}
    for record in repaired:
        span = by_line[record["line"]]
        assert span.attributes["rt4chart.repair.strategy"] == "extract"
        assert span.attributes["rt4chart.repair.changed"] == (record["repaired"] != record["original"])
        assert span.attributes["rt4chart.repair.unsupported_claims"] == record["unsupported_claims"]
    rechecked = [s for s in by_name(spans, "rt4chart.sample") if s.parent_span_id == reaudit.span_id]
    assert len(rechecked) == reaudit.attributes["rt4chart.run.records"] > 0
    assert [c for c in spans if c.parent_span_id in {s.span_id for s in rechecked}], "the re-audit's judge calls"


def test_an_eval_run_is_a_traced_run_named_eval(tmp_path: Path) -> None:
    labelled = tmp_path / "labelled.jsonl"
    lines = [json.loads(line) for line in EXAMPLES.read_text(encoding="utf-8").splitlines()]
    labelled.write_text("".join(json.dumps(line | {"gold": {"hallucinated": n % 2 == 1}}) + "\n"
                                for n, line in enumerate(lines)), encoding="utf-8")
    with otlp_receiver() as receiver:
        done = rt4("eval", "generic", "--path", str(labelled), "--judge", f"scripted:{RULES}",
                   "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path,
                   otel={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
        spans = list(receiver.spans)
    assert done.returncode == 0, done.stderr
    [run] = by_name(spans, "rt4chart.run")
    assert run.attributes["rt4chart.command"] == "eval" and run.attributes["rt4chart.run.records"] == len(lines)
    assert len([s for s in by_name(spans, "rt4chart.sample") if s.parent_span_id == run.span_id]) == len(lines)


@pytest.mark.asyncio
async def test_the_guard_traces_each_answer_as_a_root_span_with_its_judge_calls(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import aiohttp

    from rt4chart.runs.guard import GuardConfig, start_guard

    answers = [json.loads(line) for line in EXAMPLES.read_text(encoding="utf-8").splitlines()][:2]
    with otlp_receiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
        guard = await start_guard(GuardConfig(port=0, judge=f"scripted:{RULES}"))
        try:
            async with aiohttp.ClientSession(guard.url) as http:
                labels = {}
                for answer in answers:
                    body = {k: answer[k] for k in ("id", "context", "question", "answer")}
                    async with http.post("/v1/verify", json=body) as response:
                        labels[answer["id"]] = (await response.json())["record"]["label"]
        finally:
            await guard.stop()  # flushes the spans
        spans = list(receiver.spans)
    samples = by_name(spans, "rt4chart.sample")
    assert {s.attributes["rt4chart.sample.id"]: s.attributes["rt4chart.verdict.label"] for s in samples} == labels
    assert all(s.parent_span_id == "" and s.attributes["rt4chart.command"] == "guard" for s in samples)
    assert "rt4chart.sample.line" not in samples[0].attributes  # a service's answer has no input line
    assert len({s.trace_id for s in samples}) == len(samples)  # one trace per answer
    calls = [s for s in spans if s.name.startswith("chat ")]
    assert calls and {c.parent_span_id for c in calls} == {s.span_id for s in samples}
