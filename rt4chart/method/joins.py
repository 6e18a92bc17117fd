"""The method's joins of labels, one implementation each: OR over a claim's chunk votes, AND over
an answer's (or a sentence's) claims, and whether an answer is hallucinated.

Unknown labels (``None``: the judge could not be asked or did not answer) follow ARCHITECTURE.md's
contract: an unreachable judge is not a finding, so an unknown claim leaves the answer open unless
a known contradicted claim decides it.
"""

from __future__ import annotations

from collections.abc import Iterable

from rt4chart.types import Label


def or_join(labels: Iterable[Label | None]) -> Label | None:
    """Local join over chunk votes: contradicted > entailed > baseless.

    Votes without a label (skipped, or the judge call failed) are ignored. When votes were cast and
    none of them has a label, every judge call failed: the result is ``None`` (unknown), because an
    unreachable judge is not a finding. No votes at all (an empty context) is baseless.
    """
    labels = list(labels)
    present = set(labels)
    if Label.CONTRADICTED in present:
        return Label.CONTRADICTED
    if Label.ENTAILED in present:
        return Label.ENTAILED
    if Label.BASELESS in present or not labels:
        return Label.BASELESS
    return None


def and_join(labels: Iterable[Label | None]) -> Label | None:
    """Answer join over claims: contradicted > baseless > entailed.

    A claim the judge could not judge (``None``) leaves the answer's label open (``None``) unless a
    contradicted claim already decides it. An answer with no claim at all is baseless: nothing in it
    was verified, and an answer must never pass for having no claim.
    """
    present = set(labels)
    if not present:
        return Label.BASELESS
    if Label.CONTRADICTED in present:
        return Label.CONTRADICTED
    if None in present:
        return None
    if Label.BASELESS in present:
        return Label.BASELESS
    return Label.ENTAILED


def answer_hallucinated(labels: Iterable[Label | None]) -> bool | None:
    """Whether an answer is hallucinated: any claim contradicted or baseless; ``None`` when that is
    not known because some claims could not be judged and every known one is entailed."""
    present = set(labels)
    if not present or present & {Label.CONTRADICTED, Label.BASELESS}:
        return True
    return None if None in present else False
