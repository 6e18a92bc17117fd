"""A calibrated threshold settling the final claim verdicts, and the unsupported score it reads.

A calibrated profile (``kind = "calibrated"``, written by ``rt4 calibrate``) settles each claim's
final verdict by its unsupported score (:func:`claim_unsupported_score`) against the
profile's threshold: :func:`settle_at_threshold`, the same rule the calibration's figures count.

In a conversation, a verdict resting only on the assistant's own earlier turns is settled as baseless
(:func:`settle_earlier_turns`).
"""

from __future__ import annotations

from collections.abc import Iterable

from rt4chart.types import ClaimVerdict, Label, Verdict


def claim_unsupported_score(claim: ClaimVerdict) -> float | None:
    """The judge's belief that a claim is not entailed: a scoring judge's calibrated
    ``score.p_unsupported``, else read from its label and confidence."""
    if claim.score is not None:
        return claim.score.p_unsupported
    if claim.confidence is None or claim.label is None:
        return None
    return claim.confidence if claim.label != Label.ENTAILED else 1.0 - claim.confidence


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


def settle_earlier_turns(verdicts: Iterable[ClaimVerdict], earlier_turns: Iterable[str]) -> None:
    """Settle, in place, the verdicts whose evidence lies only in the assistant's earlier turns (the
    documents named ``earlier_turns``): the assistant repeating itself grounds nothing, so such a
    claim is baseless (whether the judge found it entailed or contradicted there), marked
    ``earlier_turn_only``, with the judge's verdict kept in ``judge_verdict``."""
    turns = set(earlier_turns)
    for claim in verdicts:
        sources = [evidence.source.document for evidence in claim.evidence if evidence.source is not None]
        if claim.label in (None, Label.BASELESS) or not sources or not set(sources) <= turns:
            continue
        claim.judge_verdict = Verdict(**claim.verdict_fields())
        claim.rationale = (f"supported only by the assistant's earlier turn ({', '.join(dict.fromkeys(sources))}), "
                           f"which grounds nothing; the judge said {claim.label.value}")
        claim.label, claim.earlier_turn_only, claim.evidence = Label.BASELESS, True, []
