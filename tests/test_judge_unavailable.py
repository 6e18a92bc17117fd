"""Failing fast when the judge cannot be reached or refuses (issue 11, item 5).

Real sockets on 127.0.0.1: a port that was bound and closed again (nothing listens, so every
connection is refused) and the fault server of ``tests/faults.py`` answering 401. Call counts are
exact: a refused connection gets one retry, a 401 none, and the third request in a row that fails
this way opens the backend's circuit, after which no call leaves the client.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from audit_fixtures import write_samples
from conftest import EXAMPLES, VerifyRequestFactory, backend_over, judge_over
from faults import Fault, fault_server, judge_every_claim
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.circuit import CIRCUIT_THRESHOLD
from rt4chart.judges.policy import PolicyBackend
from rt4chart.judges.registry import JudgeProfile
from rt4chart.protocol import JudgeUnavailable

EXIT_JUDGE_FAILED = 4
CLAIM = ["The trial lasts 14 days."]


def closed_port_url() -> str:
    """The base URL of a port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def backend_at(api_base: str, transport: str, **profile: float) -> PolicyBackend:
    settings = {"timeout_s": 5.0, "max_attempts": 5, "backoff_s": 0.01, "backoff_max_s": 0.05, **profile}
    judge = JudgeProfile(name="fault", model="openai/fault", **settings)  # type: ignore[arg-type]
    return backend_over(transport, judge, api_base=api_base)


def test_a_refused_connection_is_retried_once_then_the_circuit_opens(
    verify_request: VerifyRequestFactory, transport: str
) -> None:
    url = closed_port_url()
    backend = backend_at(url, transport)

    async def four_requests() -> tuple[list[int], JudgeUnavailable, JudgeUnavailable]:
        calls = []
        for _ in range(CIRCUIT_THRESHOLD - 1):
            response = await backend.complete(verify_request(CLAIM))
            assert response.parsed is None and response.error is not None
            calls.append(response.usage.calls)
        with pytest.raises(JudgeUnavailable) as opened:
            await backend.complete(verify_request(CLAIM))
        with pytest.raises(JudgeUnavailable) as still_open:
            await backend.complete(verify_request(CLAIM))
        return calls, opened.value, still_open.value

    calls, opened, still_open = asyncio.run(four_requests())
    assert calls == [2] * (CIRCUIT_THRESHOLD - 1)  # one retry each, not max_attempts=5
    assert opened.failures == CIRCUIT_THRESHOLD == still_open.failures
    assert url in str(opened) and "connection refused" in str(opened)


def test_a_401_is_not_retried_and_opens_the_circuit_after_three_requests(
    verify_request: VerifyRequestFactory, transport: str
) -> None:
    with fault_server("{}", default=Fault("echo_key")) as server:
        backend = backend_at(server.base_url, transport)

        async def requests() -> JudgeUnavailable:
            for _ in range(CIRCUIT_THRESHOLD - 1):
                assert (await backend.complete(verify_request(CLAIM))).usage.calls == 1
            with pytest.raises(JudgeUnavailable) as opened:
                await backend.complete(verify_request(CLAIM))
            with pytest.raises(JudgeUnavailable):
                await backend.complete(verify_request(CLAIM))
            return opened.value

        opened = asyncio.run(requests())
    assert len(server.requests) == CIRCUIT_THRESHOLD  # the fourth request never left the client
    assert "HTTP 401" in str(opened) and server.base_url in str(opened)
    assert "no-key" not in str(opened)  # the key the server echoed back is scrubbed


def test_a_server_that_answers_resets_the_count(verify_request: VerifyRequestFactory, transport: str) -> None:
    faults = [Fault("echo_key"), Fault("echo_key"), Fault("server_error"), Fault("echo_key"), Fault("echo_key")]
    with fault_server(judge_every_claim("entailed"), *faults) as server:
        backend = backend_at(server.base_url, transport, max_attempts=1)

        async def five_requests() -> list[str | None]:
            return [(await backend.complete(verify_request(CLAIM))).error for _ in range(5)]

        errors = asyncio.run(five_requests())
    assert all(error is not None for error in errors)  # five failed requests, none opened the circuit
    assert len(server.requests) == 5 and not backend.circuit.is_open


def rt4_verify(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["verify", *args, "--no-cache"], catch_exceptions=False)
    return result.exit_code, "".join(result.stderr.split())


def test_verify_against_a_closed_port_stops_with_exit_4_and_resume_continues(tmp_path: Path, transport: str) -> None:
    out = tmp_path / "out.jsonl"
    url = closed_port_url()
    sample = EXAMPLES / "free_trial.jsonl"
    judge = judge_over(transport, "openai/fault", tmp_path)
    code, stderr = rt4_verify(str(sample), "--judge", judge, "--api-base", url, "--out", str(out))
    assert code == EXIT_JUDGE_FAILED
    assert "".join(url.split()) in stderr and "connectionrefused" in stderr.lower()
    assert "1samplesnotaudited" in stderr and "--resume" in stderr
    # Every input line gets its record: the verdict open, the reason kept, for --resume to redo.
    [unaudited] = [json.loads(line) for line in out.read_text().splitlines()]
    assert unaudited["label"] is None and unaudited["hallucinated"] is None and unaudited["incomplete"] is True
    assert "not audited" in unaudited["errors"][0] and "connection refused" in unaudited["errors"][0]

    with fault_server(judge_every_claim("entailed")) as server:
        # The fault server quotes no evidence: keep its ungrounded verdicts to see the resumed label.
        code, _ = rt4_verify(str(sample), "--judge", judge, "--api-base", server.base_url,
                             "--out", str(out), "--resume", "--ungrounded", "keep")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == 0 and [r["id"] for r in records] == ["free-trial"] and records[0]["label"] == "entailed"


def test_verify_against_a_401_makes_three_calls_and_exits_4(tmp_path: Path, transport: str) -> None:
    out = tmp_path / "out.jsonl"
    with fault_server("{}", default=Fault("echo_key")) as server:
        code, stderr = rt4_verify(str(EXAMPLES / "free_trial.jsonl"), "--judge",
                                  judge_over(transport, "openai/fault", tmp_path),
                                  "--api-base", server.base_url, "--out", str(out))
    # decomposition, the local batch, the global batch: three 401s, no retry, then the circuit opens
    assert len(server.requests) == CIRCUIT_THRESHOLD
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert code == EXIT_JUDGE_FAILED and "HTTP401" in stderr and record["incomplete"] and record["label"] is None


def test_eval_against_a_closed_port_exits_4_without_writing_a_result(tmp_path: Path) -> None:
    fixtures = Path(__file__).parent / "fixtures" / "datasets" / "ragtruth-qa"
    result = CliRunner().invoke(app, [
        "eval", "ragtruth-qa", "--path", str(fixtures), "--split", "dev", "--judge", "openai/fault",
        "--api-base", closed_port_url(), "--results-dir", str(tmp_path), "-q",
    ], catch_exceptions=False)
    assert result.exit_code == EXIT_JUDGE_FAILED
    assert "connectionrefused" in "".join(result.stderr.split()).lower()
    assert list(tmp_path.iterdir()) == []  # an incomplete evaluation is not a result


def test_a_judge_that_accepts_and_never_answers_stops_the_run_within_a_few_attempts(
    tmp_path: Path, transport: str
) -> None:
    """Issue 27: timeouts once never opened the circuit (15 attempts of 120 s per request)."""
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 4)
    with fault_server(judge_every_claim("entailed"), default=Fault("hang", hang_s=30)) as server:
        done = subprocess.run(
            [sys.executable, "-m", "rt4chart", "verify", str(inputs), "--judge",
             judge_over(transport, "openai/hung", tmp_path), "--api-base", server.base_url, "--decomposer", "rules",
             "--no-cache", "--timeout", "1", "--concurrency", "1", "--out", str(tmp_path / "out.jsonl")],
            capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                 "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
    assert done.returncode == 4, done.stderr
    assert "no answer within the timeout" in done.stderr
    # About three requests in a row (the circuit's threshold) of two attempts each, where one
    # request used to make 15: a request already past its circuit check may add its attempt.
    assert len(server.requests) <= 2 * CIRCUIT_THRESHOLD + 2, len(server.requests)
    assert len((tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()) == 4


def test_a_reply_beyond_what_max_tokens_can_produce_is_capped_not_parsed_or_stored(
    tmp_path: Path, transport: str
) -> None:
    """Issue 27: 20 MB replies, 16 in flight, once took 4.8 GB; such a body is an error on its call."""
    from rt4chart.judges.policy import reply_cap_chars

    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 2)
    huge = json.dumps({"judgements": [{"claim": 0, "label": "entailed", "evidence": ["opens at"],
                                       "rationale": "x" * (reply_cap_chars(64) + 1)}]})
    with fault_server(huge) as server:
        judge = judge_over(transport, "openai/huge", tmp_path)
        done = CliRunner().invoke(app, ["verify", str(inputs), "--judge", judge, "--api-base", server.base_url,
                                        "--decomposer", "rules", "--max-tokens", "64", "--cache-dir",
                                        str(tmp_path / "cache"), "--out", str(tmp_path / "out.jsonl"), "-q"])
    assert done.exit_code == 4, done.output
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    errors = [vote["error"] for r in records for c in r["claims"] for vote in c["votes"]]
    assert errors and all("over the cap" in error for error in errors)
    assert b"xxxxxxxx" * 1000 not in b"".join(p.read_bytes() for p in (tmp_path / "cache").rglob("*") if p.is_file())
