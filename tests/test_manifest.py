"""The run manifest beside ``rt4 verify --out``: what it records, and how ``rt4 diff`` trusts it."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import datetime
from pathlib import Path

from conftest import EXAMPLES
from fixtures.reports.runs import rt4

from rt4chart.analysis.diff import diff_files
from rt4chart.options import AuditOptions
from rt4chart.records.manifest import MANIFEST_SCHEMA, manifest_path

RULES = EXAMPLES / "answers.rules.json"
ANSWERS = EXAMPLES / "answers.jsonl"


def _verify(directory: Path, *args: str) -> Path:
    out = directory / "audit.jsonl"
    done = rt4("verify", str(ANSWERS), "--judge", f"scripted:{RULES}", "--out", str(out), "--no-cache", "-q",
               "--fail-on", "never", *args, cwd=directory)
    assert done.returncode == 0, done.stderr
    return out


def test_the_manifest_describes_the_run(tmp_path: Path) -> None:
    out = _verify(tmp_path, "--batch-claims", "3")
    assert manifest_path(out) == tmp_path / "audit.jsonl.manifest.json"
    manifest = json.loads(manifest_path(out).read_text())
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert manifest["schema_version"] == MANIFEST_SCHEMA
    assert manifest["judge"] == records[0]["judge"] and manifest["prompt_version"] == records[0]["prompt_version"]
    assert manifest["judge_sha256"] == hashlib.sha256(manifest["judge"].encode()).hexdigest()
    assert manifest["options"] == AuditOptions(batch_claims=3).model_dump(mode="json")  # every option, defaults too
    assert manifest["input"] == {"path": str(ANSWERS), "sha256": hashlib.sha256(ANSWERS.read_bytes()).hexdigest(),
                                 "lines": len(records)}
    assert manifest["records_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    labels = Counter(record["label"] for record in records)
    assert manifest["counts"]["labels"] == {name: labels[name] for name in ("entailed", "contradicted", "baseless")}
    assert manifest["counts"]["hallucinated"] == sum(bool(record["hallucinated"]) for record in records)
    claims = Counter(claim["label"] for record in records for claim in record["claims"])
    assert manifest["counts"]["claims"] == dict(sorted(claims.items()))
    assert manifest["usage"]["calls"] == sum(record["usage"]["calls"] for record in records) > 0
    assert manifest["usage"]["prompt_tokens"] == sum(record["usage"]["prompt_tokens"] for record in records)
    started, ended = (datetime.fromisoformat(manifest[key]) for key in ("started_at", "ended_at"))
    assert started <= ended and manifest["wall_s"] == round((ended - started).total_seconds(), 3)
    assert manifest["rt4chart_version"]


def test_a_run_to_stdout_writes_no_manifest(tmp_path: Path) -> None:
    done = rt4("verify", str(ANSWERS), "--judge", f"scripted:{RULES}", "--no-cache", "-q", "--fail-on", "never",
               "--format", "jsonl", cwd=tmp_path)
    assert done.returncode == 0 and len(done.stdout.splitlines()) == 4
    assert list(tmp_path.glob("*.manifest.json")) == []


def test_a_manifest_of_an_edited_file_is_not_trusted(tmp_path: Path) -> None:
    out = _verify(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    second = _verify(other, "--window", "5", "--overlap", "2")
    assert diff_files(out, second).config.options_changed == {"overlap": [10, 2], "window": [25, 5]}
    lines = second.read_text().splitlines()
    second.write_text("\n".join(reversed(lines)) + "\n")  # edited by hand after the run
    result = diff_files(out, second)
    assert result.config.new.options is None and any("edited since" in warning for warning in result.warnings)


def test_a_broken_manifest_is_a_usage_error(tmp_path: Path) -> None:
    out = _verify(tmp_path)
    manifest_path(out).write_text("{not json")
    done = rt4("diff", str(out), str(out), cwd=tmp_path)
    assert done.returncode == 2 and "not an rt4chart run manifest" in done.stderr
