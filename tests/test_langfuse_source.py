"""A live Langfuse project as input (rt4chart/records/langfuse_server.py, runs/production.py): ``rt4 verify
langfuse://HOST:PORT/PROJECT`` lists its traces page by page over the public API (a stand-in speaking
Langfuse's endpoints with basic auth, tests/trace_servers.py), reads each with its observations, audits it
like the same export read from a file, writes the verdicts back as scores on that server, and keeps a
watermark so the next run audits only new traces."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rt4chart.records import langfuse_server
from rt4chart.records.langfuse_server import langfuse_source, read_langfuse
from rt4chart.records.live_sources import live_source
from rt4chart.records.server_reads import Watermark, unix_ns
from rt4chart.records.traces import TraceError
from tests.trace_servers import TraceServer, trace_server

ROOT = Path(__file__).resolve().parent.parent
EXPORT = ROOT / "tests" / "fixtures" / "traces" / "langfuse_rag.json"
RULES = ROOT / "examples" / "answers.rules.json"
EXIT_USAGE = 2
KEYS = ("pk-lf-stand-in-public", "sk-lf-stand-in-secret-7f3a9c")


def _traces() -> list[dict[str, Any]]:
    traces: list[dict[str, Any]] = json.loads(EXPORT.read_text(encoding="utf-8"))["data"]
    return traces


def _copy_of_trace(trace: dict[str, Any], new_id: str, timestamp: datetime) -> dict[str, Any]:
    """``trace`` as a new trace ``new_id`` at ``timestamp`` (its observations renamed with it)."""
    copied = copy.deepcopy(trace)
    renamed = {o["id"]: f"{new_id}-{o['id']}" for o in copied["observations"]}
    copied["id"], copied["timestamp"] = new_id, timestamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    for observation in copied["observations"]:
        observation["id"], observation["traceId"] = renamed[observation["id"]], new_id
        observation["parentObservationId"] = renamed.get(observation["parentObservationId"] or "")
    return copied


def _server_with_traces(server: TraceServer, traces: list[dict[str, Any]]) -> None:
    server.langfuse_traces, server.langfuse_keys, server.page_cap = list(traces), KEYS, 2  # 3 traces: 2 pages


def _rt4(*args: str, keys: tuple[str, str] | None = KEYS) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANGFUSE_")}
    if keys is not None:
        env |= {"LANGFUSE_PUBLIC_KEY": keys[0], "LANGFUSE_SECRET_KEY": keys[1]}
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT, env=env)


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def _audit(server: TraceServer, out: Path, cache: Path, *flags: str) -> tuple[int, list[dict[str, Any]], str]:
    completed = _rt4("verify", f"langfuse://127.0.0.1:{server.port}/rag-app", "--judge", f"scripted:{RULES}",
                     "--cache-dir", str(cache), "-o", str(out), *flags)
    assert "Traceback" not in completed.stderr, completed.stderr
    assert KEYS[1] not in completed.stdout + completed.stderr
    return completed.returncode, _records(out), completed.stderr


def test_a_langfuse_project_is_audited_scored_and_read_again_only_for_new_traces(tmp_path: Path) -> None:
    traces = _traces()
    with trace_server() as server:
        _server_with_traces(server, traces)
        cache = tmp_path / "cache"
        code, first, _ = _audit(server, tmp_path / "first.jsonl", cache, "--write-back")
        assert code == EXIT_USAGE  # one trace holds no documents: invalid input, its record says so
        listed = [r for r in server.requests if r[1].startswith("/api/public/traces?")]
        assert len(listed) == -(-len(traces) // server.page_cap)  # every page, page=1 to meta.totalPages
        assert sorted(r[1] for r in server.requests if r[1].startswith("/api/public/traces/")) == \
            [f"/api/public/traces/{t['id']}" for t in traces]
        # The same traces read from the export file give the same verdicts, trace by trace, in timestamp order.
        file_out = tmp_path / "file.jsonl"
        _rt4("verify", str(EXPORT), "--input-format", "langfuse", "--judge", f"scripted:{RULES}", "--cache-dir",
             str(cache), "-o", str(file_out), "-q")
        assert [(r["id"], r["label"], [c["label"] for c in r["claims"]]) for r in first] == \
            [(r["id"], r["label"], [c["label"] for c in r["claims"]]) for r in _records(file_out)]
        assert [r["id"] for r in first] == [t["id"] for t in sorted(traces, key=lambda t: t["timestamp"])]
        # Written back to the server read: one score per verdict, on its generation; the keys went nowhere else.
        scored = {s["traceId"]: s for s in server.scores.values()}
        assert {r["id"]: r["label"] for r in first if r["label"]} == {t: s["value"] for t, s in scored.items()}
        assert all(s["observationId"] == next(r for r in first if r["id"] == t)["trace"]["answer_span_id"]
                   for t, s in scored.items())
        assert {r[2] for r in server.requests} == {_basic(KEYS)}
        outputs = {p.name: p.read_text(encoding="utf-8") for p in tmp_path.glob("first.jsonl*")}
        assert {"first.jsonl", "first.jsonl.write-back.jsonl"} <= outputs.keys()
        assert not any(key in text for text in outputs.values() for key in KEYS)

        # A new trace arrives: the next run audits it alone (the one at the watermark is listed, and skipped);
        # the one after, nothing.
        newest = max(datetime.fromisoformat(t["timestamp"]) for t in traces)
        server.langfuse_traces.append(_copy_of_trace(traces[0], "lf-trace-new", newest + timedelta(seconds=1)))
        code, second, stderr = _audit(server, tmp_path / "second.jsonl", cache, "--write-back")
        assert code == 0, stderr
        assert [r["id"] for r in second] == ["lf-trace-new"] and second[0]["label"] == "entailed"
        assert "1 new traces (1 begun before the window or audited before)" in " ".join(stderr.split())
        assert len(server.scores) == len(scored) + 1
        code, third, stderr = _audit(server, tmp_path / "third.jsonl", cache)
        assert (code, third) == (0, []), stderr
        # Audited again from scratch (another cache, so no watermark): every score updated, none added.
        posted = sum(r[:2] == ("POST", "/api/public/scores") for r in server.requests)
        code, again, stderr = _audit(server, tmp_path / "again.jsonl", tmp_path / "other", "--write-back")
        assert code == EXIT_USAGE and len(again) == len(traces) + 1, stderr
        assert sum(r[:2] == ("POST", "/api/public/scores") for r in server.requests) == posted + len(scored) + 1
        assert len(server.scores) == len(scored) + 1
        # rt4 estimate reads what the next audit would read: nothing new here, all of it under a fresh watermark.
        plans = [_rt4("estimate", f"langfuse://127.0.0.1:{server.port}/rag-app", "--cache-dir", str(where), "--json")
                 for where in (cache, tmp_path / "fresh")]
        assert [json.loads(plan.stdout)["samples"] for plan in plans] == [0, 3], [plan.stderr for plan in plans]


def _basic(keys: tuple[str, str]) -> str:
    import base64

    return "Basic " + base64.b64encode(":".join(keys).encode()).decode()


def test_refused_keys_another_project_and_an_unreachable_server_are_usage_errors(tmp_path: Path) -> None:
    with trace_server() as server:
        _server_with_traces(server, _traces())
        url = f"langfuse://127.0.0.1:{server.port}"
        bad_key = ("pk-lf-stand-in-public", "sk-lf-wrong-secret-0d1e2f")
        refused = _rt4("verify", f"{url}/rag-app", "--judge", f"scripted:{RULES}", "--no-cache", keys=bad_key)
        assert refused.returncode == EXIT_USAGE and "answered 401 for the keys' project" in refused.stderr
        assert bad_key[1] not in refused.stdout + refused.stderr
        missing = _rt4("verify", f"{url}/rag-app", "--judge", f"scripted:{RULES}", "--no-cache", keys=None)
        assert missing.returncode == EXIT_USAGE
        assert "needs LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY" in " ".join(missing.stderr.split())
        other = _rt4("verify", f"{url}/another-app", "--judge", f"scripted:{RULES}", "--no-cache")
        assert other.returncode == EXIT_USAGE and "the keys open project rag-app (id cm-project-1), not " \
            "'another-app'" in " ".join(other.stderr.split())
        unknown = _rt4("verify", f"{url}/rag-app?team=a", "--judge", f"scripted:{RULES}", "--no-cache")
        assert unknown.returncode == EXIT_USAGE and "unknown trace filter team" in unknown.stderr
        assert not any(r[1].startswith("/api/public/traces") for r in server.requests)  # none got to list traces
    closed = _rt4("verify", f"{url}/rag-app", "--judge", f"scripted:{RULES}", "--no-cache")
    assert closed.returncode == EXIT_USAGE and "cannot be read: ConnectError" in closed.stderr
    for result in (refused, missing, other, unknown, closed):
        assert "Traceback" not in result.stderr and KEYS[1] not in result.stdout + result.stderr


def test_the_window_leaves_out_what_is_older_than_since_and_younger_than_settle(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", KEYS[0])
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", KEYS[1])
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    base = _traces()[0]
    ages = {"old": timedelta(hours=3), "kept-1": timedelta(minutes=50), "kept-2": timedelta(minutes=20),
            "tie": timedelta(minutes=20), "settling": timedelta(minutes=2)}
    with trace_server() as server:
        _server_with_traces(server, [_copy_of_trace(base, name, now - age) for name, age in ages.items()])
        source = langfuse_source(f"langfuse://127.0.0.1:{server.port}/cm-project-1")  # by id as well as by name
        assert source is not None
        read = read_langfuse(source, timedelta(hours=1), None, now=now)
        assert [item.raw_id for item in read.items] == ["kept-1", "kept-2", "tie"]
        assert read.watermark == Watermark(source=source.name, root_start_ns=unix_ns(now - ages["tie"]),
                                           trace_ids=["kept-2", "tie"])
        # From the watermark on: the traces at its instant are skipped, the one that settled since is read.
        later = read_langfuse(source, timedelta(hours=1), read.watermark, now=now + timedelta(minutes=10))
        assert [item.raw_id for item in later.items] == ["settling"]
        shorter = langfuse_source(f"langfuse://127.0.0.1:{server.port}/rag-app?settle=1m&name=rag-answer")
        assert shorter is not None and shorter.name != source.name  # its own watermark
        assert [item.raw_id for item in read_langfuse(shorter, timedelta(minutes=30), None, now=now).items] == \
            ["kept-2", "tie", "settling"]


def test_an_answer_over_the_cap_and_a_bad_settle_are_refused_a_deleted_trace_is_one_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", KEYS[0])
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", KEYS[1])
    with pytest.raises(TraceError, match="settle: 'soon' is not a duration"):
        langfuse_source("langfuse://127.0.0.1:1/rag-app?settle=soon")
    assert langfuse_source("phoenix://127.0.0.1:1/rag-app") is None
    with trace_server() as server:
        _server_with_traces(server, _traces())
        source = langfuse_source(f"langfuse+https://127.0.0.1:{server.port}/rag-app")
        assert source is not None and source.base_url.startswith("https://")
        plain = langfuse_server.LangfuseSource(server.url, "rag-app")
        monkeypatch.setattr("rt4chart.records.server_reads.MAX_PAGE_BYTES", 500)
        with pytest.raises(TraceError, match="an answer for project 'rag-app' over 500 bytes"):
            read_langfuse(plain, None, None)
        monkeypatch.undo()
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", KEYS[0])
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", KEYS[1])
        # A trace deleted between the list and its own read: one error record naming it, the others read.
        server.langfuse_gone = {"lf-trace-2"}
        read = read_langfuse(plain, None, None)
        assert [(item.raw_id, item.sample is not None) for item in read.items] == \
            [("lf-trace-1", True), ("lf-trace-2", False), ("lf-trace-3", False)]
        assert "trace lf-trace-2: listed, then not found (Langfuse at " in (read.items[1].error or "")


def test_a_redirect_is_not_followed_so_the_keys_stay_with_the_host_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", KEYS[0])
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", KEYS[1])
    with trace_server() as elsewhere, trace_server() as server:
        _server_with_traces(server, _traces())
        server.redirect_to = elsewhere.url
        with pytest.raises(TraceError, match="answered 307 for the keys' project"):
            read_langfuse(langfuse_server.LangfuseSource(server.url, "rag-app"), None, None)
        assert len(server.requests) == 1 and elsewhere.requests == []


def test_a_mapping_of_the_other_source_s_kind_is_refused_not_ignored(tmp_path: Path) -> None:
    from rt4chart.records.langfuse import LangfuseMapping
    from rt4chart.records.traces import TraceMapping
    from rt4chart.runs.production import read_project, source_mapping
    from rt4chart.runs.spec import RunSpec

    langfuse, phoenix = langfuse_source("langfuse://127.0.0.1:9/p"), live_source("phoenix://127.0.0.1:9/p")
    assert isinstance(source_mapping(langfuse, None), LangfuseMapping)
    assert phoenix is not None and isinstance(source_mapping(phoenix, None), TraceMapping)
    mapping = tmp_path / "mapping.toml"
    mapping.write_text('turns = "each"\n', encoding="utf-8")
    assert source_mapping(langfuse, mapping).turns == "each"
    spec = RunSpec(cache=tmp_path)
    with pytest.raises(TraceError, match="a Langfuse project is read with a LangfuseMapping"):
        read_project(spec, langfuse, None, TraceMapping())  # before anything is read: port 9 is closed
    with pytest.raises(TraceError, match="a Phoenix project is read with a TraceMapping"):
        read_project(spec, phoenix, None, LangfuseMapping())
