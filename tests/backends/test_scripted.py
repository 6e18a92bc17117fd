"""The scripted judge: rules-file semantics, usage accounting, and clear errors for bad files."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Literal

import pytest

from rt4chart.judges.registry import JudgeConfigError, resolve_judge
from rt4chart.judges.scripted import ScriptedBackend, ScriptedRules
from rt4chart.method.tasks import TASKS, DecomposeInput, DecomposeOutput, VerifyInput, VerifyOutput
from rt4chart.method.text import segment_context
from rt4chart.protocol import Backend, JudgeRequest, Message
from rt4chart.types import Label

CONTEXT = ["The trial lasts 14 days.", "Eligible users may extend it once. Support is by email."]


def _backend(rules: dict[str, Any]) -> ScriptedBackend:
    return ScriptedBackend(ScriptedRules.model_validate(rules))


def _request(payload: DecomposeInput | VerifyInput) -> JudgeRequest:
    task: Literal["decompose", "verify"] = "decompose" if isinstance(payload, DecomposeInput) else "verify"
    return JudgeRequest(
        task=task,
        payload=payload,
        output_schema=TASKS[task].output_model,
        messages=[Message(role="user", content="x" * 40)],
        prompt_version="test",
    )


def _verify(
    backend: ScriptedBackend,
    claims: list[str],
    stage: Literal["local", "global"] = "global",
    sentence_ids: list[int] | None = None,
) -> VerifyOutput:
    _, sentences = segment_context(CONTEXT)
    view = sentences if sentence_ids is None else [sentences[i] for i in sentence_ids]
    response = asyncio.run(backend.complete(_request(VerifyInput(stage=stage, claims=claims, sentences=view))))
    assert isinstance(response.parsed, VerifyOutput) and response.error is None
    assert [j.claim for j in response.parsed.judgements] == list(range(len(claims)))
    return response.parsed


def _labels(output: VerifyOutput) -> list[Label]:
    return [judgement.label for judgement in output.judgements]


def test_first_matching_rule_wins_and_names_itself() -> None:
    backend = _backend({
        "verify": [
            {"claim": "14 days", "label": "entailed", "evidence": ["The trial lasts 14 days."]},
            {"claim": "lasts 14", "label": "contradicted"},
        ]
    })
    [judgement] = _verify(backend, ["The trial lasts 14 days."]).judgements
    assert (judgement.label, judgement.evidence, judgement.rationale) == (
        Label.ENTAILED, ["The trial lasts 14 days."], "scripted rule 0"
    )


def test_unmatched_claims_get_the_default() -> None:
    assert _labels(_verify(_backend({}), ["anything"])) == [Label.BASELESS]
    contrarian = _backend({"default": "contradicted", "verify": [{"claim": "email", "label": "entailed"}]})
    assert _labels(_verify(contrarian, ["Support is by email.", "Support is by phone."])) == [
        Label.ENTAILED, Label.CONTRADICTED
    ]


def test_stage_limits_a_rule_to_local_or_global_verification() -> None:
    backend = _backend({
        "verify": [
            {"claim": "extend", "stage": "local", "label": "baseless"},
            {"claim": "extend", "stage": "global", "label": "entailed"},
            {"claim": "email", "label": "contradicted"},
        ]
    })
    claims = ["Users may extend it.", "Support is by email."]
    assert _labels(_verify(backend, claims, stage="local")) == [Label.BASELESS, Label.CONTRADICTED]
    assert _labels(_verify(backend, claims, stage="global")) == [Label.ENTAILED, Label.CONTRADICTED]


@pytest.mark.parametrize(
    ("sentence_ids", "expected"),
    [([0], Label.BASELESS), ([1, 2], Label.ENTAILED), ([0, 1, 2], Label.ENTAILED)],
)
def test_chunk_contains_matches_the_text_in_view(sentence_ids: list[int], expected: Label) -> None:
    backend = _backend({"verify": [{"claim": "extend", "chunk_contains": "extend it once", "label": "entailed"}]})
    assert _labels(_verify(backend, ["Users may extend it."], "local", sentence_ids)) == [expected]


def test_chunk_contains_copied_from_the_context_matches_across_line_breaks() -> None:
    # Copied from the joined context, where passages are separated by a blank line.
    joined, _ = segment_context(CONTEXT)
    quote = joined[joined.index("14 days.") : joined.index("Eligible users") + len("Eligible users")]
    assert "\n" in quote
    backend = _backend({"verify": [{"claim": "trial", "chunk_contains": quote, "label": "entailed"}]})
    assert _labels(_verify(backend, ["The trial lasts 14 days."], "local", [0, 1])) == [Label.ENTAILED]
    assert _labels(_verify(backend, ["The trial lasts 14 days."], "local", [0])) == [Label.BASELESS]


def test_decompose_rules_and_the_one_claim_per_sentence_fallback() -> None:
    backend = _backend({
        "decompose": {
            "14 days": ["The trial lasts 14 days.", "The trial is free."],
            "trial": ["never used: an earlier key matched"],
            "Thanks": [],
        }
    })
    sentences = ["The free trial lasts 14 days.", "Support is by email.", "Thanks for asking!"]
    response = asyncio.run(backend.complete(_request(DecomposeInput(question=None, sentences=sentences))))
    assert isinstance(response.parsed, DecomposeOutput)
    assert [(e.sentence, e.claims) for e in response.parsed.sentences] == [
        (0, ["The trial lasts 14 days.", "The trial is free."]),
        (1, ["Support is by email."]),
        (2, []),
    ]


def test_every_call_is_counted_with_its_cost() -> None:
    backend = _backend({"cost_per_call": 0.25})
    request = _request(VerifyInput(stage="global", claims=["x"], sentences=[]))
    response = asyncio.run(backend.complete(request))
    assert response.usage.calls == 1 and response.usage.cost_usd == 0.25
    assert response.usage.prompt_tokens > 0 and response.usage.completion_tokens > 0
    assert response.judge == backend.name and response.cached is False
    assert backend.max_cost_usd(request) == 0.25
    assert _backend({}).max_cost_usd(request) == 0.0
    assert isinstance(backend, Backend)
    assert backend.capabilities.can_write_text


def test_a_rules_file_names_its_judge(tmp_path: Path) -> None:
    path = tmp_path / "mine.rules.json"
    path.write_text(json.dumps({"default": "entailed"}), encoding="utf-8")
    backend = ScriptedBackend.from_file(path)
    assert backend.name.startswith("scripted:mine.rules.json")
    assert resolve_judge(f"scripted:{path}").name == backend.name
    assert backend.rules.default == Label.ENTAILED


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        pytest.param(None, "No such file", id="missing-file"),
        pytest.param(b"{", "Expecting", id="not-json"),
        pytest.param(b"\xff\xfe{}", "utf-8", id="not-utf8"),
        pytest.param(b"[]", "ScriptedRules", id="not-an-object"),
        pytest.param(b'{"verify": [{"claim": "x", "label": "true"}]}', "label", id="unknown-label"),
        pytest.param(b'{"verify": [{"label": "entailed"}]}', "claim", id="rule-without-claim"),
        pytest.param(b'{"verify": [{"claim": "x", "label": "entailed", "stage": "both"}]}', "stage", id="bad-stage"),
        pytest.param(b'{"default": "maybe"}', "default", id="bad-default"),
        pytest.param(b'{"decompose": {"x": "one claim"}}', "decompose", id="claims-not-a-list"),
        pytest.param(b'{"cost_per_call": -1}', "cost_per_call", id="negative-cost"),
        pytest.param(
            b'{"verify": [{"claim": "x", "label": "entailed", "chunk_contain": "y"}]}',
            "chunk_contain",
            id="misspelt-rule-key",
        ),
        pytest.param(b'{"verfy": []}', "verfy", id="misspelt-top-level-key"),
    ],
)
def test_a_bad_rules_file_is_a_clear_error_naming_the_file(
    tmp_path: Path, content: bytes | None, problem: str
) -> None:
    path = tmp_path / "bad.rules.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=r"bad\.rules\.json") as raised:
        ScriptedBackend.from_file(path)
    assert problem in str(raised.value)
    with pytest.raises(JudgeConfigError, match=r"bad\.rules\.json"):
        resolve_judge(f"scripted:{path}")
