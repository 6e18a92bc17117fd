"""OTLP/JSON trace exports as input (rt4chart/records/traces.py): one item per trace, documents with their
ids, the answer, the question and the trace's ids kept; a trace that holds no turn is one error record;
``rt4 verify --input-format otlp`` end to end through the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rt4chart.records.io import read_jsonl
from rt4chart.records.traces import TraceError, TraceMapping, any_value, load_mapping, read_otlp_traces

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "fixtures" / "traces"
RULES = ROOT / "examples" / "answers.rules.json"
EXIT_USAGE = 2


def _spans_by_id(path: Path) -> dict[str, dict[str, Any]]:
    """The raw spans of an export by span id, with their attributes as a dict."""
    export = json.loads(path.read_text(encoding="utf-8"))
    return {
        span["spanId"]: {**span, "attributes": {a["key"]: any_value(a["value"]) for a in span.get("attributes", [])}}
        for resource in export["resourceSpans"] for scope in resource["scopeSpans"] for span in scope["spans"]
    }


def test_a_real_sdk_trace_becomes_a_sample_with_named_documents_and_its_ids() -> None:
    path = TRACES / "real_sdk_openai.json"
    spans = _spans_by_id(path)
    faithful, wrong, no_documents = read_otlp_traces(path)
    assert faithful.sample is not None and wrong.sample is not None
    assert faithful.sample.passage_ids == ["policy-returns", "policy-refunds"]
    assert faithful.sample.context[0].startswith("Laptops bought from our online store")
    assert faithful.sample.question == "How long do I have to return a laptop?"
    assert wrong.sample.answer.startswith("You can return a laptop within 60 days")
    trace = faithful.sample.trace
    assert trace is not None and faithful.sample.id == trace.trace_id
    # The ids point at the spans that hold what the sample says they hold.
    assert trace.answer_span_id is not None and trace.root_span_id is not None
    answer_span = spans[trace.answer_span_id]
    assert answer_span["traceId"] == trace.trace_id
    assert answer_span["attributes"]["openinference.span.kind"] == "LLM"
    assert answer_span["attributes"]["llm.output_messages.0.message.content"] == faithful.sample.answer
    [retriever] = trace.retriever_span_ids
    assert spans[retriever]["attributes"]["openinference.span.kind"] == "RETRIEVER"
    assert "parentSpanId" not in spans[trace.root_span_id] or not spans[trace.root_span_id]["parentSpanId"]
    assert no_documents.sample is None and no_documents.trace is not None
    assert no_documents.error == f"trace {no_documents.trace.trace_id}: no retrieved documents (no RETRIEVER span " \
        "with retrieval.documents.N.document.content, no TOOL span with a result)"
    assert [item.line for item in (faithful, wrong, no_documents)] == [1, 2, 3]


def test_spans_of_one_trace_are_grouped_across_resources_and_each_empty_trace_is_one_error() -> None:
    items = list(read_otlp_traces(TRACES / "openinference_rag.json"))
    assert [item.raw_id for item in items] == [f"5b8efff798038103d269b633813fc60{c}" for c in "cdef"]
    assert [item.sample is not None for item in items] == [True, True, False, False]
    assert items[1].sample is not None and items[1].sample.passage_ids == ["policy-1", "policy-2"]
    assert "no retrieved documents" in (items[2].error or "") and "answer" not in (items[2].error or "")
    assert "no answer (no LLM span with an output)" in (items[3].error or "")
    assert all(item.trace is not None and item.trace.trace_id == item.raw_id for item in items[2:])


def test_genai_attributes_and_events_give_question_and_answer() -> None:
    attributes, events = read_otlp_traces(TRACES / "genai_rag.json")
    assert attributes.sample is not None and events.sample is not None
    assert attributes.sample.question == events.sample.question == "How long do I have to return a laptop?"
    assert attributes.sample.answer.startswith("You can return a laptop within 60 days")
    assert events.sample.answer.startswith("You can return a laptop within 30 days")
    assert attributes.sample.passage_ids == ["kb-1", "kb-2"]
    # Without the GenAI conventions the same spans hold no answer.
    without = list(read_otlp_traces(TRACES / "genai_rag.json", TraceMapping(genai=False)))
    assert all(item.sample is None and "no answer" in (item.error or "") for item in without)


def test_malformed_traces_are_one_error_record_each() -> None:
    duplicate_ids, nothing, orphan = read_otlp_traces(TRACES / "malformed.json")
    assert duplicate_ids.sample is None and "passage ids must be unique" in (duplicate_ids.error or "")
    assert (duplicate_ids.error or "").startswith("trace 11111111111111111111111111111111: ")
    assert nothing.error is not None and "no retrieved documents" in nothing.error and "no answer" in nothing.error
    assert orphan.sample is None and orphan.error == "export 1: span 'orphan' has no traceId or no spanId"
    assert [item.line for item in (duplicate_ids, nothing, orphan)] == [1, 2, 3]


def test_entries_that_are_not_objects_are_errors_and_deep_nesting_is_refused(tmp_path: Path) -> None:
    export = tmp_path / "odd.json"
    export.write_text(json.dumps({"resourceSpans": ["text", {"scopeSpans": [{"spans": "none"}, {"spans": [7]}]}]}),
                      encoding="utf-8")
    assert [item.error for item in read_otlp_traces(export)] == [
        "export 1: resourceSpans 1 is not an object",
        "export 1: spans is not a list",
        "export 1: spans 1 is not an object",
    ]
    deep = tmp_path / "deep.json"
    deep.write_text('{"resourceSpans": ' + "[" * 100_000 + "]" * 100_000 + "}", encoding="utf-8")
    with pytest.raises(TraceError, match="nested too deeply"):
        list(read_otlp_traces(deep))


def _otlp(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}


def _span(span_id: str, attributes: dict[str, str], parent: str | None = None, end: int = 0) -> dict[str, Any]:
    return {"traceId": "ab" * 16, "spanId": span_id, "parentSpanId": parent or "", "name": span_id,
            "startTimeUnixNano": str(end - 1), "endTimeUnixNano": str(end),
            "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()]}


def test_the_answer_is_the_last_llm_output_and_the_question_the_user_s(tmp_path: Path) -> None:
    # A query-rewriting LLM call before retrieval, the answering call after it; no CHAIN root.
    export = tmp_path / "rewrite.json"
    export.write_text(json.dumps(_otlp([
        _span("03", {"openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                     "llm.input_messages.0.message.content": "What battery does the X200 have?",
                     "llm.output_messages.0.message.content": "The X200 has a 56 Wh battery."}, end=30),
        _span("01", {"openinference.span.kind": "LLM", "llm.input_messages.0.message.role": "user",
                     "llm.input_messages.0.message.content": "rewrite: battery x200?",
                     "llm.output_messages.0.message.content": "What battery does the X200 have?"}, end=10),
        _span("02", {"openinference.span.kind": "RETRIEVER",
                     "retrieval.documents.0.document.content": "The X200 has a 56 Wh battery."}, end=20),
    ])), encoding="utf-8")
    [item] = read_otlp_traces(export)
    assert item.sample is not None and item.sample.trace is not None
    assert item.sample.answer == "The X200 has a 56 Wh battery." and item.sample.trace.answer_span_id == "03"
    assert item.sample.question == "What battery does the X200 have?"
    assert item.sample.passage_ids == ["1"]  # a document without an id is named by its position
    assert item.sample.trace.root_span_id is None  # three roots: none is the root


def test_a_mapping_file_reads_a_team_s_own_attribute_names(tmp_path: Path) -> None:
    export = tmp_path / "custom.json"
    export.write_text(json.dumps(_otlp([
        _span("01", {"kind": "search", "hits.0.key": "faq-9", "hits.0.body": "The X200 has a 56 Wh battery."}),
        _span("02", {"kind": "generate", "reply": "The X200 has a 56 Wh battery."}, parent="01"),
    ])), encoding="utf-8")
    assert next(read_otlp_traces(export)).sample is None  # the default conventions find nothing here
    mapping = tmp_path / "mapping.toml"
    mapping.write_text('kind_attribute = "kind"\nretriever_kinds = ["SEARCH"]\nllm_kinds = ["GENERATE"]\n'
                       'documents = "hits"\ndocument_text = "body"\ndocument_id = "key"\n'
                       'answer_attributes = ["reply"]\n', encoding="utf-8")
    [item] = read_otlp_traces(export, load_mapping(mapping, TraceMapping))
    assert item.sample is not None and item.sample.passage_ids == ["faq-9"]
    assert item.sample.answer == "The X200 has a 56 Wh battery." and item.sample.question is None
    assert item.sample.trace is not None and item.sample.trace.answer_span_id == "02"


def test_a_bad_mapping_or_a_file_that_is_no_otlp_export_is_refused(tmp_path: Path) -> None:
    mapping = tmp_path / "mapping.json"
    mapping.write_text('{"retriever_kind": "RETRIEVER"}', encoding="utf-8")
    with pytest.raises(TraceError, match="retriever_kind: Extra inputs are not permitted"):
        load_mapping(mapping, TraceMapping)
    jsonl = ROOT / "examples" / "answers.jsonl"
    with pytest.raises(TraceError, match="is not an OTLP/JSON trace export"):
        list(read_otlp_traces(jsonl))


def _proto_names(value: Any) -> Any:
    """An export as protobuf's JSON mapping may also write it: the proto's field names, unset values as null."""
    if isinstance(value, dict):
        if "value" in value and isinstance(value["value"], dict):  # an attribute: every AnyValue field written
            fields = dict.fromkeys(["string_value", "bool_value", "int_value", "double_value", "array_value",
                                    "kvlist_value", "bytes_value"])
            return {"key": value["key"], "value": {**fields, **_proto_names(value["value"])}}
        return {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): _proto_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_proto_names(item) for item in value]
    return value


def test_proto_field_names_and_null_fields_read_the_same(tmp_path: Path) -> None:
    path = TRACES / "real_sdk_openai.json"
    snake = tmp_path / "snake.json"
    snake.write_text(json.dumps(_proto_names(json.loads(path.read_text(encoding="utf-8")))), encoding="utf-8")
    assert '"trace_id"' in snake.read_text(encoding="utf-8") and '"traceId"' not in snake.read_text(encoding="utf-8")
    assert list(read_otlp_traces(snake)) == list(read_otlp_traces(path))


def test_a_page_phoenix_serves_reads_as_the_export_it_received() -> None:
    # phoenix_otlpv1.json: Phoenix 20.26.1's GET /v1/projects/default/spans/otlpv1 after it received
    # real_sdk_openai.json over OTLP/HTTP (snake_case names, null fields, newest trace first).
    sent = {item.raw_id: item for item in read_otlp_traces(TRACES / "real_sdk_openai.json")}
    served = list(read_otlp_traces(TRACES / "phoenix_otlpv1.json"))
    assert sorted(item.raw_id or "" for item in served) == sorted(sent)
    assert all(item.sample == sent[item.raw_id or ""].sample for item in served)
    assert all(item.error == sent[item.raw_id or ""].error for item in served)
    assert sum(item.sample is not None for item in served) == 2


def test_otlp_json_values_are_decoded() -> None:
    assert any_value({"intValue": "42"}) == 42  # OTLP/JSON writes 64-bit integers as strings
    assert any_value({"stringValue": None, "intValue": "7"}) == 7
    assert any_value({"arrayValue": {"values": [{"stringValue": "a"}, {"boolValue": True}]}}) == ["a", True]
    assert any_value({"kvlistValue": {"values": [{"key": "k", "value": {"doubleValue": 0.5}}]}}) == {"k": 0.5}


def _rt4(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT)


def test_rt4_verify_audits_a_trace_export_like_the_same_turns_as_jsonl(tmp_path: Path) -> None:
    out, cache = tmp_path / "traces.audit.jsonl", str(tmp_path / "cache")
    completed = _rt4("verify", str(TRACES / "real_sdk_openai.json"), "--input-format", "otlp",
                     "--judge", f"scripted:{RULES}", "--cache-dir", cache, "-o", str(out), "-q")
    assert completed.returncode == EXIT_USAGE, completed.stderr  # a trace without documents is invalid input
    assert "Traceback" not in completed.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    items = list(read_otlp_traces(TRACES / "real_sdk_openai.json"))
    assert [r["id"] for r in records] == [item.raw_id for item in items]
    assert [r["trace"]["trace_id"] for r in records] == [item.raw_id for item in items]
    assert [r["trace"]["answer_span_id"] for r in records[:2]] == [
        item.sample.trace.answer_span_id for item in items[:2] if item.sample and item.sample.trace
    ]
    assert [r["label"] for r in records] == ["entailed", "contradicted", None]
    assert records[2]["errors"] == [items[2].error] and records[2]["trace"]["retriever_span_ids"]
    # The same turns as JSONL lines give the same claims and labels.
    jsonl = tmp_path / "turns.jsonl"
    jsonl.write_text("".join(json.dumps({"id": s.id, "context": [{"id": i, "text": t} for i, t in
                                                                 zip(s.passage_ids or [], s.context, strict=True)],
                                         "question": s.question, "answer": s.answer}) + "\n"
                             for s in (item.sample for item in items[:2]) if s is not None), encoding="utf-8")
    assert all(item.sample for item in read_jsonl(jsonl))
    file_out = tmp_path / "turns.audit.jsonl"
    completed = _rt4("verify", str(jsonl), "--judge", f"scripted:{RULES}", "--cache-dir", cache,
                     "-o", str(file_out), "-q")
    assert completed.returncode == 1, completed.stderr
    from_file = [json.loads(line) for line in file_out.read_text(encoding="utf-8").splitlines()]
    assert [[(c["text"], c["label"]) for c in r["claims"]] for r in from_file] == \
        [[(c["text"], c["label"]) for c in r["claims"]] for r in records[:2]]


def test_input_format_flags_are_usage_errors_when_misused(tmp_path: Path) -> None:
    jsonl = ROOT / "examples" / "answers.jsonl"
    mapping = tmp_path / "mapping.toml"
    mapping.write_text("genai = false\n", encoding="utf-8")
    misplaced = _rt4("estimate", str(jsonl), "--trace-mapping", str(mapping))
    assert misplaced.returncode == EXIT_USAGE and "--trace-mapping applies to --input-format otlp" in misplaced.stderr
    not_otlp = _rt4("verify", str(jsonl), "--input-format", "otlp", "--judge", f"scripted:{RULES}", "--no-cache")
    assert not_otlp.returncode == EXIT_USAGE and "Traceback" not in not_otlp.stderr
    assert "is not an OTLP/JSON trace export" in " ".join(not_otlp.stderr.split())
    estimate = _rt4("estimate", str(TRACES / "openinference_rag.json"), "--input-format", "otlp", "--json")
    assert estimate.returncode == 0, estimate.stderr
    plan = json.loads(estimate.stdout)
    assert plan["samples"] == 2, plan  # the two traces that hold a turn


def test_resume_keeps_the_audited_traces(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rt4chart.cli.app import app

    out = tmp_path / "audit.jsonl"
    args = ["verify", str(TRACES / "openinference_rag.json"), "--input-format", "otlp", "--judge", f"scripted:{RULES}",
            "--no-cache", "-o", str(out), "-q"]
    first = CliRunner().invoke(app, args, catch_exceptions=False)
    assert first.exit_code == EXIT_USAGE, first.stderr
    again = CliRunner().invoke(app, [*args, "--resume"], catch_exceptions=False)
    assert again.exit_code == EXIT_USAGE, again.stderr
    manifest = json.loads((tmp_path / "audit.jsonl.manifest.json").read_text(encoding="utf-8"))
    assert manifest["resumed"] == 2, manifest  # both traces that hold a turn, judged by no call again
    assert manifest["usage"]["calls"] == 0, manifest["usage"]
