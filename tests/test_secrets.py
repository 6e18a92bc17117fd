"""Secrets: a key goes only to the endpoint its profile names, and no artifact of a run holds one.

The runs are real: ``rt4 verify`` in a subprocess against the fault server of ``tests/faults.py``,
which records every request header and writes the sentinel key into its replies (a model or server
echoing a key it saw), then every file the run left behind is grepped for the sentinel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from audit_fixtures import write_samples
from conftest import judge_over
from faults import Fault, claims_in, fault_server

SENTINEL = "sk-rt4sentinel-5b0e2f9d8c7a61f3"
"""A key-shaped value set as every key variable of these runs; it must never be found."""

BACKEND_TEST_SECRET = "rt4-sentinel-0d9c8b7a6f5e4d3c"
"""The key of the backend test whose JUnit report is grepped here."""

ROOT = Path(__file__).resolve().parent.parent


def echoing_reply(body: dict[str, Any]) -> str:
    """One entailed judgement per claim whose rationale and evidence repeat the sentinel key."""
    judgements = [
        {"claim": position, "label": "entailed", "evidence": [f"opens {SENTINEL}"],
         "rationale": f"your key is {SENTINEL}", "confidence": 0.9}
        for position in range(len(claims_in(body)))
    ]
    return json.dumps({"judgements": judgements})


def rt4(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OPENAI_API_KEY": SENTINEL,
        "RT4_SENTINEL_API_KEY": SENTINEL,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


def files_holding(directory: Path, needle: str) -> list[Path]:
    return [path for path in sorted(directory.rglob("*")) if path.is_file() and needle.encode() in path.read_bytes()]


def test_a_cloud_profile_on_a_user_server_gets_the_placeholder_not_its_key(tmp_path: Path, transport: str) -> None:
    write_samples(tmp_path / "in.jsonl", 2)
    with fault_server(echoing_reply) as server:
        done = rt4("verify", "in.jsonl", "--judge", judge_over(transport, "gpt-4o-mini", tmp_path), "--api-base",
                   server.base_url, "--decomposer", "rules", "--out", "out.jsonl", "--cache-dir", "cache", "-q",
                   cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    sent = {headers.get("authorization") for headers in server.headers}
    assert sent == {"Bearer no-key"}, "the profile's key went to a server the profile does not name"


def test_no_artifact_of_a_run_holds_the_sentinel_key(tmp_path: Path, transport: str) -> None:
    write_samples(tmp_path / "in.jsonl", 3)
    judge = judge_over(transport, "gpt-4o-mini", tmp_path)
    runs = []
    with fault_server(echoing_reply) as server:
        runs.append(rt4("verify", "in.jsonl", "--judge", judge, "--api-base", server.base_url,
                        "--decomposer", "rules", "--out", "out.jsonl", "--cache-dir", "cache", cwd=tmp_path))
        # A rerun answered from the cache, and a resume: the cached replies are scrubbed too.
        runs.append(rt4("verify", "in.jsonl", "--judge", judge, "--api-base", server.base_url,
                        "--decomposer", "rules", "--out", "out.jsonl", "--cache-dir", "cache", "--resume",
                        cwd=tmp_path))
    with fault_server(echoing_reply, default=Fault("echo_key")) as server:
        runs.append(rt4("verify", "in.jsonl", "--judge", judge, "--api-base", server.base_url,
                        "--decomposer", "rules", "--out", "failed.jsonl", "--cache-dir", "cache", "--timeout", "2",
                        cwd=tmp_path))
    runs.append(rt4("score", "out.jsonl", "--out", "scores.json", cwd=tmp_path))
    # JUnit: the backend's own key-echo test, run with every log captured into the report.
    junit = tmp_path / "junit.xml"
    runs.append(subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "junit_logging=all",
         f"--junitxml={junit}", "tests/backends/test_litellm.py::test_a_key_echoed_inside_the_verdict_is_scrubbed"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300,
    ))
    for number, run in enumerate(runs):
        (tmp_path / f"run-{number}.log").write_text(run.stdout + run.stderr, encoding="utf-8")
    assert runs[0].returncode in (0, 1), runs[0].stderr
    assert runs[-1].returncode == 0, runs[-1].stdout
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 3 and all("***" in claim["rationale"] for r in records for claim in r["claims"])
    assert (tmp_path / "cache" / "cache.db").exists() and junit.exists()
    assert files_holding(tmp_path, SENTINEL) == []
    assert files_holding(tmp_path, BACKEND_TEST_SECRET) == []
    assert files_holding(tmp_path, SENTINEL[3:19]) == []  # nor a recognisable part of it


def test_a_fleet_replica_echoing_its_key_leaves_it_in_no_artifact(tmp_path: Path) -> None:
    """A fleet (litellm Router): one replica answers 401 with the Authorization header in its message,
    the other echoes the key inside its verdicts; each replica receives only its own deployment's key."""
    write_samples(tmp_path / "in.jsonl", 3)
    with fault_server(echoing_reply, default=Fault("echo_key")) as leaking, fault_server(echoing_reply) as healthy:
        (tmp_path / "fleet.toml").write_text(
            f'name = "fleet"\nmodel = "openai/fault"\nbackoff_s = 0.01\nallowed_fails = 0\n\n'
            f'[[deployments]]\napi_base = "{leaking.base_url}"\napi_key_env = "RT4_SENTINEL_API_KEY"\n\n'
            f'[[deployments]]\napi_base = "{healthy.base_url}"\n',
            encoding="utf-8",
        )
        done = rt4("verify", "in.jsonl", "--judge", "fleet.toml", "--decomposer", "rules", "--out", "out.jsonl",
                   "--cache-dir", "cache", cwd=tmp_path)
    (tmp_path / "run.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    assert done.returncode in (0, 1), done.stderr
    assert {h.get("authorization") for h in leaking.headers} == {f"Bearer {SENTINEL}"}
    assert {h.get("authorization") for h in healthy.headers} == {"Bearer no-key"}, "a key went to another replica"
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(records) == 3 and all("***" in claim["rationale"] for r in records for claim in r["claims"])
    assert files_holding(tmp_path, SENTINEL) == [] and files_holding(tmp_path, SENTINEL[3:19]) == []


# --- every form a secret can take (issue 27, item 3) ---------------------------------------------

ESCAPED_SENTINEL = "".join(f"\\u{ord(character):04x}" for character in SENTINEL)
"""The sentinel as a model may write it inside a JSON string: every character a \\uXXXX escape."""


def escaped_and_split_reply(body: dict[str, Any]) -> str:
    """Entailed judgements whose rationale holds the key JSON-escaped (so the raw reply, which the
    cache stores, never holds it as written) and in two halves."""
    judgements = [
        {"claim": position, "label": "entailed", "evidence": ["opens at"], "confidence": 0.9,
         "rationale": f"escaped @@KEY@@; halves {SENTINEL[:15]} + {SENTINEL[15:]}"}
        for position in range(len(claims_in(body)))
    ]
    return json.dumps({"judgements": judgements}).replace("@@KEY@@", ESCAPED_SENTINEL)


def test_a_key_echoed_json_escaped_or_in_halves_is_in_no_artifact_the_cache_included(
    tmp_path: Path, transport: str
) -> None:
    write_samples(tmp_path / "in.jsonl", 2)
    judge = judge_over(transport, "gpt-4o-mini", tmp_path)
    with fault_server(escaped_and_split_reply) as server:
        for resume in ([], ["--resume"]):  # the second run reads the cached raw replies back
            done = rt4("verify", "in.jsonl", "--judge", judge, "--api-base", server.base_url,
                       "--decomposer", "rules", "--out", "out.jsonl", "--cache-dir", "cache", "--report",
                       "report.html", "--junit", "junit.xml", *resume, cwd=tmp_path)
            assert done.returncode in (0, 1), done.stderr
            (tmp_path / f"run{len(resume)}.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all("***" in claim["rationale"] for record in records for claim in record["claims"])
    assert (tmp_path / "cache" / "cache.db").exists()
    for form in (SENTINEL, ESCAPED_SENTINEL, ESCAPED_SENTINEL.upper().replace("\\U", "\\u"), SENTINEL[15:]):
        assert files_holding(tmp_path, form) == [], form


def test_credentials_in_the_base_url_are_in_no_record_report_or_message(tmp_path: Path, transport: str) -> None:
    write_samples(tmp_path / "in.jsonl", 2)
    with fault_server(echoing_reply) as server:
        done = rt4("verify", "in.jsonl", "--judge", judge_over(transport, "openai/fault", tmp_path), "--api-base",
                   f"{server.base_url}?api_key=QUERYSECRET42&model=x", "--decomposer", "rules", "--no-cache",
                   "--out", "out.jsonl", "--report", "report.html", "--junit", "junit.xml", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    assert server.requests, "the query string does not stop the judge from being reached"
    (tmp_path / "run.log").write_text(done.stdout + done.stderr, encoding="utf-8")
    record = json.loads((tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert record["judge"].endswith("?api_key=***&model=x")
    assert files_holding(tmp_path, "QUERYSECRET42") == []


def test_userinfo_in_the_base_url_is_refused_once_before_any_call(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", 2)
    with fault_server(echoing_reply) as server:
        done = rt4("verify", "in.jsonl", "--judge", "openai/fault", "--api-base",
                   server.base_url.replace("http://", "http://alice:hunter2-pass@"), "--decomposer", "rules",
                   "--no-cache", "--out", "out.jsonl", cwd=tmp_path)
    assert done.returncode == 2 and "holds credentials" in done.stderr, done.stderr
    assert "hunter2" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert not server.requests and not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0?password=hunter2-pass", "redis://:hunter2-pass@127.0.0.1:abc/0"])
def test_a_redis_password_in_any_form_is_never_printed(tmp_path: Path, url: str) -> None:
    pytest.importorskip("redis", reason="the redis extra opens --cache-url")
    for command in (["cache", "stats"], ["cache", "clear"]):
        done = rt4(*command, "--cache-url", url, cwd=tmp_path)
        assert done.returncode == 2 and "cannot use the cache server" in done.stderr, done.stderr
        assert "hunter2" not in done.stderr + done.stdout and "Traceback" not in done.stderr
