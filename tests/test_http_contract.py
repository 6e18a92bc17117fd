"""The reply-reading contract (rt4chart.judges.bounded_http), one matrix over every HTTP path.

Each path (the litellm sender, a litellm fleet, the OpenAI-compatible aiohttp transport, the
signals' vLLM client) calls a real fault-injecting server on 127.0.0.1 (tests/faults.py) from a
child process whose address space is capped (tests/bounded_reply_client.py): a client that reads a
gzip bomb or a body that never ends without bound meets that cap, never the machine's memory. The
child's own timeout only guards against a hang; no test asserts on time.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import pytest
from conftest import VerifyRequestFactory, backend_over
from faults import Fault, fault_server, judge_every_claim

from rt4chart.judges.bounded_http import DecodedBody, RedirectRefused, ReplyTooLarge, redirect_target
from rt4chart.judges.policy import reply_body_cap_bytes
from rt4chart.judges.registry import JudgeProfile
from rt4chart.signals.base import ScoreRequest, SignalError
from rt4chart.signals.vllm_client import REPLY_BYTES_PER_PROMPT_TOKEN, REPLY_SLACK_BYTES

CLIENT = Path(__file__).resolve().parent / "bounded_reply_client.py"

PATHS = ["litellm", "fleet", "openai_compat", "vllm"]
"""Every HTTP path that reads a server's reply."""

TIMEOUT_S = 3.0
"""The call's timeout (the deadline of the whole exchange)."""

HEADROOM_MIB = 768
"""Address space the child may add once its client is built: far above any capped reply, far below
the 1 GiB a gzip bomb inflates to."""

HANG_GUARD_S = 180
"""How long the child may run before the test calls it hung (a bounded client ends in seconds)."""


def cap_bytes(path: str) -> int:
    """The decoded-body cap of the one call the child makes over ``path`` (256 tokens for a judge,
    one prompt of 3 tokens for the vLLM client)."""
    if path == "vllm":
        return REPLY_SLACK_BYTES + 3 * REPLY_BYTES_PER_PROMPT_TOKEN
    return reply_body_cap_bytes(256)


def call(path: str, base_url: str) -> dict[str, Any]:
    """One call over ``path`` in a capped child process; its outcome."""
    try:
        done = subprocess.run(
            [sys.executable, str(CLIENT), path, base_url, str(TIMEOUT_S), str(HEADROOM_MIB)],
            capture_output=True, text=True, timeout=HANG_GUARD_S, env={**os.environ, "MALLOC_ARENA_MAX": "2"},
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the {path} client was still reading after {HANG_GUARD_S} s (timeout_s={TIMEOUT_S})")
    assert done.returncode == 0, f"the {path} client died (exit {done.returncode}): {done.stderr[-2000:]}"
    outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return outcome


@pytest.mark.parametrize("path", PATHS)
def test_a_gzip_bomb_is_cut_at_the_cap(path: str) -> None:
    with fault_server(judge_every_claim("baseless"), Fault("gzip_bomb")) as server:
        outcome = call(path, server.base_url)
    assert not outcome["ok"]
    assert f"over {cap_bytes(path):,} bytes (decoded), over the cap" in outcome["error"]


@pytest.mark.parametrize("path", PATHS)
def test_a_body_that_never_ends_is_cut_at_the_cap(path: str) -> None:
    with fault_server(judge_every_claim("baseless"), Fault("endless_body")) as server:
        outcome = call(path, server.base_url)
    assert not outcome["ok"]
    assert f"over {cap_bytes(path):,} bytes (decoded), over the cap" in outcome["error"]


@pytest.mark.parametrize("behaviour", ["trickle_headers", "trickle_body"])
@pytest.mark.parametrize("path", PATHS)
def test_a_trickling_reply_ends_at_the_deadline(path: str, behaviour: Any) -> None:
    with fault_server(judge_every_claim("baseless"), Fault(behaviour, trickle_s=0.2)) as server:
        outcome = call(path, server.base_url)
    assert not outcome["ok"]
    assert "timeout" in outcome["error"].lower()


@pytest.mark.parametrize("path", PATHS)
def test_a_redirect_to_another_origin_is_refused(path: str) -> None:
    with fault_server(judge_every_claim("baseless")) as elsewhere:
        target = elsewhere.base_url + "/chat/completions"
        with fault_server(judge_every_claim("baseless"), Fault("redirect", location=target)) as server:
            outcome = call(path, server.base_url)
    assert not outcome["ok"]
    assert "another origin" in outcome["error"]
    assert elsewhere.requests == []


@pytest.mark.parametrize("path", PATHS)
def test_a_redirect_within_the_origin_is_followed(path: str) -> None:
    """Not a fix: the refusal above must not reach redirects within the server."""
    endpoint = "/v1/completions" if path == "vllm" else "/v1/chat/completions"
    with fault_server(judge_every_claim("baseless"), Fault("redirect", location=f"/moved{endpoint}")) as server:
        outcome = call(path, server.base_url)
    assert outcome["ok"] and outcome["error"] is None
    assert server.paths == [endpoint, f"/moved{endpoint}"]


@pytest.mark.parametrize("behaviour", ["nan_logprobs", "bare_logprobs"])
def test_a_vllm_reply_without_usable_logprobs_is_a_signal_error(behaviour: Any) -> None:
    from rt4chart.signals.vllm_client import VllmPromptLogprobsBackend

    # The tokenizer is never used: the request is given as token ids.
    with fault_server("", Fault(behaviour)) as server:
        client = VllmPromptLogprobsBackend(server.base_url, None, "fault", model="fault", timeout_s=TIMEOUT_S)  # type: ignore[arg-type]
        with pytest.raises(SignalError, match="token 2 at position 1"):
            client.score([ScoreRequest([1, 2, 3], 1)])


def test_the_decoded_body_is_inflated_no_further_than_the_cap() -> None:
    # 64 MiB of zeros in about 64 KB: inflating it whole would hold 64 MiB at once.
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    bomb = compressor.compress(bytes(64 << 20)) + compressor.flush()
    body = DecodedBody("gzip", max_bytes=1 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(ReplyTooLarge):
            body.feed(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_origins_compare_scheme_host_and_port() -> None:
    assert redirect_target("http://h:80/v1/x", 307, "/v2/x") == "http://h:80/v2/x"
    assert redirect_target("http://H/v1/x", 308, "http://h:80/y") == "http://h:80/y"
    assert redirect_target("http://h/v1/x", 200, "http://elsewhere/") is None
    for elsewhere in ("https://h/v1/x", "http://h:81/v1/x", "http://h.evil/v1/x", "//other/v1"):
        with pytest.raises(RedirectRefused):
            redirect_target("http://h/v1/x", 307, elsewhere)


def test_a_refused_reply_is_not_retried(transport: str, verify_request: VerifyRequestFactory) -> None:
    """A second attempt would meet the same server: a refused reply is the call's error at once."""
    with fault_server(judge_every_claim("baseless")) as elsewhere:
        redirect = Fault("redirect", location=elsewhere.base_url + "/chat/completions")
        with fault_server(judge_every_claim("baseless"), redirect) as server:
            profile = JudgeProfile(name="fault", model="openai/fault", max_attempts=3, backoff_s=0.0)
            backend = backend_over(transport, profile, api_base=server.base_url)
            response = asyncio.run(backend.complete(verify_request(["The trial lasts 30 days."])))
    assert response.parsed is None and response.error is not None and "another origin" in response.error
    assert len(server.requests) == 1 and elsewhere.requests == []
