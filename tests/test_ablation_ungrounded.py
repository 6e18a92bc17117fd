"""The loose-quoting stand-in judge of evals/ablation_ungrounded.py: its misquotes fail the
retromorphic check, it is deterministic, and it quotes exactly on a re-ask for the claims it fixes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from fixtures.spine.judges import Rewrite, running_example_judge, running_example_sample

import rt4chart
from rt4chart.method.grounding import ContextIndex
from rt4chart.method.tasks import VerifyOutput
from rt4chart.method.text import segment_context
from rt4chart.protocol import JudgeRequest, JudgeResponse
from rt4chart.types import AuditRecord, JudgeScore, Label

SCRIPT = Path(__file__).resolve().parent.parent / "evals" / "ablation_ungrounded.py"


@pytest.fixture(scope="module")
def ablation() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ablation_ungrounded", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the module's annotations through it
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "sentence",
    [
        "Only identity-verified new users are eligible for the free trial.",  # short: articles dropped
        "The trial lasts 14 days.",  # a leading article only: its last two words swapped
        "Eligible users may request one seven-day extension.",
        "The free trial covers every premium feature of the Pro plan and all of its add-ons today.",  # elided
    ],
)
def test_a_loosened_quote_is_not_found_in_the_context(ablation: ModuleType, sentence: str) -> None:
    index = ContextIndex(*segment_context(sentence))
    loose = ablation.loosen(sentence)
    assert index.anchor(sentence) is not None
    assert loose != sentence and index.anchor(loose) is None


def _audit(ablation: ModuleType, misquoted: float, fixed_on_reask: float, ungrounded: str) -> AuditRecord:
    judge = ablation.LooseQuotingJudge(running_example_judge(), misquoted=misquoted, fixed_on_reask=fixed_on_reask)
    return rt4chart.verify(running_example_sample(), judge=judge, window=2, overlap=1, ungrounded=ungrounded)


def test_every_misquoted_claim_is_ungrounded_and_the_policy_decides_its_label(ablation: ModuleType) -> None:
    exact = _audit(ablation, misquoted=0.0, fixed_on_reask=0.0, ungrounded="downgrade")
    kept = _audit(ablation, misquoted=1.0, fixed_on_reask=0.0, ungrounded="keep")
    downgraded = _audit(ablation, misquoted=1.0, fixed_on_reask=0.0, ungrounded="downgrade")
    assert all(claim.grounded for claim in exact.claims)
    judged = [claim.index for claim in exact.claims if claim.label != Label.BASELESS]
    assert judged, "the running example has entailed and contradicted claims"
    assert all(not kept.claims[i].grounded for i in judged)
    assert [c.label for c in kept.claims] == [c.label for c in exact.claims]
    assert all(downgraded.claims[i].label == Label.BASELESS for i in judged)


def test_claims_fixed_on_the_reask_are_grounded_again(ablation: ModuleType) -> None:
    fixed = _audit(ablation, misquoted=1.0, fixed_on_reask=1.0, ungrounded="downgrade")
    exact = _audit(ablation, misquoted=0.0, fixed_on_reask=0.0, ungrounded="downgrade")
    assert all(claim.grounded for claim in fixed.claims)
    assert [c.label for c in fixed.claims] == [c.label for c in exact.claims]
    assert fixed.usage.calls > exact.usage.calls, "each misquote was re-asked"


def test_the_claims_misquoted_are_the_ones_the_claim_text_selects(ablation: ModuleType) -> None:
    exact = _audit(ablation, misquoted=0.0, fixed_on_reask=0.0, ungrounded="keep")
    half = _audit(ablation, misquoted=0.5, fixed_on_reask=0.0, ungrounded="keep")
    selected = [
        claim.index for claim in exact.claims
        if claim.label != Label.BASELESS and ablation._share(claim.text, "misquote") < 0.5
    ]
    assert [claim.index for claim in half.claims if not claim.grounded] == selected
    assert half == _audit(ablation, misquoted=0.5, fixed_on_reask=0.0, ungrounded="keep").model_copy(
        update={"usage": half.usage, "usage_by_judge": half.usage_by_judge}
    )


def _scored(p_unsupported: float) -> Rewrite:
    """A rewrite giving every verdict a scoring judge's numbers (threshold 0.2)."""

    def rewrite(request: JudgeRequest, response: JudgeResponse) -> JudgeResponse:
        if not isinstance(response.parsed, VerifyOutput):
            return response
        score = JudgeScore(p_unsupported=p_unsupported, threshold=0.2, decided_by="head")
        judgements = [j.model_copy(update={"score": score}) for j in response.parsed.judgements]
        return response.model_copy(update={"parsed": VerifyOutput(judgements=judgements)})

    return rewrite


@pytest.mark.parametrize(("p_unsupported", "misquoted"), [(0.05, False), (0.15, True), (0.35, True), (0.5, False)])
def test_the_unsure_stand_in_misquotes_near_the_threshold_only(
    ablation: ModuleType, p_unsupported: float, misquoted: bool
) -> None:
    inner = running_example_judge()
    inner.rewrite = _scored(p_unsupported)
    judge = ablation.LooseQuotingJudge(inner, fixed_on_reask=0.0, unsure=True)
    report = rt4chart.verify(running_example_sample(), judge=judge, window=2, overlap=1, ungrounded="keep")
    judged = [claim for claim in report.claims if claim.label != Label.BASELESS]
    assert judged
    assert all(claim.grounded is not misquoted for claim in judged)
