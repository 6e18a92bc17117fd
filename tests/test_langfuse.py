"""Langfuse trace exports as input (rt4chart/records/langfuse.py): one item per trace, the retriever
observations' documents with their ids, the last generation's output, the trace's input as the question;
a trace without a turn is one error record; ``rt4 verify --input-format langfuse`` through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rt4chart.records.langfuse import LangfuseMapping, message_text, read_langfuse_traces
from rt4chart.records.traces import TraceError, load_mapping

ROOT = Path(__file__).resolve().parent.parent
EXPORT = ROOT / "tests" / "fixtures" / "traces" / "langfuse_rag.json"
RULES = ROOT / "examples" / "answers.rules.json"
EXIT_USAGE = 2


def _traces() -> list[dict[str, Any]]:
    traces: list[dict[str, Any]] = json.loads(EXPORT.read_text(encoding="utf-8"))["data"]
    return traces


def test_each_trace_becomes_one_item_with_documents_answer_question_and_ids() -> None:
    raw = _traces()
    langchain, plain, no_documents = read_langfuse_traces(EXPORT)
    assert langchain.sample is not None and plain.sample is not None
    # A LangChain retriever's Documents (ids under metadata) and a SPAN's {"documents": [...]}.
    assert langchain.sample.passage_ids == ["policy-1", "policy-2"]
    assert plain.sample.passage_ids == ["kb-1", "kb-2"]
    retrieved = next(o for o in raw[0]["observations"] if o["type"] == "RETRIEVER")["output"]
    assert langchain.sample.context == [document["page_content"] for document in retrieved]
    generation = next(o for o in raw[1]["observations"] if o["type"] == "GENERATION")
    assert plain.sample.answer == generation["output"]["choices"][0]["message"]["content"]
    # The question: the trace's input object; without one, the generation's last user message.
    assert langchain.sample.question == raw[0]["input"]["question"]
    assert plain.sample.question == generation["input"]["messages"][-1]["content"]
    trace = plain.sample.trace
    assert trace is not None and plain.sample.id == trace.trace_id == raw[1]["id"]
    assert trace.answer_span_id == generation["id"] and trace.question_span_id == generation["id"]
    assert trace.retriever_span_ids == [o["id"] for o in raw[1]["observations"] if o["name"] == "retrieve-documents"]
    assert langchain.sample.trace is not None and langchain.sample.trace.question_span_id is None
    assert no_documents.sample is None and no_documents.trace is not None
    assert no_documents.error == f"trace {raw[2]['id']}: no retrieved documents (no RETRIEVER observation or " \
        "retriever SPAN with documents in its output, no TOOL observation with an output)"
    assert [item.line for item in (langchain, plain, no_documents)] == [1, 2, 3]


def test_a_list_or_one_trace_per_line_reads_the_same_and_ids_only_observations_are_an_error(tmp_path: Path) -> None:
    as_list, as_lines = tmp_path / "list.json", tmp_path / "lines.jsonl"
    as_list.write_text(json.dumps(_traces()), encoding="utf-8")
    as_lines.write_text("".join(json.dumps(t) + "\n" for t in _traces()), encoding="utf-8")
    expected = [(i.raw_id, i.sample, i.error) for i in read_langfuse_traces(EXPORT)]
    assert [(i.raw_id, i.sample, i.error) for i in read_langfuse_traces(as_list)] == expected
    assert [(i.raw_id, i.sample, i.error) for i in read_langfuse_traces(as_lines)] == expected
    listed = tmp_path / "listed.json"  # GET /api/public/traces lists observation ids only
    listed.write_text(json.dumps([{**_traces()[0], "observations": ["lf-obs-1-gen"]}]), encoding="utf-8")
    [item] = read_langfuse_traces(listed)
    assert item.sample is None and "its observations are ids, not objects" in (item.error or "")


def test_a_mapping_file_reads_a_team_s_own_observation_names(tmp_path: Path) -> None:
    traces = _traces()
    search = {**traces[1], "observations": [
        {**o, "name": "kb-search"} if o["type"] == "SPAN" else o for o in traces[1]["observations"]]}
    export = tmp_path / "search.json"
    export.write_text(json.dumps([search]), encoding="utf-8")
    [default] = read_langfuse_traces(export)
    assert default.sample is None and "no retrieved documents" in (default.error or "")
    mapping = tmp_path / "mapping.toml"
    mapping.write_text('retriever_name_contains = ["search"]\n', encoding="utf-8")
    [mapped] = read_langfuse_traces(export, load_mapping(mapping, LangfuseMapping))
    assert mapped.sample is not None and mapped.sample.passage_ids == ["kb-1", "kb-2"]
    mapping.write_text('retriever_kinds = ["SPAN"]\n', encoding="utf-8")  # an OTLP mapping's field
    with pytest.raises(TraceError, match="retriever_kinds: Extra inputs are not permitted"):
        load_mapping(mapping, LangfuseMapping)


def test_message_payloads_give_their_text() -> None:
    assert message_text("plain", "assistant") == "plain"
    assert message_text({"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]},
                        "assistant") == "ab"
    assert message_text([{"role": "user", "content": "q1"}, {"role": "assistant", "content": "x"},
                         {"role": "user", "content": "q2"}], "user") == "q2"
    assert message_text({"role": "system", "content": "s"}, "user") is None
    assert message_text(7, "user") is None


def _rt4(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT)


def test_rt4_verify_audits_a_langfuse_export_like_the_same_turns_as_jsonl(tmp_path: Path) -> None:
    out, cache = tmp_path / "langfuse.audit.jsonl", str(tmp_path / "cache")
    completed = _rt4("verify", str(EXPORT), "--input-format", "langfuse", "--judge", f"scripted:{RULES}",
                     "--cache-dir", cache, "-o", str(out), "-q")
    assert completed.returncode == EXIT_USAGE, completed.stderr  # a trace without documents is invalid input
    assert "Traceback" not in completed.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [t["id"] for t in _traces()]
    assert [r["label"] for r in records] == ["entailed", "contradicted", None]
    assert records[1]["trace"]["answer_span_id"] == "lf-obs-2-gen"
    jsonl = tmp_path / "turns.jsonl"
    samples = [item.sample for item in read_langfuse_traces(EXPORT) if item.sample is not None]
    jsonl.write_text("".join(json.dumps({"id": s.id, "question": s.question, "answer": s.answer, "context": [
        {"id": i, "text": t} for i, t in zip(s.passage_ids or [], s.context, strict=True)]}) + "\n" for s in samples),
        encoding="utf-8")
    file_out = tmp_path / "turns.audit.jsonl"
    completed = _rt4("verify", str(jsonl), "--judge", f"scripted:{RULES}", "--cache-dir", cache, "-o", str(file_out),
                     "-q")
    assert completed.returncode == 1, completed.stderr
    from_file = [json.loads(line) for line in file_out.read_text(encoding="utf-8").splitlines()]
    assert [[(c["text"], c["label"]) for c in r["claims"]] for r in from_file] == \
        [[(c["text"], c["label"]) for c in r["claims"]] for r in records[:2]]
    not_langfuse = _rt4("verify", str(ROOT / "tests" / "fixtures" / "traces" / "genai_rag.json"), "--input-format",
                        "langfuse", "--judge", f"scripted:{RULES}", "--no-cache")
    assert not_langfuse.returncode == EXIT_USAGE and "Traceback" not in not_langfuse.stderr
    assert "is not a Langfuse trace export" in " ".join(not_langfuse.stderr.split())
