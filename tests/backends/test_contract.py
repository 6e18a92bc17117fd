"""The backend contract, once, against every backend: scripted, embedded, litellm, the
OpenAI-compatible transport (aiohttp) and a fleet on a real llama.cpp server, a raw httpx sender under
the transport policy, a cascade and a vote. SmolLM2 judges badly; only the protocol is asserted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from conftest import EXAMPLES, LLAMA_MAX_TOKENS, VerifyRequestFactory, require_embedded
from test_policy import HttpxSender

from rt4chart.judges.cascade import CascadeBackend, CascadeStage
from rt4chart.judges.fleet import FleetBackend, FleetMember, FleetRouting
from rt4chart.judges.litellm import LiteLLMBackend
from rt4chart.judges.openai_compat import OpenAICompatBackend
from rt4chart.judges.policy import CallSettings, PolicyBackend
from rt4chart.judges.registry import JudgeProfile
from rt4chart.judges.scripted import ScriptedBackend
from rt4chart.judges.serve import LocalServer
from rt4chart.judges.vote import VoteBackend
from rt4chart.method.tasks import DecomposeOutput, VerifyOutput
from rt4chart.options import AuditOptions
from rt4chart.protocol import Backend, Capabilities, CostEstimator, GenerationParams, JudgeRequest, JudgeResponse
from rt4chart.runs.engine import Pipeline
from rt4chart.types import Label, Sample, Usage

RULES = EXAMPLES / "free_trial.rules.json"
CLAIMS = ["All users can start the free trial.", "The trial lasts 14 days."]
BACKENDS = [
    "scripted", "embedded", "litellm-llamacpp", "openai-compat-llamacpp", "fleet-llamacpp", "policy-httpx-llamacpp",
    "cascade", "vote",
]
"""Every backend of the package, and a sender of a few lines under the transport policy."""


def _embedded() -> Backend:
    require_embedded()
    module = pytest.importorskip("rt4chart.judges.embedded.verifier", reason="the embedded verifier is not installed")
    backend: Backend = module.EmbeddedBackend()
    return backend


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    kind: str = request.param
    built: Backend
    if kind == "scripted":
        built = ScriptedBackend.from_file(RULES)
    elif kind == "embedded":
        built = _embedded()
    elif kind == "litellm-llamacpp":
        server: LocalServer = request.getfixturevalue("llamacpp")
        profile = JudgeProfile(name="smollm2", model="hosted_vllm/smollm2", max_attempts=2, backoff_s=0.01)
        built = LiteLLMBackend(profile.litellm_settings(), api_key="no-key", api_base=server.api_base)
    elif kind == "openai-compat-llamacpp":
        server = request.getfixturevalue("llamacpp")
        profile = JudgeProfile(name="smollm2", model="hosted_vllm/smollm2", max_attempts=2, backoff_s=0.01)
        built = OpenAICompatBackend(profile.openai_compat_settings(), api_key="no-key", api_base=server.api_base)
    elif kind == "fleet-llamacpp":
        server = request.getfixturevalue("llamacpp")
        profile = JudgeProfile(name="smollm2-fleet", model="hosted_vllm/smollm2", max_attempts=2, backoff_s=0.01)
        # Two deployments of one server: the router picks one per attempt, as over several hosts.
        members = [FleetMember("hosted_vllm/smollm2", server.api_base, "no-key") for _ in range(2)]
        built = FleetBackend(profile.litellm_settings(), members, FleetRouting())
    elif kind == "policy-httpx-llamacpp":
        server = request.getfixturevalue("llamacpp")
        built = PolicyBackend(HttpxSender(server.api_base, key="no-key"), CallSettings(max_attempts=2, backoff_s=0.01))
    elif kind == "vote":
        built = VoteBackend([ScriptedBackend.from_file(RULES), _embedded(), ScriptedBackend.from_file(RULES)])
    else:
        built = CascadeBackend([CascadeStage(_embedded(), 0.9), CascadeStage(ScriptedBackend.from_file(RULES), 0.0)])
    yield built
    asyncio.run(built.aclose())


def short(request: JudgeRequest) -> JudgeRequest:
    """Keep SmolLM2's replies short; other backends ignore the cap."""
    return request.model_copy(update={"params": GenerationParams(max_tokens=LLAMA_MAX_TOKENS)})


def assert_well_formed(response: JudgeResponse, backend: Backend) -> None:
    """What every response promises, whatever the judge."""
    assert isinstance(response, JudgeResponse)
    assert (response.parsed is None) == (response.error is not None), "exactly one of parsed / error"
    assert response.judge, "every response names its judge"
    assert response.usage.calls >= 1
    assert response.usage.prompt_tokens >= 0 and response.usage.completion_tokens >= 0
    assert response.usage.cost_usd >= 0.0 and response.latency_s >= 0.0
    if response.usage_by_judge:
        assert sum(response.usage_by_judge.values(), Usage()).calls == response.usage.calls


def test_identity(backend: Backend) -> None:
    assert isinstance(backend, Backend)
    assert isinstance(backend.name, str) and backend.name
    assert isinstance(backend.capabilities, Capabilities)


def test_verify(backend: Backend, verify_request: VerifyRequestFactory) -> None:
    response = asyncio.run(backend.complete(short(verify_request(CLAIMS))))
    assert_well_formed(response, backend)
    if response.parsed is not None:
        assert isinstance(response.parsed, VerifyOutput)
        for judgement in response.parsed.judgements:
            assert isinstance(judgement.label, Label)
            assert judgement.confidence is None or 0.0 <= judgement.confidence <= 1.0
        # Positions refer to the request's claims (a judge may skip one; the pipeline re-asks it).
        assert {j.claim for j in response.parsed.judgements} <= set(range(len(CLAIMS)))


def test_decompose(backend: Backend, decompose_request: JudgeRequest) -> None:
    response = asyncio.run(backend.complete(decompose_request))
    assert_well_formed(response, backend)
    if not backend.capabilities.can_write_text:
        assert response.parsed is None  # declined as data, not raised
    elif response.parsed is not None:
        assert isinstance(response.parsed, DecomposeOutput)


def test_worst_case_cost(backend: Backend, verify_request: VerifyRequestFactory) -> None:
    if isinstance(backend, CostEstimator):
        assert backend.max_cost_usd(verify_request(CLAIMS)) >= 0.0


def test_audit_through_the_pipeline(backend: Backend, free_trial: Sample) -> None:
    # The answer's first sentence only: the contract is the pipeline's plumbing through each backend (every
    # stage, usage booked per judge), not SmolLM2's verdicts, and each claim costs llama.cpp seconds of
    # generation (the whole answer took about 100 s a backend in CI).
    first_sentence = free_trial.model_copy(update={"answer": free_trial.answer.split(". ")[0] + "."})
    options = AuditOptions(decomposer="rules", max_tokens=LLAMA_MAX_TOKENS)
    report = asyncio.run(Pipeline(backend, options).verify_sample(first_sentence))
    # Every claim has a verdict, or the judge failure that left it open (SmolLM2 may overrun its
    # token cap); an open claim makes the record incomplete, never a finding.
    assert report.claims and all(claim.label is not None or claim.errors for claim in report.claims)
    assert report.incomplete == any(claim.label is None for claim in report.claims)
    assert report.label is not None or report.incomplete
    assert report.usage.calls >= 2  # local and global verification at least
    assert sum(report.usage_by_judge.values(), Usage()).calls == report.usage.calls


def test_close_twice(backend: Backend) -> None:
    asyncio.run(backend.aclose())
    asyncio.run(backend.aclose())
