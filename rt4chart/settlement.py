"""Which judge settled each claim, how often it agreed with the gold claim labels, and a calibrated
threshold settling the final claim verdicts.

In a cascade (``cascade:embedded@0.9,gpt-4o-mini``) every claim's final label comes from one
stage (``ClaimVerdict.judge``). ``rt4 eval`` reports, per judge, how many claims it settled and the
accuracy of its entailed / not-entailed call on the claims that align with gold spans (the
alignment of :func:`rt4chart.metrics.claim_gold_unsupported`), so a user sees what the free first
stage decided and how well.

A calibrated profile (``kind = "calibrated"``, written by ``rt4 calibrate``) settles each claim's
final verdict by its unsupported score (:func:`rt4chart.metrics.claim_unsupported_score`) against the
profile's threshold: :func:`settle_at_threshold`, the same rule the calibration's figures count.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from rt4chart.metrics import claim_gold_unsupported, claim_unsupported_score
from rt4chart.types import AuditRecord, ClaimVerdict, Gold, Label, Verdict


class StageSettlement(BaseModel):
    """The claims one judge settled in an evaluation run."""

    claims: int = 0
    """Claims whose final label this judge gave."""
    aligned: int = 0
    """Of those, claims with a gold label (answer span known, gold spans or a clean answer)."""
    agreeing: int = 0
    """Aligned claims whose call (entailed or not) matches gold."""

    @property
    def accuracy(self) -> float | None:
        """Share of aligned claims that agree with gold; ``None`` when none aligned."""
        return self.agreeing / self.aligned if self.aligned else None

    def describe(self) -> str:
        """One line: ``412 claims, accuracy 0.931 on 400 aligned``."""
        accuracy = f"{self.accuracy:.3f}" if self.accuracy is not None else "n/a"
        return f"{self.claims} claims, accuracy {accuracy} on {self.aligned} aligned"


def settlement_by_judge(pairs: Iterable[tuple[AuditRecord, Gold | None]]) -> dict[str, StageSettlement]:
    """Per judge (``unjudged`` for claims without one), the claims it settled and its agreement with gold."""
    stages: dict[str, StageSettlement] = {}
    for report, gold in pairs:
        for claim in report.claims:
            stage = stages.setdefault(claim.judge or "unjudged", StageSettlement())
            stage.claims += 1
            expected = claim_gold_unsupported(claim, gold) if gold is not None else None
            if expected is None or claim.label is None:
                continue
            stage.aligned += 1
            stage.agreeing += (claim.label != Label.ENTAILED) == expected
    return dict(sorted(stages.items()))


def guard_decided(claim: ClaimVerdict) -> bool:
    """Whether a rule of the embedded verifier, not its score against a threshold, decided the claim
    (``score.decided_by`` other than ``head``): no threshold moves such a verdict."""
    return claim.score is not None and claim.score.decided_by != "head"


def settle_at_threshold(verdicts: Iterable[ClaimVerdict], threshold: float, judge: str) -> None:
    """Settle final claim verdicts by a calibrated threshold, in place.

    A claim is flagged (not entailed) when its unsupported score is at or above ``threshold``, as
    ``rt4 calibrate`` counts it. An entailed claim that is flagged becomes baseless (the judge's own
    verdict did not hold it unsupported, so it names no contradiction); a contradicted or baseless
    claim that is not flagged becomes entailed. Either way the claim keeps no evidence (the
    judge's quotes argued for the other side), its confidence becomes that of its new label
    (``1 -`` the judge's, so the unsupported score is unchanged), ``judge`` names the calibrated
    judge, and the judge's verdict stays in ``judge_verdict``. Claims without a label or a score, and
    claims a guard decided (:func:`guard_decided`), keep their verdict.
    """
    for claim in verdicts:
        score = claim_unsupported_score(claim)
        if claim.label is None or claim.confidence is None or score is None or guard_decided(claim):
            continue
        flagged = score >= threshold
        if flagged == (claim.label != Label.ENTAILED):
            continue
        settled = Label.BASELESS if flagged else Label.ENTAILED
        claim.judge_verdict = Verdict(**claim.verdict_fields())
        comparison = ">=" if flagged else "<"
        claim.rationale = (
            f"calibrated threshold: unsupported score {score:.4g} {comparison} {threshold:g}, so {settled.value}; "
            f"the judge said {claim.label.value} (confidence {claim.confidence:.4g})"
        )
        claim.label, claim.confidence = settled, round(1.0 - claim.confidence, 6)
        claim.evidence, claim.grounded, claim.judge = [], True, judge
