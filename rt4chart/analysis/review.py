"""The review export format: one reviewer's verdict on one claim of an audit, one JSON object a line.

The HTML report's review controls write it (export), read it back (import), and ``rt4 agree
--reviews`` / ``rt4 calibrate`` read it. A review names its claim by the report's run key, the
record's id and the claim's 0-based index into ``record.claims``, and repeats the claim's text and
the judge's label so a file stays readable, and checkable, without the audit beside it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rt4chart.method.text import displayable
from rt4chart.records.io import read_json_lines, write_lines_atomically
from rt4chart.types import AuditRecord, ClaimVerdict

REVIEW_FORMAT: Literal["rt4chart.review/1"] = "rt4chart.review/1"
"""The value of every review's ``format`` field (a reader refuses any other)."""

JudgeLabel = Literal["entailed", "contradicted", "baseless"]
"""A judge's label on a claim."""
ReviewLabel = Literal["entailed", "contradicted", "baseless", "unsure"]
"""A reviewer's label on a claim: a judge's label, or ``unsure`` (excluded from every figure, counted)."""


class ClaimReview(BaseModel):
    """One reviewer's verdict on one claim of an audit (one line of a review file)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["rt4chart.review/1"] = REVIEW_FORMAT
    """Always ``rt4chart.review/1``: the format and its version."""
    run: str
    """The report's run key (:func:`run_key`; also part of the page's localStorage key): which audit
    the claim belongs to."""
    record_id: str
    """The audited record's id (:func:`record_id`: its ``id``, or ``line N`` for a record without one)."""
    claim_index: int = Field(ge=0)
    """0-based index of the claim in ``record.claims``."""
    claim: str
    """The claim's text, as the judge saw it (checked against the audit when one is given)."""
    judge_label: JudgeLabel | None
    """The judge's label on the claim when it was reviewed; ``None`` when the judge gave none."""
    label: ReviewLabel
    """The reviewer's label: the judge's one confirmed, another, or ``unsure``."""
    note: str | None = None
    """The reviewer's optional note."""
    inclusion_probability: float | None = Field(default=None, gt=0.0, le=1.0)
    """The probability that the review plan (``rt4 review-plan``) picked this claim; ``None`` when the
    claim was not picked by a plan (then figures describe the reviewed claims only)."""
    stratum: str | None = None
    """The plan's stratum of the claim (judge label and confidence band); ``None`` when not from a plan."""


class PlannedClaim(BaseModel):
    """One claim a review plan (``rt4 review-plan``) picked: what its report asks to review, and what
    every review of it carries into ``rt4 agree --reviews``."""

    run: str
    """The audit's run key (:func:`run_key`)."""
    record_id: str
    """The record's id (:func:`record_id`)."""
    claim_index: int = Field(ge=0)
    """0-based index of the claim in ``record.claims``."""
    claim: str
    """The claim's text."""
    judge_label: JudgeLabel
    """The judge's label on the claim (the plan's first stratification variable)."""
    confidence: float | None
    """The judge's confidence in that label (``score.p_unsupported`` read for the label's side, else
    ``confidence``); ``None`` when the judge states none."""
    stratum: str
    """The stratum the claim was drawn from: judge label and confidence band."""
    stratum_size: int = Field(ge=1)
    """Claims of the audit in the stratum."""
    stratum_sample: int = Field(ge=1)
    """Claims the plan drew from the stratum."""
    inclusion_probability: float = Field(gt=0.0, le=1.0)
    """``stratum_sample / stratum_size``: the probability that this plan picked the claim."""


class ReviewFileError(ValueError):
    """A review file with a line that is not a review (the message names the file and line)."""


def record_id(record: AuditRecord) -> str:
    """The id a review gives a record: its ``id``, or ``line N`` (its input line) when it has none;
    as the report shows it (:func:`rt4chart.method.text.displayable`: a control character made visible), so
    the page, the plan and ``rt4 agree`` name a record alike."""
    return displayable(record.id) if record.id is not None else f"line {record.line}"


def claim_text(claim: ClaimVerdict) -> str:
    """A claim's text as a review repeats it: as the report shows it (see :func:`record_id`)."""
    return displayable(claim.text)


def duplicate_record_ids(records: Iterable[AuditRecord]) -> set[str]:
    """The record ids (:func:`record_id`) that more than one record has: reviews cannot name their claims."""
    seen: set[str] = set()
    duplicated: set[str] = set()
    for record in records:
        key = record_id(record)
        (duplicated if key in seen else seen).add(key)
    return duplicated


def run_key(records: Sequence[AuditRecord]) -> str:
    """A key for one audit: the sha256 (16 hex digits) of its records' ids and claim texts.

    The same audit rendered twice (``rt4 verify --report``, then ``rt4 report``, or a review plan of
    it) gets the same key, so reviews kept in a browser under it carry over; another audit, or the
    same answers decomposed differently, gets another one.
    """
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps([record_id(record), [claim_text(claim) for claim in record.claims]]).encode())
    return digest.hexdigest()[:16]


def read_reviews(path: Path | str) -> list[ClaimReview]:
    """Every review of a review file (``-``: standard input), in order; blank lines are skipped.

    Raises :class:`ReviewFileError` naming the first line that is not JSON or not a review.
    """
    reviews: list[ClaimReview] = []
    for line in read_json_lines(path):
        if line.problem is not None:
            raise ReviewFileError(f"{path} line {line.number}: {line.problem}")
        try:
            reviews.append(ClaimReview.model_validate(line.value))
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "line"
            raise ReviewFileError(
                f"{path} line {line.number}: not an {REVIEW_FORMAT} review ({where}: {first['msg']})"
            ) from None
    return reviews


def write_reviews(path: Path, reviews: Iterable[ClaimReview]) -> None:
    """Write ``reviews`` to ``path``, one JSON object a line (replacing the file atomically)."""
    write_lines_atomically(path, (review.model_dump_json() for review in reviews))
