"""The cascade judge: real stages (scripted, embedded, litellm on the fault server), real pipeline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, VerifyRequestFactory, require_embedded
from faults import Fault, claims_in, fault_server, judge_every_claim
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.cascade import CascadeBackend, CascadeStage, latency_budget
from rt4chart.judges.litellm import LiteLLMBackend
from rt4chart.judges.registry import JudgeProfile
from rt4chart.judges.scripted import ScriptedBackend, ScriptedRules
from rt4chart.method.tasks import VerifyOutput
from rt4chart.method.tasks import narrow_verify_request as narrow_request
from rt4chart.protocol import Backend, JudgeRequest, Message
from rt4chart.types import Label

CLAIMS = [
    "All users can start the free trial.",
    "The trial lasts 14 days.",
    "The trial includes priority phone support.",
]


def sure_about_duration(confidence: float = 0.95) -> ScriptedBackend:
    """A first stage that is sure only about the trial's duration (other claims: no confidence)."""
    rules = ScriptedRules.model_validate(
        {"verify": [{"claim": "lasts 14 days", "label": "entailed",
                     "evidence": ["The trial lasts 14 days."], "confidence": confidence}]}
    )
    return ScriptedBackend(rules, name="first")


def remote(base_url: str, **profile: Any) -> LiteLLMBackend:
    settings: dict[str, Any] = {"max_attempts": 1, "backoff_s": 0.0, "timeout_s": 5.0}
    settings.update(profile)
    return LiteLLMBackend(JudgeProfile(name="second", model="openai/second", **settings).litellm_settings(),
                          api_key="no-key", api_base=base_url)


def cascade(first: Backend, second: Backend, confidence: float = 0.9) -> CascadeBackend:
    return CascadeBackend([CascadeStage(first, confidence), CascadeStage(second, 0.0)])


def test_unsure_claims_go_to_the_next_stage_in_one_request(verify_request: VerifyRequestFactory) -> None:
    with fault_server(judge_every_claim("contradicted")) as server:
        response = asyncio.run(cascade(sure_about_duration(), remote(server.base_url)).complete(
            verify_request(CLAIMS)
        ))
    assert [claims_in(body) for body in server.requests] == [[CLAIMS[0], CLAIMS[2]]]
    assert isinstance(response.parsed, VerifyOutput)
    merged = {(j.claim, j.label) for j in response.parsed.judgements}
    assert merged == {(0, Label.CONTRADICTED), (1, Label.ENTAILED), (2, Label.CONTRADICTED)}
    second = f"second@{server.base_url}"  # a judge on a server of one's own is named with it
    assert response.judge == f"cascade:first@0.9,{second}"  # two stages decided this request
    assert response.claim_judges == [second, "first", second], "each claim names the stage that settled it"
    assert set(response.usage_by_judge) == {"first", second}
    assert response.usage_by_judge[second].calls == 1
    assert response.usage.calls == 2
    assert response.usage.prompt_tokens == sum(u.prompt_tokens for u in response.usage_by_judge.values())


def test_below_threshold_is_not_settled(verify_request: VerifyRequestFactory) -> None:
    with fault_server(judge_every_claim("baseless")) as server:
        asyncio.run(cascade(sure_about_duration(0.95), remote(server.base_url), confidence=0.99).complete(
            verify_request(CLAIMS)
        ))
    assert [claims_in(body) for body in server.requests] == [CLAIMS]


def test_a_stage_that_settles_everything_is_the_only_one_called(verify_request: VerifyRequestFactory) -> None:
    with fault_server(judge_every_claim("baseless")) as server:
        response = asyncio.run(cascade(sure_about_duration(), remote(server.base_url)).complete(
            verify_request([CLAIMS[1]])
        ))
    assert server.requests == []
    assert response.judge == "first" and set(response.usage_by_judge) == {"first"}


def test_a_reask_goes_whole_and_only_unsettled_claims_are_taken(verify_request: VerifyRequestFactory) -> None:
    request = verify_request(CLAIMS)
    follow_up = [Message(role="assistant", content="{}"), Message(role="user", content="For claims [0] ...")]
    reask = request.model_copy(update={"messages": request.messages + follow_up})
    assert narrow_request(reask, [0, 2]) == (reask, [0, 1, 2])
    with fault_server(judge_every_claim("contradicted")) as server:
        response = asyncio.run(cascade(sure_about_duration(), remote(server.base_url)).complete(reask))
    assert [claims_in(body) for body in server.requests] == [CLAIMS]
    assert isinstance(response.parsed, VerifyOutput)
    assert response.parsed.judgements[1].label == Label.ENTAILED  # kept from the first stage


def never_answering() -> ScriptedBackend:
    """A later stage that would answer only after an hour: only a latency budget ends its call."""
    return ScriptedBackend(ScriptedRules(default=Label.CONTRADICTED, latency_s=3600.0), name="slow")


def test_a_spent_latency_budget_keeps_the_unsure_judgements_and_records_them(
    verify_request: VerifyRequestFactory,
) -> None:
    async def judged() -> tuple[Any, Any]:
        with latency_budget(0.05) as budget:
            response = await cascade(sure_about_duration(0.5), never_answering()).complete(verify_request(CLAIMS))
        return response, budget

    response, budget = asyncio.run(judged())
    assert isinstance(response.parsed, VerifyOutput)
    # The first stage's judgements stand (the duration at 0.5, the others baseless without confidence) ...
    assert [(j.claim, j.label) for j in response.parsed.judgements] == [
        (0, Label.BASELESS), (1, Label.ENTAILED), (2, Label.BASELESS)
    ]
    assert response.claim_judges == ["first", "first", "first"]
    # ... and the budget says for each that the slow stage was not heard.
    assert set(budget.cut) == set(CLAIMS)
    assert "before slow judged it: first's entailed (confidence 0.5, under 0.9)" in budget.cut[CLAIMS[1]]


def test_a_budget_left_unspent_changes_nothing(verify_request: VerifyRequestFactory) -> None:
    async def judged() -> tuple[Any, Any]:
        with latency_budget(3600.0) as budget:
            slow_enough = ScriptedBackend(ScriptedRules(default=Label.CONTRADICTED), name="second")
            response = await cascade(sure_about_duration(), slow_enough).complete(verify_request(CLAIMS))
        return response, budget

    response, budget = asyncio.run(judged())
    assert response.claim_judges == ["second", "first", "second"] and budget.cut == {}


def test_narrowed_request_keeps_payload_and_messages_in_step(verify_request: VerifyRequestFactory) -> None:
    narrowed, originals = narrow_request(verify_request(CLAIMS), [2])
    assert originals == [2]
    assert narrowed.payload.claims == [CLAIMS[2]]  # type: ignore[union-attr]
    assert "[0] The trial includes priority phone support." in narrowed.messages[1].content
    assert CLAIMS[0] not in narrowed.messages[1].content


def test_a_failing_stage_passes_everything_on(verify_request: VerifyRequestFactory) -> None:
    with fault_server("{}", default=Fault("server_error")) as server:
        failing = remote(server.base_url)
        response = asyncio.run(cascade(failing, sure_about_duration()).complete(verify_request(CLAIMS)))
    assert isinstance(response.parsed, VerifyOutput) and len(response.parsed.judgements) == 3
    assert response.judge == "first"
    assert response.usage_by_judge[f"second@{server.base_url}"].calls == 1  # the failed call is still counted


def test_all_stages_failing_is_an_error(verify_request: VerifyRequestFactory) -> None:
    with fault_server("{}", default=Fault("server_error")) as server:
        response = asyncio.run(
            cascade(remote(server.base_url), remote(server.base_url)).complete(verify_request(CLAIMS))
        )
    assert response.parsed is None and response.error is not None and "InternalServerError" in response.error


def test_decompose_goes_to_the_first_stage_that_can(decompose_request: JudgeRequest) -> None:
    require_embedded()
    embedded = pytest.importorskip("rt4chart.judges.embedded.verifier").EmbeddedBackend()
    backend = cascade(embedded, sure_about_duration())
    assert not embedded.capabilities.can_write_text and backend.capabilities.can_write_text
    response = asyncio.run(backend.complete(decompose_request))
    assert response.judge == "first" and response.error is None


def test_pipeline_reports_usage_per_stage(tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"verify": [{"claim": "lasts 14 days", "label": "entailed",
                                             "evidence": ["The trial lasts 14 days."]}]}))
    out = tmp_path / "out.jsonl"
    with fault_server(judge_every_claim("baseless")) as server:
        result = CliRunner().invoke(app, [
            "verify", str(EXAMPLES / "free_trial.jsonl"), "--out", str(out), "--quiet", "--no-cache",
            "--judge", f"cascade:scripted:{rules}@0.9,openai/second", "--api-base", server.base_url,
        ])
        sent = [claims_in(body) for body in server.requests]
    assert result.exit_code == 1, result.output  # the answer is hallucinated
    record = json.loads(out.read_text().splitlines()[0])
    stages = record["usage_by_judge"]
    second = f"openai/second@{server.base_url}"
    assert len(stages) == 2 and second in stages
    assert sum(stage["calls"] for stage in stages.values()) == record["usage"]["calls"]
    assert stages[second]["calls"] == len(sent) > 0
    assert all("lasts 14 days" not in claim for claims in sent for claim in claims)
    duration = next(c for c in record["claims"] if "lasts 14 days" in c["text"])
    assert duration["label"] == "entailed"
    assert duration["judge"].startswith("scripted:"), "the claim names the stage that settled it"
    assert {c["judge"] for c in record["claims"] if c is not duration} == {second}
