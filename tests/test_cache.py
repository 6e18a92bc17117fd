"""The judge-call cache: reruns are free, anything that changes a reply misses, damage is a miss."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from audit_fixtures import read_records, write_rules, write_samples
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.budget import Ledger, MeteredBackend
from rt4chart.judges.cache import CachedBackend, JudgeCache, request_key
from rt4chart.judges.scripted import ScriptedBackend
from rt4chart.method.tasks import load_prompts
from rt4chart.options import AuditOptions
from rt4chart.protocol import JudgeResponse
from rt4chart.records.io import read_jsonl
from rt4chart.resources import resource_dir
from rt4chart.runs.engine import Pipeline, run_audit
from rt4chart.runs.planning import planned_requests
from rt4chart.types import AuditRecord

runner = CliRunner()


def run_cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def without_usage(record: dict[str, Any]) -> dict[str, Any]:
    """A record without what a cache hit changes: calls and cost, of the sample and of its claims."""
    claims = [{k: v for k, v in claim.items() if k not in ("calls", "cost_usd")} for claim in record["claims"]]
    return {**{k: v for k, v in record.items() if k not in ("usage", "usage_by_judge")}, "claims": claims}


def test_second_run_makes_no_judge_call_and_yields_identical_records(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 5)
    common = ["verify", str(inputs), "--judge", f"scripted:{rules}", "--cache-dir", str(tmp_path / "cache"), "-q"]
    run_cli(*common, "--out", str(tmp_path / "cold.jsonl"))
    run_cli(*common, "--out", str(tmp_path / "warm.jsonl"))
    cold, warm = read_records(tmp_path / "cold.jsonl"), read_records(tmp_path / "warm.jsonl")
    assert sum(r["usage"]["calls"] for r in cold) > 0
    assert sum(r["usage"]["calls"] for r in warm) == 0
    assert all(claim["calls"] == 0 and claim["cost_usd"] == 0 for r in warm for claim in r["claims"])
    assert sum(r["usage"]["cache_hits"] for r in warm) == sum(r["usage"]["calls"] for r in cold)
    assert [without_usage(r) for r in warm] == [without_usage(r) for r in cold]


def audit(pipeline: Pipeline, inputs: Path) -> list[AuditRecord]:
    reports: list[AuditRecord] = []
    asyncio.run(run_audit(pipeline, list(read_jsonl(inputs)), None, reports.append))
    return reports


def cached_pipeline(rules: Path, cache: JudgeCache, **options: object) -> Pipeline:
    backend = CachedBackend(ScriptedBackend.from_file(rules), cache)
    return Pipeline(backend, AuditOptions.model_validate(options))


def test_changed_prompt_file_or_generation_parameter_misses(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 2)
    cache = JudgeCache(tmp_path / "cache")
    first = audit(cached_pipeline(rules, cache), inputs)
    assert all(r.usage.calls > 0 and r.usage.cache_hits == 0 for r in first)
    assert all(r.usage.calls == 0 for r in audit(cached_pipeline(rules, cache), inputs))

    edited = tmp_path / "prompts"
    shutil.copytree(resource_dir("prompts"), edited)
    local = edited / "verify_local.txt"
    local.write_text(local.read_text(encoding="utf-8") + "\nBe brief.\n", encoding="utf-8")
    pipeline = cached_pipeline(rules, cache)
    pipeline.prompts = load_prompts(edited)
    reports = audit(pipeline, inputs)
    assert all(r.usage.calls > 0 for r in reports), "an edited local prompt must miss for local calls"
    assert all(r.prompt_version != first[0].prompt_version for r in reports)

    hotter = audit(cached_pipeline(rules, cache, temperature=0.7), inputs)
    assert all(r.usage.calls == first[i].usage.calls for i, r in enumerate(hotter))


def test_edited_rules_file_misses(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 1)
    cache = JudgeCache(tmp_path / "cache")
    audit(cached_pipeline(rules, cache), inputs)
    write_rules(rules, cost_per_call=0.5)
    assert audit(cached_pipeline(rules, cache), inputs)[0].usage.calls > 0


def test_corrupt_entry_is_a_miss_and_errors_are_never_stored(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 1)
    cache = JudgeCache(tmp_path / "cache")
    pipeline = cached_pipeline(rules, cache)
    audit(pipeline, inputs)
    sample = next(iter(read_jsonl(inputs))).sample
    assert sample is not None
    request = planned_requests(pipeline, sample)[0]
    key = request_key(ScriptedBackend.from_file(rules).name, request)
    assert cache.get(key, request.output_schema) is not None
    cache._store.set(key, b"\x00 not json")
    assert cache.get(key, request.output_schema) is None
    assert key not in cache._store, "a damaged entry is dropped"

    before = cache.stats().entries
    cache.put("failed-call", JudgeResponse(error="HTTP 500"))
    assert cache.stats().entries == before


def test_metered_backend_sees_no_call_on_a_hit(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", cost_per_call=0.01)
    write_samples(inputs, 2)
    cache, ledgers = JudgeCache(tmp_path / "cache"), [Ledger(), Ledger()]
    for ledger in ledgers:
        backend = CachedBackend(MeteredBackend(ScriptedBackend.from_file(rules), ledger), cache)
        audit(Pipeline(backend), inputs)
    assert ledgers[0].usage.calls > 0 and ledgers[0].spent_usd > 0
    assert ledgers[1].usage.calls == 0 and ledgers[1].spent_usd == 0


def test_concurrent_runs_share_one_cache_directory(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json", latency_s=0.01)
    write_samples(inputs, 12)
    command = [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--judge", f"scripted:{rules}",
               "--cache-dir", str(tmp_path / "cache"), "-q"]
    runs = [subprocess.Popen([*command, "--out", str(tmp_path / f"out{i}.jsonl")]) for i in range(2)]
    assert [run.wait(timeout=300) for run in runs] == [1, 1]
    first, second = (read_records(tmp_path / f"out{i}.jsonl") for i in range(2))
    assert [without_usage(r) for r in first] == [without_usage(r) for r in second]
    assert len(first) == 12
    # Each run looked every request up once: a miss it paid for or a hit the other run had stored.
    # Its requests are all distinct, so the shared directory ends with one entry per request.
    entries = JudgeCache(tmp_path / "cache").stats().entries
    for records in (first, second):
        assert entries == sum(r["usage"]["calls"] + r["usage"]["cache_hits"] for r in records)


def test_cache_stats_and_clear_commands(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 1)
    cache_dir = str(tmp_path / "cache")
    run_cli("verify", str(inputs), "--judge", f"scripted:{rules}", "--cache-dir", cache_dir, "-q")
    entries = JudgeCache(cache_dir).stats().entries
    code, output = run_cli("cache", "stats", "--cache-dir", cache_dir)
    assert code == 0 and f"{entries} entries" in output
    code, output = run_cli("cache", "clear", "--cache-dir", cache_dir)
    assert code == 0 and f"removed {entries} entries" in output
    assert JudgeCache(cache_dir).stats().entries == 0


def test_no_cache_flag_bypasses_the_cache(tmp_path: Path) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 1)
    args = ["verify", str(inputs), "--judge", f"scripted:{rules}", "--cache-dir", str(tmp_path / "c"), "--no-cache"]
    run_cli(*args, "-o", str(tmp_path / "a.jsonl"))
    run_cli(*args, "-o", str(tmp_path / "b.jsonl"))
    assert read_records(tmp_path / "b.jsonl")[0]["usage"]["calls"] > 0
    assert not (tmp_path / "c").exists()
    assert json.loads((tmp_path / "a.jsonl").read_text())["usage"]["cache_hits"] == 0


def test_cache_stats_prints_its_figures_on_stdout(tmp_path: Path) -> None:
    # What the command is for goes to stdout (`entries=$(rt4 cache stats)` in a CI step), not stderr.
    cache_dir = tmp_path / "cache"
    JudgeCache(cache_dir).close()
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    stats = subprocess.run([sys.executable, "-m", "rt4chart", "cache", "stats", "--cache-dir", str(cache_dir)],
                           capture_output=True, text=True, env=environment, timeout=120)
    assert stats.returncode == 0, stats.stderr
    assert stats.stdout.startswith(f"{cache_dir}: 0 entries, ") and stats.stdout.endswith(" MB\n")
    assert stats.stderr == ""
