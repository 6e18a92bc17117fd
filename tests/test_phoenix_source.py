"""A live Phoenix project as input (rt4chart/records/phoenix.py, runs/production.py): ``rt4 verify
phoenix://HOST:PORT/PROJECT`` reads its spans page by page over the REST API (a stand-in speaking Phoenix's
endpoints, tests/trace_servers.py, serving spans as real Phoenix served them), audits each trace like the
same export read from a file, and keeps a watermark so the next run audits only new traces."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rt4chart.records import phoenix, server_reads
from rt4chart.records.traces import TraceError
from tests.trace_servers import TraceServer, trace_server

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "tests" / "fixtures" / "traces"
RULES = ROOT / "examples" / "answers.rules.json"
EXIT_USAGE = 2


def _phoenix_spans() -> list[dict[str, Any]]:
    spans: list[dict[str, Any]] = json.loads((TRACES / "phoenix_otlpv1.json").read_text(encoding="utf-8"))["data"]
    return spans


def _copy_of_trace(spans: list[dict[str, Any]], trace_id: str, new_id: str, start_ns: int) -> list[dict[str, Any]]:
    """The spans of ``trace_id`` as a new trace ``new_id`` whose root starts at ``start_ns`` (new span ids)."""
    trace = [copy.deepcopy(s) for s in spans if s["trace_id"] == trace_id]
    shift = start_ns - min(int(s["start_time_unix_nano"]) for s in trace)
    renamed = {s["span_id"]: f"{new_id[:8]}{s['span_id'][8:]}" for s in trace}
    for span in trace:
        span["trace_id"], span["span_id"] = new_id, renamed[span["span_id"]]
        span["parent_span_id"] = renamed.get(span["parent_span_id"] or "")
        span["start_time_unix_nano"] = int(span["start_time_unix_nano"]) + shift
        span["end_time_unix_nano"] = int(span["end_time_unix_nano"]) + shift
    return trace


def _rt4(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT)


def _audit(server: TraceServer, out: Path, cache: Path, *flags: str) -> tuple[int, list[dict[str, Any]], str]:
    completed = _rt4("verify", f"phoenix://127.0.0.1:{server.port}/default", "--judge", f"scripted:{RULES}",
                     "--cache-dir", str(cache), "-o", str(out), *flags)
    assert "Traceback" not in completed.stderr, completed.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] if out.exists() else []
    return completed.returncode, records, completed.stderr


def test_a_phoenix_project_is_audited_like_its_export_and_the_watermark_reads_only_new_traces(tmp_path: Path) -> None:
    spans = _phoenix_spans()
    with trace_server({"default": spans}) as server:
        cache = tmp_path / "cache"
        code, first, _ = _audit(server, tmp_path / "first.jsonl", cache)
        assert code == EXIT_USAGE  # one trace holds no documents: invalid input, its record says so
        pages = [r for r in server.requests if "/spans/otlpv1" in r[1]]
        assert len(pages) == -(-len(spans) // server.page_cap)  # every page read, by its cursor
        # The same spans read from the export file give the same verdicts, trace by trace.
        exported = tmp_path / "export.json"
        exported.write_text(json.dumps({"data": spans}), encoding="utf-8")
        file_out = tmp_path / "file.jsonl"
        _rt4("verify", str(exported), "--input-format", "otlp", "--judge", f"scripted:{RULES}", "--cache-dir",
             str(cache), "-o", str(file_out), "-q")
        from_file = [json.loads(line) for line in file_out.read_text(encoding="utf-8").splitlines()]
        assert {r["id"]: (r["label"], [c["label"] for c in r["claims"]]) for r in first} == \
            {r["id"]: (r["label"], [c["label"] for c in r["claims"]]) for r in from_file}
        assert sorted(r["label"] or "" for r in first) == ["", "contradicted", "entailed"]
        # In root start order.
        roots = {s["trace_id"]: int(s["start_time_unix_nano"]) for s in spans if not s["parent_span_id"]}
        assert [r["id"] for r in first] == sorted(roots, key=roots.__getitem__)
        assert len(list((cache / "watermarks").iterdir())) == 1

        # A new trace arrives: the next run audits it alone; the one after, nothing.
        faithful = next(r["id"] for r in first if r["label"] == "entailed")
        new_id = "a" * 32
        server.spans["default"] += _copy_of_trace(spans, faithful, new_id, max(roots.values()) + 1)
        code, second, stderr = _audit(server, tmp_path / "second.jsonl", cache)
        assert code == 0, stderr
        assert [r["id"] for r in second] == [new_id] and second[0]["label"] == "entailed"
        assert "1 new traces (1 begun before the window or audited before)" in " ".join(stderr.split())
        code, third, stderr = _audit(server, tmp_path / "third.jsonl", cache)
        assert code == 0, stderr
        assert third == []
        # rt4 estimate reads what the next audit would read: nothing new here, all of it under a fresh watermark.
        plans = [_rt4("estimate", f"phoenix://127.0.0.1:{server.port}/default", "--cache-dir", str(where), "--json")
                 for where in (cache, tmp_path / "fresh")]
        assert [json.loads(plan.stdout)["samples"] for plan in plans] == [0, 3], [plan.stderr for plan in plans]


def test_since_bounds_the_window_and_a_stopped_run_leaves_the_watermark(tmp_path: Path) -> None:
    spans = _phoenix_spans()
    # The fixture's traces moved two hours back (however recently it was made), one copy a minute old.
    old = [span for trace_id in dict.fromkeys(s["trace_id"] for s in spans)
           for span in _copy_of_trace(spans, trace_id, trace_id, time.time_ns() - 2 * 3600 * 10**9)]
    recent = _copy_of_trace(spans, spans[-1]["trace_id"], "b" * 32, time.time_ns() - 60 * 10**9)
    with trace_server({"default": old + recent}) as server:
        code, records, stderr = _audit(server, tmp_path / "recent.jsonl", tmp_path / "cache", "--since", "1h")
        assert [r["id"] for r in records] == ["b" * 32], stderr
        assert code == (0 if records[0]["label"] == "entailed" else 1), stderr
        # A judge that cannot be reached stops the run: the watermark stays, the traces are read again.
        dead = _rt4("verify", f"phoenix://127.0.0.1:{server.port}/default", "--judge", "openai/stand-in",
                    "--api-base", "http://127.0.0.1:9/v1", "--cache-dir", str(tmp_path / "other"), "--since", "1h",
                    "-o", str(tmp_path / "dead.jsonl"))
        assert dead.returncode == 4, dead.stderr
        assert "the watermark stays" in dead.stderr
        assert not (tmp_path / "other" / "watermarks").exists()


def test_bad_sources_and_windows_are_usage_errors(tmp_path: Path) -> None:
    with trace_server({"default": _phoenix_spans()}) as server:
        unknown = _rt4("verify", f"phoenix://127.0.0.1:{server.port}/nope", "--judge", f"scripted:{RULES}",
                       "--no-cache")
        assert unknown.returncode == EXIT_USAGE and "answered 404 for project 'nope'" in unknown.stderr
        window = _rt4("verify", f"phoenix://127.0.0.1:{server.port}/default", "--since", "yesterday",
                      "--judge", f"scripted:{RULES}", "--no-cache")
        assert window.returncode == EXIT_USAGE and "'yesterday' is not a duration" in window.stderr
    closed = _rt4("verify", f"phoenix://127.0.0.1:{server.port}/default", "--judge", f"scripted:{RULES}", "--no-cache")
    assert closed.returncode == EXIT_USAGE and "cannot be read: ConnectError" in closed.stderr
    since_file = _rt4("verify", str(ROOT / "examples" / "answers.jsonl"), "--since", "1h", "--no-cache")
    assert since_file.returncode == EXIT_USAGE and "--since applies to a phoenix://" in since_file.stderr
    for result in (unknown, window, closed, since_file):
        assert "Traceback" not in result.stderr


def test_a_page_over_the_cap_is_refused_and_the_window_cut_at_the_nanosecond(monkeypatch: pytest.MonkeyPatch) -> None:
    spans = _phoenix_spans()
    with trace_server({"default": spans}) as server:
        source = phoenix.PhoenixSource(server.url, "default")
        monkeypatch.setattr(server_reads, "MAX_PAGE_BYTES", 1000)
        with pytest.raises(TraceError, match="an answer for project 'default' over 1,000 bytes"):
            phoenix.fetch_spans(source, None)
        monkeypatch.undo()
        roots = sorted(int(s["start_time_unix_nano"]) for s in spans if not s["parent_span_id"])
        # From the second root's start on, to the nanosecond: two traces; one nanosecond later: one.
        at = phoenix.read_phoenix(source, None, server_reads.Watermark(source=source.name, root_start_ns=roots[1],
                                                                       trace_ids=[]))
        after = phoenix.read_phoenix(source, None, server_reads.Watermark(
            source=source.name, root_start_ns=roots[1] + 1, trace_ids=[]))
        assert (len(at.items), len(after.items)) == (2, 1)
        assert after.watermark is not None and after.watermark.root_start_ns == roots[2]
