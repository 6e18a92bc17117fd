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

from audit_fixtures import write_samples
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


def test_a_cloud_profile_on_a_user_server_gets_the_placeholder_not_its_key(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", 2)
    with fault_server(echoing_reply) as server:
        done = rt4("verify", "in.jsonl", "--judge", "gpt-4o-mini", "--api-base", server.base_url,
                   "--decomposer", "rules", "--out", "out.jsonl", "--cache-dir", "cache", "-q", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    sent = {headers.get("authorization") for headers in server.headers}
    assert sent == {"Bearer no-key"}, "the profile's key went to a server the profile does not name"


def test_no_artifact_of_a_run_holds_the_sentinel_key(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", 3)
    runs = []
    with fault_server(echoing_reply) as server:
        runs.append(rt4("verify", "in.jsonl", "--judge", "gpt-4o-mini", "--api-base", server.base_url,
                        "--decomposer", "rules", "--out", "out.jsonl", "--cache-dir", "cache", cwd=tmp_path))
        # A rerun answered from the cache, and a resume: the cached replies are scrubbed too.
        runs.append(rt4("verify", "in.jsonl", "--judge", "gpt-4o-mini", "--api-base", server.base_url,
                        "--decomposer", "rules", "--out", "out.jsonl", "--cache-dir", "cache", "--resume",
                        cwd=tmp_path))
    with fault_server(echoing_reply, default=Fault("echo_key")) as server:
        runs.append(rt4("verify", "in.jsonl", "--judge", "gpt-4o-mini", "--api-base", server.base_url,
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
