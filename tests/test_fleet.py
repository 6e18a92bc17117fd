"""Judge fleets: one logical judge served by several deployments through litellm's Router.

Two fault servers on 127.0.0.1 are the two replicas: one answers, the other fails (429s with a
Retry-After, or 500s). Real ``rt4 verify`` runs show the calls moving to the healthy replica, the
run completing, the records naming the logical judge (never a replica), each replica receiving
only its own key, and the cache serving a verdict whichever replica produced it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from audit_fixtures import read_records, without_usage, write_samples
from conftest import VerifyRequestFactory
from faults import Fault, FaultServer, fault_server, grounded, judge_every_claim

from rt4chart.judges.registry import JudgeConfigError, JudgeProfile, judge_stack
from rt4chart.protocol import JudgeResponse, JudgeUnavailable

ROOT = Path(__file__).resolve().parent.parent
KEY_A = "sk-rt4fleet-a-7d1e09c4b2"
KEY_B = "sk-rt4fleet-b-3f8a61d5e0"

RATE_LIMITED = Fault("rate_limit", retry_after_s=30)
"""429 with a Retry-After of 30 s: the router cools that replica down for as long."""


def fleet_profile(path: Path, first: FaultServer, second: FaultServer) -> Path:
    path.write_text(
        f"""name = "smol-fleet"
model = "openai/smollm2"
backoff_s = 0.01
backoff_max_s = 0.05
max_attempts = 6
concurrency = 4
allowed_fails = 0
cooldown_s = 30

[[deployments]]
api_base = "{first.base_url}"
api_key_env = "RT4_FLEET_A_KEY"
rpm = 600

[[deployments]]
api_base = "{second.base_url}"
api_key_env = "RT4_FLEET_B_KEY"
rpm = 600
""",
        encoding="utf-8",
    )
    return path


def rt4(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "RT4_FLEET_A_KEY": KEY_A, "RT4_FLEET_B_KEY": KEY_B}
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=300)


def test_calls_move_to_the_healthy_replica_and_the_cache_serves_either(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", 12)
    entail = grounded
    audit = ["--judge", "fleet.toml", "--decomposer", "rules", "--no-global", "--cache-dir", "cache", "-q"]
    with fault_server(entail, default=RATE_LIMITED) as sick, fault_server(entail) as healthy:
        fleet_profile(tmp_path / "fleet.toml", sick, healthy)
        done = rt4("verify", "in.jsonl", "--out", "out.jsonl", *audit, cwd=tmp_path)
        # 1: the cakes are baseless in every sample (a finding, not a failure).
        assert done.returncode == 1, done.stderr
        records = read_records(tmp_path / "out.jsonl")
        assert [r["id"] for r in records] == [f"s{i}" for i in range(12)]
        assert all(r["label"] == "baseless" and not r["incomplete"] and not r["errors"] for r in records)
        # The logical judge, whichever replica answered.
        assert {r["judge"] for r in records} == {"smol-fleet/openai/smollm2"}
        # Every attempt is counted in the records, the failed ones included; the sick replica is
        # cooled down after its first failure (calls already on their way to it may fail too).
        assert len(healthy.requests) + len(sick.requests) == sum(r["usage"]["calls"] for r in records)
        assert 1 <= len(sick.requests) <= 4 < len(healthy.requests)
        # Each replica got its own key and no other.
        assert {h["authorization"] for h in sick.headers} == {f"Bearer {KEY_A}"}
        assert {h["authorization"] for h in healthy.headers} == {f"Bearer {KEY_B}"}
    # The replicas swap roles: the verdicts the second one produced answer the rerun from the cache.
    with fault_server(entail) as first, fault_server(entail, default=RATE_LIMITED) as second:
        fleet_profile(tmp_path / "fleet.toml", first, second)
        again = rt4("verify", "in.jsonl", "--out", "again.jsonl", *audit, cwd=tmp_path)
        assert again.returncode == 1, again.stderr
        assert len(first.requests) == len(second.requests) == 0
    assert [without_usage(r) for r in read_records(tmp_path / "again.jsonl")] == [without_usage(r) for r in records]
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY_A.encode() not in path.read_bytes() and KEY_B.encode() not in path.read_bytes()
    assert KEY_A not in done.stderr + again.stderr and KEY_B not in done.stderr + again.stderr


def test_each_call_names_the_replica_that_answered(
    tmp_path: Path, verify_request: VerifyRequestFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RT4_FLEET_A_KEY", KEY_A)
    monkeypatch.setenv("RT4_FLEET_B_KEY", KEY_B)
    entail = judge_every_claim("entailed")

    async def ask(profile: Path) -> list[str | None]:
        stack = judge_stack(str(profile))
        try:
            replies = [await stack.complete(verify_request([f"claim {n}"])) for n in range(4)]
        finally:
            await stack.aclose()
        assert all(reply.parsed is not None and reply.judge == "smol-fleet/openai/smollm2" for reply in replies)
        return [reply.deployment for reply in replies]

    # A replica answering 500s: cooled down after its first failure, the retry goes to the other.
    with fault_server(entail, default=Fault("server_error")) as sick, fault_server(entail) as healthy:
        deployments = asyncio.run(ask(fleet_profile(tmp_path / "fleet.toml", sick, healthy)))
    assert deployments == [f"openai/smollm2@{healthy.base_url}"] * 4


def test_a_refusing_replica_is_retried_elsewhere_and_only_a_refusing_fleet_stops(
    tmp_path: Path, verify_request: VerifyRequestFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 401 is one replica's problem while another answers: every request, sent many at once,
    ends with a verdict from the healthy replica. When every replica refuses, the judge stops."""
    monkeypatch.setenv("RT4_FLEET_A_KEY", KEY_A)
    monkeypatch.setenv("RT4_FLEET_B_KEY", KEY_B)
    entail = judge_every_claim("entailed")

    async def ask_at_once(profile: Path, requests: int) -> list[JudgeResponse]:
        stack = judge_stack(str(profile))
        try:
            asked = (stack.complete(verify_request([f"claim {n}"])) for n in range(requests))
            return list(await asyncio.gather(*asked))
        finally:
            await stack.aclose()

    for round_ in range(3):  # the router's picks are random: several rounds of many requests at once
        with fault_server(entail, default=Fault("echo_key")) as refusing, fault_server(entail) as healthy:
            profile = fleet_profile(tmp_path / f"fleet{round_}.toml", refusing, healthy)
            replies = asyncio.run(ask_at_once(profile, 12))
        assert [reply.error for reply in replies] == [None] * 12
        assert {reply.deployment for reply in replies} == {f"openai/smollm2@{healthy.base_url}"}
        assert refusing.headers, "the refusing replica was never tried: the test shows nothing"

    refusal = Fault("echo_key")
    with fault_server(entail, default=refusal) as first, fault_server(entail, default=refusal) as second:
        with pytest.raises(JudgeUnavailable, match=r"(?s)a fleet of 2 deployments.*deployments refusing") as stopped:
            asyncio.run(ask_at_once(fleet_profile(tmp_path / "dead.toml", first, second), 12))
        calls = len(first.headers) + len(second.headers)
    assert KEY_A not in str(stopped.value) and KEY_B not in str(stopped.value)
    assert calls <= 12 * 2, "a fleet that refuses everywhere must fail fast, not retry every request to the limit"


def test_a_fleet_refuses_an_api_base_and_names_a_missing_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RT4_FLEET_A_KEY", raising=False)
    with fault_server("{}") as one, fault_server("{}") as two:
        profile = fleet_profile(tmp_path / "fleet.toml", one, two)
        with pytest.raises(JudgeConfigError, match="RT4_FLEET_A_KEY"):
            judge_stack(str(profile))
        monkeypatch.setenv("RT4_FLEET_A_KEY", KEY_A)
        monkeypatch.setenv("RT4_FLEET_B_KEY", KEY_B)
        with pytest.raises(JudgeConfigError, match="--api-base does not apply"):
            judge_stack(str(profile), api_base=one.base_url)


def test_the_example_fleet_profile_is_valid() -> None:
    profile = JudgeProfile.model_validate(tomllib.loads((ROOT / "examples" / "fleet.toml").read_text(encoding="utf-8")))
    assert len(profile.deployments) == 3 and profile.routing_strategy == "usage-based-routing"


def test_a_router_with_no_deployment_to_offer_books_no_call(
    tmp_path: Path, verify_request: VerifyRequestFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both replicas answer 429 with a 30 s Retry-After, so the router cools both down and refuses
    the later attempts itself, before any request leaves: those are not calls. The usage a reply
    carries counts exactly the requests the servers received."""
    monkeypatch.setenv("RT4_FLEET_A_KEY", KEY_A)
    monkeypatch.setenv("RT4_FLEET_B_KEY", KEY_B)

    async def ask(profile: Path) -> list[JudgeResponse]:
        stack = judge_stack(str(profile))
        try:
            return [await stack.complete(verify_request([f"claim {n}"])) for n in range(3)]
        finally:
            await stack.aclose()

    entail = judge_every_claim("entailed")
    with fault_server(entail, default=RATE_LIMITED) as first, fault_server(entail, default=RATE_LIMITED) as second:
        replies = asyncio.run(ask(fleet_profile(tmp_path / "fleet.toml", first, second)))
        sent = len(first.requests) + len(second.requests)
    assert all(reply.error is not None for reply in replies), "every deployment was rate limited"
    assert 1 <= sent < 3 * 6, "the router refused attempts itself: the test shows nothing otherwise"
    assert sum(reply.usage.calls for reply in replies) == sent
