"""Verdicts written back (rt4chart/runs/write_back.py, ``rt4 verify --write-back``): a Phoenix span annotation
on each audited answer's LLM span, a Langfuse score on each trace; a rerun updates them, never duplicates;
what is sent is scrubbed; a write that fails is recorded and exits 4. Against the stand-ins of
tests/trace_servers.py, through the real CLI."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.test_phoenix_source import _copy_of_trace, _phoenix_spans
from tests.trace_servers import TraceServer, trace_server

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "fixtures" / "traces"
RULES = ROOT / "examples" / "answers.rules.json"
EXIT_USAGE = 2
PHOENIX_KEY = "phx-test-key-7c1e29f0a4"
LANGFUSE_SECRET = "sk-lf-test-51b0c3aa92"


def _rt4(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT, env={**os.environ, **(env or {})})


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _with_answer(spans: list[dict[str, Any]], answer: str) -> list[dict[str, Any]]:
    """``spans`` with every LLM output message replaced by ``answer``."""
    for span in spans:
        for attribute in span["attributes"]:
            if attribute["key"] == "llm.output_messages.0.message.content":
                attribute["value"]["string_value"] = answer
    return spans


def _trace_asking(spans: list[dict[str, Any]], question: str) -> str:
    """The trace whose root (CHAIN) span's input is ``question``: the fixture's traces by what they hold, not
    by their ids (new ones each time make_real_sdk.py remakes it)."""
    return next(span["trace_id"] for span in spans if not span["parent_span_id"] and any(
        a["key"] == "input.value" and a["value"]["string_value"] == question for a in span["attributes"]))


def _annotations(server: TraceServer, span_ids: list[str]) -> list[dict[str, Any]]:
    response = httpx.get(f"{server.url}/v1/projects/default/span_annotations", params={"span_ids": span_ids})
    found: list[dict[str, Any]] = response.json()["data"]
    return found


def test_phoenix_annotations_one_per_answer_updated_on_rerun_and_scrubbed(tmp_path: Path) -> None:
    spans = _phoenix_spans()
    faithful = _trace_asking(spans, "How long do I have to return a laptop?")
    start = max(int(s["start_time_unix_nano"]) for s in spans) + 1
    leaky = _with_answer(_copy_of_trace(spans, faithful, "c" * 32, start), f"Use the key {PHOENIX_KEY} to return it.")
    env = {"PHOENIX_API_KEY": PHOENIX_KEY}
    with trace_server({"default": spans + leaky}) as server:
        source = f"phoenix://127.0.0.1:{server.port}/default"
        out = tmp_path / "audit.jsonl"
        first = _rt4("verify", source, "--write-back", "--judge", f"scripted:{RULES}", "--cache-dir",
                     str(tmp_path / "cache"), "-o", str(out), env=env)
        assert first.returncode == EXIT_USAGE, first.stderr  # one trace holds no documents
        records = _records(out)
        answered = [r for r in records if r["label"] is not None]
        assert len(answered) == 3
        annotations = _annotations(server, [r["trace"]["answer_span_id"] for r in records])
        # One annotation per answer, on its LLM span, with the record's label, score and claims.
        assert sorted(a["span_id"] for a in annotations) == sorted(r["trace"]["answer_span_id"] for r in answered)
        by_span = {a["span_id"]: a for a in annotations}
        for record in answered:
            annotation = by_span[record["trace"]["answer_span_id"]]
            assert annotation["name"] == "rt4chart" and annotation["identifier"] == "rt4chart"
            assert annotation["result"]["label"] == record["label"]
            entailed = sum(c["label"] == "entailed" for c in record["claims"])
            assert annotation["result"]["score"] == round(entailed / len(record["claims"]), 4)
            assert [c["label"] for c in annotation["metadata"]["claims"]] == [c["label"] for c in record["claims"]]
            assert annotation["metadata"]["judge"] == record["judge"]
        wrong = next(r for r in answered if r["label"] == "contradicted")
        contradicted = by_span[wrong["trace"]["answer_span_id"]]
        refuted = next(c for c in wrong["claims"] if c["label"] == "contradicted")
        assert f"contradicted: {refuted['text']} (context: {refuted['evidence'][0]['text']}" in \
            contradicted["result"]["explanation"]
        assert [[e["text"] for e in c["evidence"]] for c in contradicted["metadata"]["claims"]] == \
            [[e["text"] for e in c["evidence"]] for c in wrong["claims"]]
        # Each evidence names the retrieved document it quotes (its id in the trace) and where in it.
        sent = [e for c in contradicted["metadata"]["claims"] for e in c["evidence"]]
        sources = [e["source"] for c in wrong["claims"] for e in c["evidence"]]
        assert sent and [(e["document"], e["document_span"]) for e in sent] == \
            [(s["document"], [s["start"], s["end"]]) for s in sources]
        assert f"{refuted['evidence'][0]['text']} [{refuted['evidence'][0]['source']['document']}]" in \
            contradicted["result"]["explanation"]
        # Scrubbed: the key an answer quoted never leaves; the key went to this server, as its bearer token.
        assert PHOENIX_KEY not in json.dumps(annotations)
        rt4_requests = [r for r in server.requests if r[0] == "POST" or "/spans/otlpv1" in r[1]]  # not the test's
        assert {auth for _, _, auth in rt4_requests} == {f"Bearer {PHOENIX_KEY}"}
        results = _records(tmp_path / "audit.jsonl.write-back.jsonl")
        assert [r["status"] for r in results] == ["skipped" if r["label"] is None else "written" for r in records]
        # A rerun of the same traces (a fresh watermark) updates the annotations: none is added.
        ids = sorted(a["id"] for a in annotations)
        again = _rt4("verify", source, "--write-back", "--judge", f"scripted:{RULES}", "--cache-dir",
                     str(tmp_path / "other"), "-o", str(tmp_path / "again.jsonl"), env=env)
        assert again.returncode == EXIT_USAGE, again.stderr
        assert sorted(a["id"] for a in _annotations(server, list(by_span))) == ids
        assert len(server.annotations) == len(answered)


def test_a_write_back_that_fails_is_recorded_exits_4_and_keeps_the_watermark(tmp_path: Path) -> None:
    spans = _phoenix_spans()
    with trace_server({"default": spans}) as server:
        server.fail_writes = True
        out = tmp_path / "audit.jsonl"
        completed = _rt4("verify", f"phoenix://127.0.0.1:{server.port}/default", "--write-back", "--judge",
                         f"scripted:{RULES}", "--cache-dir", str(tmp_path / "cache"), "-o", str(out), "-q",
                         "--fail-on", "never")
        # Invalid input (exit 2) says more than the failed write: a run of only valid traces exits 4.
        assert completed.returncode == EXIT_USAGE, completed.stderr
        results = _records(tmp_path / "audit.jsonl.write-back.jsonl")
        assert sorted(r["status"] for r in results) == ["failed", "failed", "skipped"]
        assert all("HTTP 500: " in r["error"] for r in results if r["status"] == "failed")
        assert "write-back: 0 written, 1 skipped, 2 failed" in " ".join(completed.stderr.split())
        assert not (tmp_path / "cache" / "watermarks").exists()
        no_documents = _trace_asking(spans, "Do you ship to Mars?")
        valid = [s for s in spans if s["trace_id"] != no_documents]
        server.spans["default"] = valid
        completed = _rt4("verify", f"phoenix://127.0.0.1:{server.port}/default", "--write-back", "--judge",
                         f"scripted:{RULES}", "--cache-dir", str(tmp_path / "cache"), "-o", str(out), "-q",
                         "--fail-on", "never")
        assert completed.returncode == 4, completed.stderr
        assert not (tmp_path / "cache" / "watermarks").exists()


def test_langfuse_scores_one_per_trace_updated_on_rerun(tmp_path: Path) -> None:
    export = TRACES / "langfuse_rag.json"
    with trace_server() as server:
        env = {"LANGFUSE_HOST": server.url, "LANGFUSE_PUBLIC_KEY": "pk-lf-test", "LANGFUSE_SECRET_KEY": LANGFUSE_SECRET}
        args = ["verify", str(export), "--input-format", "langfuse", "--write-back", "--judge", f"scripted:{RULES}",
                "--no-cache", "-q"]
        first = _rt4(*args, "-o", str(tmp_path / "first.jsonl"), env=env)
        assert first.returncode == EXIT_USAGE, first.stderr
        records = [r for r in _records(tmp_path / "first.jsonl") if r["label"] is not None]
        scores = httpx.get(f"{server.url}/api/public/scores", auth=("pk-lf-test", LANGFUSE_SECRET)).json()["data"]
        assert sorted((s["traceId"], s["observationId"], s["value"]) for s in scores) == \
            sorted((r["id"], r["trace"]["answer_span_id"], r["label"]) for r in records)
        assert all(s["name"] == "rt4chart" and s["dataType"] == "CATEGORICAL" for s in scores)
        # The evidence names the retrieved documents by the ids the trace gave them.
        documents = {e["document"] for s in scores for c in s["metadata"]["claims"] for e in c["evidence"]}
        assert documents == {e["source"]["document"] for r in records for c in r["claims"] for e in c["evidence"]}
        assert documents and documents <= {"policy-1", "policy-2", "kb-1", "kb-2"}
        token = base64.b64encode(f"pk-lf-test:{LANGFUSE_SECRET}".encode()).decode()
        assert {auth for method, _, auth in server.requests if method == "POST"} == {f"Basic {token}"}
        again = _rt4(*args, "-o", str(tmp_path / "again.jsonl"), env=env)
        assert again.returncode == EXIT_USAGE, again.stderr
        assert sorted(server.scores) == sorted(s["id"] for s in scores)  # the same ids: updated, not added


def test_write_back_needs_out_a_target_and_its_keys(tmp_path: Path) -> None:
    export = TRACES / "langfuse_rag.json"
    no_out = _rt4("verify", str(export), "--input-format", "langfuse", "--write-back", "--no-cache")
    assert no_out.returncode == EXIT_USAGE and "--write-back needs --out" in no_out.stderr
    no_target = _rt4("verify", str(TRACES / "genai_rag.json"), "--input-format", "otlp", "--write-back", "--no-cache",
                     "-o", str(tmp_path / "a.jsonl"))
    assert no_target.returncode == EXIT_USAGE and "--write-back needs a phoenix://" in no_target.stderr
    env = {name: "" for name in ("LANGFUSE_HOST", "LANGFUSE_BASE_URL", "LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY")}
    no_keys = _rt4("verify", str(export), "--input-format", "langfuse", "--write-back", "--no-cache",
                   "-o", str(tmp_path / "b.jsonl"), env=env)
    assert no_keys.returncode == EXIT_USAGE
    assert "needs LANGFUSE_HOST, LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY" in " ".join(no_keys.stderr.split())
    assert not (tmp_path / "b.jsonl").exists()  # refused before any work
