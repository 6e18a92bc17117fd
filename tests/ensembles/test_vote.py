"""The vote judge: real members (scripted, litellm on the fault server), the tie rule, the CLI."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, VerifyRequestFactory
from faults import Fault, fault_server
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.litellm import LiteLLMBackend
from rt4chart.judges.registry import JudgeConfigError, JudgeProfile, resolve_judge
from rt4chart.judges.scripted import ScriptedBackend, ScriptedRules
from rt4chart.judges.vote import VoteBackend, majority
from rt4chart.method.tasks import VerifyOutput
from rt4chart.types import Label

CLAIMS = [
    "All users can start the free trial.",
    "The trial lasts 14 days.",
    "The trial includes priority phone support.",
]
QUOTE = {
    "contradicted": ["Only identity-verified new users are eligible for the free trial."],
    "entailed": ["The trial lasts 14 days."],
    "baseless": [],
}


def member(name: str, labels: list[str]) -> ScriptedBackend:
    """A scripted judge that gives ``labels[i]`` to ``CLAIMS[i]``."""
    rules = ScriptedRules.model_validate({
        "verify": [
            {"claim": claim, "label": label, "evidence": QUOTE[label]}
            for claim, label in zip(CLAIMS, labels, strict=True)
        ]
    })
    return ScriptedBackend(rules, name=name)


def labels_of(response: Any) -> list[Label]:
    assert isinstance(response.parsed, VerifyOutput)
    return [j.label for j in sorted(response.parsed.judgements, key=lambda j: j.claim)]


@pytest.mark.parametrize(
    ("votes", "winner"),
    [
        (["entailed", "entailed", "contradicted"], Label.ENTAILED),  # a majority beats caution
        (["entailed", "baseless"], Label.BASELESS),
        (["entailed", "contradicted"], Label.CONTRADICTED),
        (["baseless", "contradicted"], Label.CONTRADICTED),
        (["entailed", "baseless", "contradicted"], Label.CONTRADICTED),
        (["baseless", "baseless", "contradicted", "contradicted", "entailed"], Label.CONTRADICTED),
    ],
)
def test_majority_and_the_tie_rule(votes: list[str], winner: Label) -> None:
    assert majority([Label(v) for v in votes]) == winner


def test_every_claim_is_decided_by_its_majority_and_every_vote_is_recorded(
    verify_request: VerifyRequestFactory,
) -> None:
    vote = VoteBackend([
        member("a", ["contradicted", "entailed", "baseless"]),
        member("b", ["entailed", "entailed", "entailed"]),
        member("c", ["contradicted", "baseless", "entailed"]),
    ])
    # Claim 2 is entailed only by b and c: b's judgement (rule 2 of its file) is the one kept.
    response = asyncio.run(vote.complete(verify_request(CLAIMS)))
    assert labels_of(response) == [Label.CONTRADICTED, Label.ENTAILED, Label.ENTAILED]
    assert isinstance(response.parsed, VerifyOutput)
    first = response.parsed.judgements[0]
    assert first.rationale == "votes: a=contradicted, b=entailed, c=contradicted; scripted rule 0"
    assert first.evidence == QUOTE["contradicted"] and first.confidence == pytest.approx(2 / 3)
    third = response.parsed.judgements[2]
    assert third.rationale == "votes: a=baseless, b=entailed, c=entailed; scripted rule 2"
    assert third.evidence == QUOTE["entailed"], "the first member holding the winning label speaks"
    assert response.judge == "vote:a,b,c" and response.claim_judges is None
    assert set(response.usage_by_judge) == {"a", "b", "c"}
    assert all(usage.calls == 1 for usage in response.usage_by_judge.values())
    assert response.usage.calls == 3


def test_a_votes_judgement_carries_its_share_and_no_members_score(verify_request: VerifyRequestFactory) -> None:
    pytest.importorskip("tokenizers", reason="the embedded verifier (the embedded extra)")
    embedded = resolve_judge("embedded")
    alone = asyncio.run(embedded.complete(verify_request(CLAIMS)))
    assert isinstance(alone.parsed, VerifyOutput) and all(j.score is not None for j in alone.parsed.judgements)
    agreeing = [j.label.value for j in sorted(alone.parsed.judgements, key=lambda j: j.claim)]
    vote = VoteBackend([embedded, member("a", agreeing), member("b", ["entailed"] * len(CLAIMS))])
    response = asyncio.run(vote.complete(verify_request(CLAIMS)))
    assert isinstance(response.parsed, VerifyOutput)
    for judgement in response.parsed.judgements:
        # The embedded member speaks first wherever it holds the winning label, yet the vote decided:
        # what rt4 calibrate reads is the vote's share, not the member's probability.
        assert judgement.score is None
        ballots = [agreeing[judgement.claim], agreeing[judgement.claim], "entailed"]
        assert judgement.confidence == pytest.approx(ballots.count(judgement.label.value) / 3)


def test_a_failing_member_abstains(verify_request: VerifyRequestFactory) -> None:
    with fault_server("{}", default=Fault("server_error")) as server:
        failing = LiteLLMBackend(
            JudgeProfile(
                name="down", model="openai/down", max_attempts=1, backoff_s=0.0, timeout_s=5.0
            ).litellm_settings(),
            api_key="no-key", api_base=server.base_url,
        )
        vote = VoteBackend([failing, member("a", ["entailed", "entailed", "baseless"]),
                            member("b", ["contradicted", "entailed", "entailed"])])
        response = asyncio.run(vote.complete(verify_request(CLAIMS)))
    # Two votes per claim: ties go to the cautious label.
    assert labels_of(response) == [Label.CONTRADICTED, Label.ENTAILED, Label.BASELESS]
    assert isinstance(response.parsed, VerifyOutput)
    assert response.parsed.judgements[0].rationale.startswith(f"votes: down@{server.base_url}=abstained, a=entailed")
    assert response.usage_by_judge[f"down@{server.base_url}"].calls == 1


def test_all_members_failing_is_an_error(verify_request: VerifyRequestFactory) -> None:
    with fault_server("{}", default=Fault("server_error")) as server:
        settings = JudgeProfile(
            name="down", model="openai/down", max_attempts=1, backoff_s=0.0, timeout_s=5.0
        ).litellm_settings()
        vote = VoteBackend([LiteLLMBackend(settings, api_key="no-key", api_base=server.base_url) for _ in range(2)])
        response = asyncio.run(vote.complete(verify_request(CLAIMS)))
    assert response.parsed is None and response.error and "InternalServerError" in response.error


def test_resolve_judge_builds_a_vote_and_refuses_bad_specs(tmp_path: Path) -> None:
    rules = EXAMPLES / "free_trial.rules.json"
    backend = resolve_judge(f"vote:scripted:{rules},scripted:{rules}")
    assert isinstance(backend, VoteBackend) and len(backend.members) == 2
    assert backend.name.startswith("vote:scripted:free_trial.rules.json#")
    for bad in (f"vote:scripted:{rules}", f"vote:scripted:{rules},", f"vote:scripted:{rules},cascade:a,b",
                f"vote:scripted:{rules},scripted:{tmp_path / 'missing.json'}"):
        with pytest.raises(JudgeConfigError):
            resolve_judge(bad)


def test_vote_through_the_cli(tmp_path: Path) -> None:
    rules = EXAMPLES / "free_trial.rules.json"
    copy = tmp_path / "copy.rules.json"
    copy.write_text(rules.read_text(encoding="utf-8"), encoding="utf-8")
    everything = tmp_path / "flag.rules.json"
    everything.write_text(json.dumps({"default": "baseless"}), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(app, [
        "verify", str(EXAMPLES / "free_trial.jsonl"), "--judge",
        f"vote:scripted:{rules},scripted:{everything},scripted:{copy}", "--no-cache", "-q", "--out", str(out),
    ], catch_exceptions=False)
    assert result.exit_code == 1, result.output
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["judge"].startswith("vote:scripted:free_trial.rules.json#")
    members = sorted(name.split("#")[0] for name in record["usage_by_judge"])
    assert members == ["scripted:copy.rules.json", "scripted:flag.rules.json", "scripted:free_trial.rules.json"]
    calls = {name.split("#")[0]: usage["calls"] for name, usage in record["usage_by_judge"].items()}
    # Every member is asked every verify request; the first one also decomposed the answer.
    assert calls["scripted:copy.rules.json"] == calls["scripted:flag.rules.json"] > 0
    assert calls["scripted:free_trial.rules.json"] == calls["scripted:copy.rules.json"] + 1
    labels = [claim["label"] for claim in record["claims"]]
    assert labels[:3] == ["contradicted", "contradicted", "entailed"]  # two of three members agree
    assert all(claim["rationale"].startswith("votes: ") for claim in record["claims"])
