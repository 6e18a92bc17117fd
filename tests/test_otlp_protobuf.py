"""OTLP protobuf trace exports as input (rt4chart/records/otlp_protobuf.py): a binary
``ExportTraceServiceRequest`` gives the items of its OTLP/JSON twin (real_sdk_openai.pb and .json were
written by the real SDK from the same spans), also when a Collector's file exporter frames several requests
by their lengths; a file that is not OTLP protobuf, or no opentelemetry-proto installed, is one clear usage
error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import require_module

from rt4chart.records.traces import TraceError, read_otlp_traces

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "fixtures" / "traces"
BINARY, JSON_TWIN = TRACES / "real_sdk_openai.pb", TRACES / "real_sdk_openai.json"
RULES = ROOT / "examples" / "answers.rules.json"
BLOCKED_IMPORTS = ROOT / "tests" / "blocked_imports.py"
EXIT_USAGE = 2

require_module("opentelemetry.proto", "the otel extra (opentelemetry-proto)")


def _framed(*requests: bytes) -> bytes:
    """Requests as the Collector's file exporter writes them with ``format: proto``."""
    return b"".join(len(request).to_bytes(4, "big") + request for request in requests)


def _rt4(*args: str, blocked: str | None = None) -> subprocess.CompletedProcess[str]:
    prefix = [str(BLOCKED_IMPORTS), blocked, "--"] if blocked else ["-m", "rt4chart"]
    return subprocess.run([sys.executable, *prefix, *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT)


def _verdicts(path: Path) -> list[tuple[Any, ...]]:
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return [(r["line"], r["id"], r["label"], r["trace"], r["errors"], [(c["text"], c["label"]) for c in r["claims"]])
            for r in records]


def test_a_protobuf_export_gives_the_items_of_its_json_twin(tmp_path: Path) -> None:
    items = list(read_otlp_traces(BINARY))
    assert items == list(read_otlp_traces(JSON_TWIN))
    assert [item.sample is not None for item in items] == [True, True, False]
    # Any suffix: a file that is not UTF-8 text is read as protobuf.
    unnamed = tmp_path / "export.bin"
    unnamed.write_bytes(BINARY.read_bytes())
    assert list(read_otlp_traces(unnamed)) == items


def test_length_delimited_requests_are_read_as_one_export(tmp_path: Path) -> None:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    whole = ExportTraceServiceRequest.FromString(BINARY.read_bytes())
    [resource] = whole.resource_spans
    assert len(resource.scope_spans) > 1  # the app's own spans and the instrumentation's
    parts = []
    for scope in resource.scope_spans:  # one request per scope: each trace's spans split over requests
        part = ExportTraceServiceRequest()
        added = part.resource_spans.add()
        added.resource.CopyFrom(resource.resource)
        added.scope_spans.add().CopyFrom(scope)
        parts.append(part.SerializeToString())
    framed = tmp_path / "collector.binpb"
    framed.write_bytes(_framed(*parts))
    assert [(i.raw_id, i.sample, i.error) for i in read_otlp_traces(framed)] == \
        [(i.raw_id, i.sample, i.error) for i in read_otlp_traces(BINARY)]


@pytest.mark.parametrize(("content", "reason"), [
    (lambda data: data[: len(data) // 2], "is not an OTLP protobuf trace export (ExportTraceServiceRequest)"),
    (lambda data: _framed(data)[:-1], "its length prefixes do not add up"),
    (lambda data: json.dumps({"resourceSpans": []}).encode(), "is not an OTLP protobuf trace export"),
], ids=["truncated", "a frame cut short", "JSON named .pb"])
def test_a_file_that_is_not_otlp_protobuf_is_one_trace_error(tmp_path: Path, content: Any, reason: str) -> None:
    broken = tmp_path / "broken.pb"
    broken.write_bytes(content(BINARY.read_bytes()))
    with pytest.raises(TraceError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        list(read_otlp_traces(broken))


def test_rt4_verify_audits_a_protobuf_export_as_its_json_twin_and_refuses_a_corrupt_one(tmp_path: Path) -> None:
    outs = {path: tmp_path / f"{path.suffix[1:]}.audit.jsonl" for path in (BINARY, JSON_TWIN)}
    for path, out in outs.items():
        done = _rt4("verify", str(path), "--input-format", "otlp", "--judge", f"scripted:{RULES}", "--no-cache",
                    "-o", str(out), "-q")
        assert done.returncode == EXIT_USAGE, done.stderr  # the trace without documents is invalid input
    assert _verdicts(outs[BINARY]) == _verdicts(outs[JSON_TWIN])
    assert [verdict[2] for verdict in _verdicts(outs[BINARY])] == ["entailed", "contradicted", None]

    corrupt = tmp_path / "corrupt.binpb"
    corrupt.write_bytes(BINARY.read_bytes()[:-7])
    refused = _rt4("verify", str(corrupt), "--input-format", "otlp", "--judge", f"scripted:{RULES}", "--no-cache")
    assert refused.returncode == EXIT_USAGE and "Traceback" not in refused.stderr
    assert f"{corrupt} is not an OTLP protobuf trace export" in " ".join(refused.stderr.split())
    # Without the otel extra: the same exit, naming what to install.
    missing = _rt4("verify", str(BINARY), "--input-format", "otlp", "--judge", f"scripted:{RULES}", "--no-cache",
                   blocked="opentelemetry.proto")
    assert missing.returncode == EXIT_USAGE and "Traceback" not in missing.stderr
    assert "pip install 'rt4chart[otel]'" in " ".join(missing.stderr.split())
