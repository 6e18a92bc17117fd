"""Concurrency that rides the rate limit: against the fault server enforcing a requests- and
tokens-per-window limit, the adaptive pacer is refused far less often than a fixed ``--concurrency``,
and never holds more calls than the ceiling (both counted at the server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from conftest import VerifyRequestFactory
from faults import FaultServer, RateLimit, fault_server

from rt4chart.judges.openai_compat import OpenAICompatBackend
from rt4chart.judges.pacing import INITIAL_IN_FLIGHT, Pacer, RateSignal, duration_s, rate_signal
from rt4chart.judges.registry import JudgeProfile
from rt4chart.method.tasks import VerifyOutput
from rt4chart.protocol import JudgeResponse

REPLY = json.dumps(
    {"judgements": [{"claim": 0, "label": "entailed", "evidence": ["The trial lasts 14 days."],
                     "rationale": "stated", "confidence": 0.9}]}
)
CLAIM = ["The trial lasts 14 days."]
CEILING = 32
CALLS = 60
MAX_TOKENS = 100


def audit(server: FaultServer, request_count: int, verify_request: VerifyRequestFactory, *,
          adaptive: bool, ceiling: int = CEILING) -> list[JudgeResponse]:
    """``request_count`` verify calls at once through an OpenAI-compatible judge at ``server``."""
    profile = JudgeProfile(name="limited", model="openai/limited", concurrency=ceiling,
                           adaptive_concurrency=adaptive, max_attempts=30, backoff_s=0.01, backoff_max_s=5.0)
    backend = OpenAICompatBackend(profile.openai_compat_settings(), api_key="no-key", api_base=server.base_url)
    request = verify_request(CLAIM, max_tokens=MAX_TOKENS)

    async def burst() -> list[JudgeResponse]:
        try:
            return await asyncio.gather(*(backend.complete(request) for _ in range(request_count)))
        finally:
            await backend.aclose()

    return asyncio.run(burst())


def refused_share(limit: RateLimit) -> float:
    return limit.refused / (limit.admitted + limit.refused)


@pytest.mark.parametrize(
    "limit",
    [
        pytest.param(lambda: RateLimit(requests=10, tokens=1_000_000, window_s=0.25), id="requests"),
        # Every call is charged 50 prompt tokens + MAX_TOKENS: 10 fit in a window.
        pytest.param(lambda: RateLimit(requests=1_000, tokens=10 * (50 + MAX_TOKENS), window_s=0.25), id="tokens"),
    ],
)
def test_adaptive_concurrency_rides_the_limit_that_fixed_concurrency_storms(
    limit: Callable[[], RateLimit], verify_request: VerifyRequestFactory
) -> None:
    counted: dict[bool, tuple[RateLimit, int]] = {}
    for adaptive in (False, True):
        with fault_server(REPLY) as server:
            server.latency_s = 0.02
            server.rate_limit = limit()
            responses = audit(server, CALLS, verify_request, adaptive=adaptive)
        assert all(isinstance(response.parsed, VerifyOutput) for response in responses), "every call answered"
        assert server.rate_limit.admitted == CALLS
        counted[adaptive] = (server.rate_limit, server.max_in_flight)
    (fixed, _), (adaptive, adaptive_held) = counted[False], counted[True]
    assert adaptive_held <= CEILING, "the ceiling is never exceeded"
    assert adaptive.refused * 5 <= fixed.refused, (
        f"adaptive refused {adaptive.refused} times, fixed {fixed.refused}: far fewer expected"
    )
    assert refused_share(adaptive) < 0.2 < refused_share(fixed)


def test_without_a_limit_the_pacer_climbs_to_the_ceiling_and_stays_under_it(
    verify_request: VerifyRequestFactory
) -> None:
    ceiling = 8
    with fault_server(REPLY) as server:
        server.latency_s = 0.2  # answers slow enough that the calls sent overlap at the server
        responses = audit(server, 40, verify_request, adaptive=True, ceiling=ceiling)
    assert all(isinstance(response.parsed, VerifyOutput) for response in responses)
    assert ceiling > INITIAL_IN_FLIGHT and server.max_in_flight == ceiling


def test_reset_durations_in_every_form_a_provider_writes() -> None:
    assert duration_s("6m0s") == 360.0
    assert duration_s("20ms") == 0.02
    assert duration_s("1h2m3.5s") == 3723.5
    assert duration_s("1.5") == 1.5
    assert duration_s("soon") is None and duration_s("2m soon") is None and duration_s(None) is None


def test_rate_signals_from_headers_of_any_case_and_litellm_copies() -> None:
    signal = rate_signal({"llm_provider-x-ratelimit-remaining-requests": "7", "x-ratelimit-reset-requests": "1s",
                          "retry-after-ms": "250", "retry-after": "3"})
    assert signal == RateSignal(retry_after_s=0.25, remaining_requests=7, requests_reset_s=1.0)
    assert rate_signal({"x-ratelimit-remaining-tokens": "x"}).remaining_tokens is None
    assert rate_signal(None) == rate_signal({"content-type": "application/json"}) == RateSignal()


def test_a_refusal_halves_once_per_round_and_its_retry_after_holds_every_new_call() -> None:
    async def scenario() -> None:
        pacer = Pacer(CEILING, adaptive=True)
        first, second = await pacer.acquire(), await pacer.acquire()
        before = pacer.limit
        pacer.refused(first, RateSignal(retry_after_s=30.0))
        pacer.refused(second, RateSignal(retry_after_s=30.0))  # sent before the decrease: the same storm
        assert pacer.limit == before / 2
        pacer.release()
        pacer.release()
        with pytest.raises(TimeoutError):  # held for the 30 s the server asked for, though slots are free
            await asyncio.wait_for(pacer.acquire(), timeout=0.2)
        assert pacer.in_flight == 0, "a waiter given up takes no slot"

    asyncio.run(scenario())


def test_an_answer_that_leaves_no_request_in_the_window_holds_new_calls_until_its_reset() -> None:
    async def scenario() -> None:
        pacer = Pacer(CEILING, adaptive=True)
        slot = await pacer.acquire()
        pacer.answered(slot, RateSignal(remaining_requests=0, requests_reset_s=30.0), tokens=10)
        pacer.release()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pacer.acquire(), timeout=0.2)
        # With requests left, the same answer adds a slot and holds nothing.
        open_pacer = Pacer(CEILING, adaptive=True)
        slot = await open_pacer.acquire()
        open_pacer.answered(slot, RateSignal(remaining_requests=5, requests_reset_s=30.0), tokens=10)
        open_pacer.release()
        assert open_pacer.limit == INITIAL_IN_FLIGHT + 1
        await asyncio.wait_for(open_pacer.acquire(), timeout=5)

    asyncio.run(scenario())


def test_fixed_concurrency_ignores_the_signals() -> None:
    async def scenario() -> None:
        pacer = Pacer(CEILING, adaptive=False)
        slot = await pacer.acquire()
        pacer.refused(slot, RateSignal(retry_after_s=30.0))
        pacer.release()
        assert pacer.limit == CEILING
        await asyncio.wait_for(pacer.acquire(), timeout=5)

    asyncio.run(scenario())
