"""The transport policy serves any sender: a backend that only knows how to POST one request gets
retries, backoff with Retry-After, the circuit breaker, per-loop concurrency, reply parsing and key
scrubbing, checked against the fault server from its side of the wire."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from conftest import VerifyRequestFactory
from faults import DECOY, Fault, FaultServer, fault_server

from rt4chart.judges.circuit import CIRCUIT_THRESHOLD
from rt4chart.judges.policy import CallSettings, PolicyBackend, Reply, Sender, retry_after_s
from rt4chart.method.tasks import VerifyOutput
from rt4chart.protocol import JudgeRequest, JudgeUnavailable
from rt4chart.types import Label

REPLY = json.dumps(
    {"judgements": [{"claim": 0, "label": "entailed", "evidence": ["The trial lasts 14 days."],
                     "rationale": "stated", "confidence": 0.9}]}
)
CLAIM = ["The trial lasts 14 days."]
KEY = "sk-policy-test-key-0123456789"


class HttpxSender(Sender):
    """All a new transport writes: one POST to an OpenAI-compatible server, raising on HTTP errors."""

    def __init__(self, base_url: str, key: str = KEY) -> None:
        self.base_url, self.key = base_url, key

    @property
    def name(self) -> str:
        return f"httpx@{self.base_url}"

    @property
    def secrets(self) -> frozenset[str]:
        return frozenset({self.key})

    async def send(self, messages: list[dict[str, str]], request: JudgeRequest) -> Reply:
        async with httpx.AsyncClient(timeout=5.0) as client:
            answer = await client.post(
                f"{self.base_url}/chat/completions",
                json={"model": "fault", "messages": messages, "max_tokens": request.params.max_tokens},
                headers={"Authorization": f"Bearer {self.key}"},
            )
            answer.raise_for_status()
        body = answer.json()
        usage = body["usage"]
        return Reply(body["choices"][0]["message"]["content"], usage["prompt_tokens"], usage["completion_tokens"])


def backend_at(server: FaultServer, **settings: Any) -> PolicyBackend:
    policy = {"max_attempts": 3, "backoff_s": 0.01, "backoff_max_s": 2.0, "concurrency": 2, **settings}
    return PolicyBackend(HttpxSender(server.base_url), CallSettings(**policy))


def run(backend: PolicyBackend, request: JudgeRequest) -> Any:
    return asyncio.run(backend.complete(request))


def test_transient_failures_are_retried_and_every_attempt_is_counted(verify_request: VerifyRequestFactory) -> None:
    faults = (Fault("server_error"), Fault("drop"))
    with fault_server(REPLY, *faults) as server:
        response = run(backend_at(server), verify_request(CLAIM))
    assert response.error is None and isinstance(response.parsed, VerifyOutput)
    assert len(server.requests) == 3 and response.usage.calls == 3
    assert response.usage.prompt_tokens == 50  # only the attempt that was answered reports tokens


def test_a_rate_limit_is_retried_and_its_retry_after_reaches_the_policy(
    verify_request: VerifyRequestFactory,
) -> None:
    with fault_server(REPLY, Fault("rate_limit", retry_after_s=0)) as server:
        response = run(backend_at(server), verify_request(CLAIM))
    assert response.error is None and len(server.requests) == 2
    with fault_server(REPLY, Fault("rate_limit", retry_after_s=7)) as server:
        sender = HttpxSender(server.base_url)
        with pytest.raises(httpx.HTTPStatusError) as raised:
            asyncio.run(sender.send([{"role": "user", "content": "hi"}], verify_request(CLAIM)))
    # The wait the policy takes before the next attempt: the server's seven seconds (capped by backoff_max_s).
    assert retry_after_s(raised.value) == 7.0 and sender.is_transient(raised.value)


def test_a_decoy_is_never_the_verdict_and_a_reply_without_one_is_reasked(
    verify_request: VerifyRequestFactory,
) -> None:
    with fault_server(REPLY, Fault("invalid_json"), default=Fault("think")) as server:
        response = run(backend_at(server), verify_request(CLAIM))
    assert isinstance(response.parsed, VerifyOutput) and response.parsed.judgements[0].label == Label.ENTAILED
    reask = server.requests[1]["messages"]
    assert reask[-2]["role"] == "assistant" and "could not be used" in reask[-1]["content"]
    assert DECOY not in response.parsed.model_dump_json()


def test_refusals_open_the_circuit_and_the_echoed_key_is_scrubbed(verify_request: VerifyRequestFactory) -> None:
    with fault_server(REPLY, default=Fault("echo_key")) as server:
        backend = backend_at(server, max_attempts=5)
        errors = [run(backend, verify_request(CLAIM)).error for _ in range(CIRCUIT_THRESHOLD - 1)]
        with pytest.raises(JudgeUnavailable) as opened:
            run(backend, verify_request(CLAIM))
        sent = len(server.requests)
        with pytest.raises(JudgeUnavailable):
            run(backend, verify_request(CLAIM))
    assert sent == CIRCUIT_THRESHOLD  # a 401 is not retried
    assert len(server.requests) == sent  # an open circuit sends nothing
    assert all(error and "401" in error for error in errors)
    assert server.headers[0]["authorization"] == f"Bearer {KEY}"  # the key was sent, and echoed back
    assert KEY not in str(opened.value) and all(KEY not in (error or "") for error in errors)
    assert backend.name in str(opened.value)


def test_a_refused_connection_gets_one_retry(verify_request: VerifyRequestFactory) -> None:
    with fault_server(REPLY) as server:
        base_url = server.base_url
    backend = PolicyBackend(HttpxSender(base_url), CallSettings(max_attempts=5, backoff_s=0.01))
    response = run(backend, verify_request(CLAIM))
    assert response.parsed is None and response.usage.calls == 2 and response.error
    assert "ConnectError" in response.error


def test_concurrency_is_bounded_in_every_event_loop(verify_request: VerifyRequestFactory) -> None:
    async def burst(backend: PolicyBackend) -> None:
        await asyncio.gather(*(backend.complete(verify_request(CLAIM)) for _ in range(6)))

    with fault_server(REPLY) as server:
        server.latency_s = 0.2
        backend = backend_at(server, concurrency=2)
        asyncio.run(burst(backend))
        asyncio.run(burst(backend))  # a second loop gets its own slots, not the first loop's
    assert len(server.requests) == 12 and server.max_in_flight == 2
