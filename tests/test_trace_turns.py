"""Several turns per trace (``turns = "each"`` in TraceMapping / LangfuseMapping): a chat session's trace becomes
one audited sample per answer, each with the documents retrieved for that turn and that turn's question; an
agent's tool-calling steps are no turns; sample ids are trace id / answer span id, records numbered in order;
write-back annotates each turn's own LLM span. Fixtures: tests/fixtures/traces/real_sdk_session.json (real
OpenTelemetry SDK + OpenInference OpenAI instrumentation) and langfuse_session.json (hand-made)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rt4chart.records.io import read_jsonl
from rt4chart.records.langfuse import LangfuseMapping, read_langfuse_traces
from rt4chart.records.phoenix import PhoenixSource, read_phoenix
from rt4chart.records.traces import TraceMapping, read_otlp_traces
from tests.test_traces import _proto_names
from tests.test_write_back import _annotations
from tests.trace_servers import trace_server

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "fixtures" / "traces"
SESSION = TRACES / "real_sdk_session.json"
RULES = ROOT / "examples" / "answers.rules.json"
EACH = TraceMapping(turns="each")
QUESTIONS = ["How long do I have to return a laptop?", "Can I return my laptop after two months?",
             "Do you ship to Mars?"]


def _session_spans() -> dict[str, dict[str, Any]]:
    request = json.loads(SESSION.read_text(encoding="utf-8"))
    spans = [s for r in request["resourceSpans"] for scope in r["scopeSpans"] for s in scope["spans"]]
    return {span["spanId"]: span for span in spans}


def _kind(span: dict[str, Any]) -> str | None:
    return next((a["value"]["stringValue"] for a in span["attributes"] if a["key"] == "openinference.span.kind"), None)


def test_a_real_sdk_session_trace_gives_one_sample_per_turn_with_that_turn_s_documents() -> None:
    spans = _session_spans()
    [whole] = read_otlp_traces(SESSION)  # the default: one sample per trace, every document of the session
    assert whole.sample is None and "ids must be unique" in (whole.error or "")
    turns = list(read_otlp_traces(SESSION, EACH))
    samples = [item.sample for item in turns]
    assert [item.line for item in turns] == [1, 2, 3]
    assert all(samples) and [s.question for s in samples if s] == QUESTIONS  # each turn's own, not the root's
    retrievers = [s for s in spans.values() if _kind(s) == "RETRIEVER"]
    tools = [s for s in spans.values() if _kind(s) == "TOOL"]
    llms = sorted((s for s in spans.values() if _kind(s) == "LLM"), key=lambda s: int(s["endTimeUnixNano"]))
    assert len(retrievers) == 2 and len(tools) == 1 and len(llms) == 4
    asked_tools = [s for s in llms
                   if any(a["key"].startswith("llm.output_messages.0.message.tool_calls.") for a in s["attributes"])]
    assert len(asked_tools) == 1  # the agent's step: its span is no turn's answer
    answering = [s for s in llms if s not in asked_tools]
    trace_id = llms[0]["traceId"]
    for sample, llm, retriever in zip(samples, answering, [*retrievers, None], strict=True):
        assert sample is not None and sample.trace is not None
        assert sample.id == f"{trace_id}/{llm['spanId']}" and sample.trace.answer_span_id == llm["spanId"]
        # The turn's retriever is the one between the previous answer and this one; its chain is the question's.
        assert sample.trace.retriever_span_ids == ([retriever["spanId"]] if retriever else [])
        assert spans[sample.trace.question_span_id or ""]["name"] == "turn"
    last = samples[2]
    assert last is not None and last.trace is not None and last.trace.tool_span_ids == [tools[0]["spanId"]]
    assert last.passage_ids == ["call_shipping"]
    assert samples[0] is not None and samples[0].passage_ids == ["policy-returns", "policy-refunds"]


def _span(span_id: str, attributes: dict[str, str], start: int, end: int, parent: str | None = None) -> dict[str, Any]:
    return {"traceId": "cd" * 16, "spanId": span_id, "parentSpanId": parent or "", "name": span_id,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
            "attributes": [{"key": k, "value": {"stringValue": v}} for k, v in attributes.items()]}


def _retriever(span_id: str, text: str, start: int, parent: str) -> dict[str, Any]:
    return _span(span_id, {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.id": span_id,
                           "retrieval.documents.0.document.content": text}, start, start + 5, parent)


def test_nested_llm_spans_are_one_turn_a_text_with_tool_calls_is_no_turn_and_a_turn_without_documents_is_its_error(
        tmp_path: Path) -> None:
    llm = "openinference.span.kind"
    answer = "llm.output_messages.0.message.content"
    spans = [
        _span("root", {llm: "CHAIN", "input.value": "first question"}, 0, 1000),
        # Turn 1: LangChain's LLM span around the OpenAI client's, both with the answer: one turn, the outer span.
        _retriever("r1", "The shop opens at nine.", 10, "root"),
        _span("outer", {llm: "LLM", answer: "The shop opens at nine.", "llm.input_messages.0.message.role": "user",
                        "llm.input_messages.0.message.content": "When do you open?"}, 20, 60, "root"),
        _span("inner", {llm: "LLM", answer: "The shop opens at nine."}, 25, 55, "outer"),
        # Turn 2: a GenAI step that says something and asks for a tool (no turn), then the answer.
        _retriever("r2", "The shop closes at six.", 100, "root"),
        _span("step", {"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps([{"role": "assistant",
              "parts": [{"type": "text", "content": "Let me look."},
                        {"type": "tool_call", "id": "c1", "name": "hours", "arguments": {}}]}])}, 110, 120, "root"),
        _span("answer2", {"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(
              [{"role": "assistant", "parts": [{"type": "text", "content": "It closes at six."}]}]),
              "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [
                  {"type": "text", "content": "And when do you close?"}]}])}, 130, 150, "root"),
        # Turn 3: nothing retrieved since turn 2's answer: that turn alone is an error record.
        _span("answer3", {llm: "LLM", answer: "We are closed on Sundays."}, 200, 220, "root"),
    ]
    export = tmp_path / "session.json"
    export.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}), encoding="utf-8")
    first, second, third = read_otlp_traces(export, EACH)
    assert first.sample is not None and first.sample.trace is not None
    assert first.raw_id == f"{'cd' * 16}/outer" and first.sample.trace.answer_span_id == "outer"
    # The root holds every turn: its input is no turn's question; each LLM span's user message is.
    assert first.sample.passage_ids == ["r1"] and first.sample.question == "When do you open?"
    assert second.sample is not None and second.sample.trace is not None
    assert second.sample.answer == "It closes at six." and second.sample.passage_ids == ["r2"]
    assert second.sample.question == "And when do you close?"
    assert third.sample is None and third.raw_id == f"{'cd' * 16}/answer3"
    assert third.error == f"trace {'cd' * 16}, answer span answer3: no retrieved documents (no RETRIEVER span with " \
        "retrieval.documents.N.document.content, no TOOL span with a result)"
    # The default reads the same trace as before: its last answer with every document.
    [whole] = read_otlp_traces(export)
    assert whole.sample is not None and whole.sample.passage_ids == ["r1", "r2"]
    assert whole.sample.answer == "We are closed on Sundays."


def test_a_langfuse_session_trace_gives_one_sample_per_turn() -> None:
    path = TRACES / "langfuse_session.json"
    [whole] = read_langfuse_traces(path)
    assert whole.sample is None and "ids must be unique" in (whole.error or "")
    turns = list(read_langfuse_traces(path, LangfuseMapping(turns="each")))
    samples = [item.sample for item in turns]
    assert [item.line for item in turns] == [1, 2, 3] and all(samples)
    assert [s.question for s in samples if s] == QUESTIONS
    assert [s.id for s in samples if s] == [f"lf-session-1/obs-generation-{n}" for n in (1, 2, 3)]
    assert [s.trace.retriever_span_ids for s in samples if s and s.trace] == \
        [["obs-retrieve-1"], ["obs-retrieve-2"], []]
    assert [s.trace.tool_span_ids for s in samples if s and s.trace] == [[], [], ["obs-tool-3"]]
    # The step that said "Let me check" and asked for a tool is no turn.
    assert all(s.answer != "Let me check where we ship." for s in samples if s)


def _rt4(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT)


def test_rt4_verify_audits_each_turn_like_the_same_turns_as_jsonl(tmp_path: Path) -> None:
    mapping = tmp_path / "turns.toml"
    mapping.write_text('turns = "each"\n', encoding="utf-8")
    # A Collector's file: the session's export request, then the three single-turn traces.
    export = tmp_path / "traces.jsonl"
    export.write_text("".join(json.dumps(json.loads(p.read_text(encoding="utf-8"))) + "\n"
                              for p in (SESSION, TRACES / "real_sdk_openai.json")), encoding="utf-8")
    out, cache = tmp_path / "audit.jsonl", str(tmp_path / "cache")
    completed = _rt4("verify", str(export), "--input-format", "otlp", "--trace-mapping", str(mapping),
                     "--judge", f"scripted:{RULES}", "--cache-dir", cache, "-o", str(out), "-q")
    assert completed.returncode == 2, completed.stderr  # the Mars trace of real_sdk_openai retrieved nothing
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    items = list(read_otlp_traces(export, EACH))
    assert [r["line"] for r in records] == list(range(1, 7)) and [r["id"] for r in records] == [i.raw_id for i in items]
    assert [r["label"] for r in records] == ["entailed", "contradicted", "baseless", "entailed", "contradicted", None]
    jsonl = tmp_path / "turns.jsonl"
    jsonl.write_text("".join(json.dumps({"id": s.id, "documents": [d.model_dump(mode="json") for d in s.documents]}
                                        | {"question": s.question, "answer": s.answer}) + "\n"
                             if s.documents else
                             json.dumps({"id": s.id, "context": [{"id": i, "text": t} for i, t in
                                                                 zip(s.passage_ids or [], s.context, strict=True)],
                                         "question": s.question, "answer": s.answer}) + "\n"
                             for s in (item.sample for item in items[:5]) if s is not None), encoding="utf-8")
    assert all(item.sample for item in read_jsonl(jsonl))
    file_out = tmp_path / "turns.audit.jsonl"
    completed = _rt4("verify", str(jsonl), "--judge", f"scripted:{RULES}", "--cache-dir", cache,
                     "-o", str(file_out), "-q")
    assert completed.returncode == 1, completed.stderr
    from_file = [json.loads(line) for line in file_out.read_text(encoding="utf-8").splitlines()]
    assert [[(c["text"], c["label"]) for c in r["claims"]] for r in from_file] == \
        [[(c["text"], c["label"]) for c in r["claims"]] for r in records[:5]]


def test_a_phoenix_session_is_read_per_turn_and_each_turn_annotated_on_its_own_llm_span(tmp_path: Path) -> None:
    served = [_proto_names(span) for span in _session_spans().values()]
    for span in served:
        span["start_time_unix_nano"] = int(span["start_time_unix_nano"])
    with trace_server({"default": served}) as server:
        read = read_phoenix(PhoenixSource(server.url, "default"), None, None, EACH)
        assert [item.raw_id for item in read.items] == [item.raw_id for item in read_otlp_traces(SESSION, EACH)]
        mapping = tmp_path / "turns.json"
        mapping.write_text(json.dumps({"turns": "each"}), encoding="utf-8")
        out = tmp_path / "audit.jsonl"
        completed = _rt4("verify", f"phoenix://127.0.0.1:{server.port}/default", "--trace-mapping", str(mapping),
                         "--write-back", "--judge", f"scripted:{RULES}", "--cache-dir", str(tmp_path / "cache"),
                         "-o", str(out), "-q")
        assert completed.returncode == 1, completed.stderr
        records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        span_ids = [r["trace"]["answer_span_id"] for r in records]
        assert len(set(span_ids)) == len(records) == 3
        annotations = {a["span_id"]: a["result"]["label"] for a in _annotations(server, span_ids)}
        assert annotations == {r["trace"]["answer_span_id"]: r["label"] for r in records}
