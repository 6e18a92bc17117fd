"""Traces of agents (rt4chart/records/traces.py): tool spans, OpenInference ``TOOL`` (``tool.name``,
``tool_call.id``, ``output.value``) and the GenAI conventions' ``execute_tool`` (``gen_ai.tool.name``,
``gen_ai.tool.call.id``, ``gen_ai.tool.call.result``), read as a conversation's tool results, so an
agent's trace audits like the conversation of tests/test_conversations.py: evidence names the tool call
and the JSON path or table cell. The OTLP/JSON exports are hand-made here in the layout the SDKs write
(the span and attribute names of the two conventions), not recorded from a real agent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_conversations import RULES, SALES_ROWS, WEATHER
from test_traces import _otlp, _span

from rt4chart.records.langfuse import read_langfuse_traces
from rt4chart.records.traces import read_otlp_traces

ANSWER = "It will rain in Oslo tomorrow. The South region earned 80. The office is next to the harbour."


def agent_trace(*, with_retriever: bool) -> dict[str, Any]:
    """An agent's turn: a root AGENT span with the question, an OpenInference TOOL span (weather JSON), a
    GenAI execute_tool span (SQL rows), optionally a retriever, and the answering LLM call last."""
    spans = [
        _span("01", {"openinference.span.kind": "AGENT", "input.value": "Will it rain in Oslo, how did sales go?"},
              end=90),
        _span("02", {"openinference.span.kind": "TOOL", "tool.name": "get_weather", "tool_call.id": "call_weather",
                     "input.value": '{"city": "Oslo"}', "output.value": json.dumps(WEATHER),
                     "output.mime_type": "application/json"}, parent="01", end=20),
        _span("03", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "run_sql",
                     "gen_ai.tool.call.id": "call_sql", "gen_ai.tool.call.result": json.dumps(SALES_ROWS)},
              parent="01", end=30),
        _span("05", {"openinference.span.kind": "TOOL", "tool.name": "notify"}, parent="01", end=35),  # no result
        _span("06", {"openinference.span.kind": "LLM", "llm.output_messages.0.message.content": ANSWER},
              parent="01", end=80),
    ]
    if with_retriever:
        spans.append(_span("04", {"openinference.span.kind": "RETRIEVER", "retrieval.documents.0.document.id": "kb-1",
                                  "retrieval.documents.0.document.content": "The Oslo office is next to the harbour."},
                           parent="01", end=40))
    return _otlp(spans)


def test_tool_spans_are_the_documents_of_an_agent_s_trace(tmp_path: Path) -> None:
    export = tmp_path / "agent.json"
    export.write_text(json.dumps(agent_trace(with_retriever=True)), encoding="utf-8")
    [item] = read_otlp_traces(export)
    assert item.sample is not None and item.sample.trace is not None, item.error
    assert item.sample.passage_ids == ["call_weather", "call_sql", "kb-1"]
    assert [(d.title, d.data is not None, d.table is not None) for d in item.sample.documents or []] == [
        ("get_weather", True, False), ("run_sql", False, True), (None, False, False)]
    assert item.sample.trace.tool_span_ids == ["02", "03"]
    assert item.sample.question == "Will it rain in Oslo, how did sales go?"


def test_rt4_verify_traces_an_agent_s_claims_to_its_tool_calls(tmp_path: Path) -> None:
    exports = tmp_path / "agents.json"
    without_retriever = agent_trace(with_retriever=False)
    for span in without_retriever["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["traceId"] = "cd" * 16
    exports.write_text(json.dumps(agent_trace(with_retriever=True)) + "\n" + json.dumps(without_retriever) + "\n",
                       encoding="utf-8")
    rules, out = tmp_path / "rules.json", tmp_path / "out.jsonl"
    rules.write_text(json.dumps(RULES), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "rt4chart", "verify", str(exports), "--input-format", "otlp",
                           "--judge", f"scripted:{rules}", "--decomposer", "rules", "--no-cache", "--out", str(out),
                           "-q"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert "Traceback" not in done.stderr
    assert done.returncode == 1, done.stderr  # the second trace has no source for the harbour claim
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    found = [[(c["text"], c["label"], [(e["source"]["document"], [u["path"] for u in e["source"].get("units", [])])
                                       for e in c["evidence"]]) for c in r["claims"]] for r in records]
    weather = ("It will rain in Oslo tomorrow.", "entailed", [("call_weather", ["$.tomorrow.summary"])])
    sales = ("The South region earned 80.", "entailed", [("call_sql", ["$[1].region", "$[1].revenue"])])
    assert found == [
        [weather, sales, ("The office is next to the harbour.", "entailed", [("kb-1", [])])],
        [weather, sales, ("The office is next to the harbour.", "baseless", [])],
    ]
    assert records[0]["trace"]["tool_span_ids"] == ["02", "03"]


def test_a_langfuse_agent_trace_s_tool_observations_are_its_documents(tmp_path: Path) -> None:
    # Langfuse's observation types (GET /api/public/traces/{traceId}): TOOL observations with their output.
    trace = {"id": "lf-agent", "input": "Will it rain in Oslo, how did sales go?", "observations": [
        {"id": "obs-weather", "type": "TOOL", "name": "get_weather", "startTime": "2026-01-01T00:00:01Z",
         "metadata": {"tool_call_id": "call_weather"}, "input": {"city": "Oslo"}, "output": WEATHER},
        {"id": "obs-sql", "type": "TOOL", "name": "run_sql", "startTime": "2026-01-01T00:00:02Z",
         "output": json.dumps(SALES_ROWS)},
        {"id": "obs-empty", "type": "TOOL", "name": "notify", "startTime": "2026-01-01T00:00:03Z", "output": None},
        {"id": "gen-1", "type": "GENERATION", "startTime": "2026-01-01T00:00:04Z", "endTime": "2026-01-01T00:00:05Z",
         "output": {"role": "assistant", "content": ANSWER}},
    ]}
    export = tmp_path / "langfuse.json"
    export.write_text(json.dumps(trace), encoding="utf-8")
    [item] = read_langfuse_traces(export)
    assert item.sample is not None and item.sample.trace is not None, item.error
    assert item.sample.passage_ids == ["call_weather", "obs-sql"]  # no call id in its metadata: the observation's
    assert [(d.title, d.data is not None, d.table is not None) for d in item.sample.documents or []] == [
        ("get_weather", True, False), ("run_sql", False, True)]
    assert item.sample.trace.tool_span_ids == ["obs-weather", "obs-sql"]
    assert item.sample.answer == ANSWER
