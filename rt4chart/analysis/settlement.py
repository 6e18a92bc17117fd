"""Which judge settled each claim, and how often it agreed with the gold claim labels.

In a cascade (``cascade:embedded@0.9,gpt-4o-mini``) every claim's final label comes from one
stage (``ClaimVerdict.judge``). ``rt4 eval`` reports, per judge, how many claims it settled and the
accuracy of its entailed / not-entailed call on the claims that align with gold spans (the
alignment of :func:`rt4chart.analysis.metrics.claim_gold_unsupported`), so a user sees what the free first
stage decided and how well.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from rt4chart.analysis.metrics import claim_gold_unsupported
from rt4chart.types import AuditRecord, Gold, Label


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
