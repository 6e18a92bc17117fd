"""The retromorphic check: evidence counts only when it is anchored in the context."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fixtures.spine.judges import (
    RecordingBackend,
    Rewrite,
    example_rules,
    is_reask,
    running_example_judge,
    running_example_sample,
    scripted,
)
from hypothesis import given, settings
from hypothesis import strategies as st

import rt4chart
from rt4chart.backends.base import JudgeRequest, JudgeResponse
from rt4chart.grounding import ContextIndex, anchor_quotes
from rt4chart.tasks import VerifyOutput
from rt4chart.text import segment_context
from rt4chart.types import Evidence, Label, Report

PASSAGES = [
    "The free trial covers every premium feature.  Only verified users\nare eligible.",
    "The trial lasts 14 days. Eligible users may extend it once.",
]


def _index(context: str | list[str] = PASSAGES) -> ContextIndex:
    return ContextIndex(*segment_context(context))


def assert_anchored(index: ContextIndex, evidence: Evidence) -> None:
    """The evidence is its own slice of the context and names exactly the sentences it overlaps."""
    assert index.text[evidence.start : evidence.end] == evidence.text
    assert evidence.sentence_ids == [
        s.index for s in index.sentences if s.start < evidence.end and s.end > evidence.start
    ]
    assert evidence.sentence_ids, "evidence outside every sentence"


@pytest.mark.parametrize(
    ("quote", "expected_text", "sentence_ids"),
    [
        pytest.param("The trial lasts 14 days.", "The trial lasts 14 days.", [3], id="exact"),
        pytest.param("lasts 14 days", "lasts 14 days", [3], id="part-of-a-sentence"),
        pytest.param(
            "Only verified users are eligible.",
            "Only verified users\nare eligible.",
            [1, 2],  # a line break inside a passage is a sentence boundary
            id="newline-in-context",
        ),
        pytest.param(
            "feature. Only verified",
            "feature.  Only verified",
            [0, 1],
            id="double-space-in-context-spans-two-sentences",
        ),
        pytest.param(
            "are eligible. The trial lasts",
            "are eligible.\n\nThe trial lasts",
            [2, 3],
            id="across-passages",
        ),
        pytest.param("  The   trial\tlasts\n14 days. ", "The trial lasts 14 days.", [3], id="messy-quote"),
        pytest.param('"The trial lasts 14 days."', "The trial lasts 14 days.", [3], id="wrapped-in-quotes"),
        pytest.param("[S3] The trial lasts 14 days.", "The trial lasts 14 days.", [3], id="sentence-marker"),
        pytest.param(
            "[S3] The trial lasts 14 days. [S4] Eligible users",
            "The trial lasts 14 days. Eligible users",
            [3, 4],
            id="two-sentence-markers",
        ),
    ],
)
def test_quotes_anchor_to_exact_offsets_and_sentence_ids(
    quote: str, expected_text: str, sentence_ids: list[int]
) -> None:
    index = _index()
    evidence = index.anchor(quote)
    assert evidence is not None
    assert (evidence.text, evidence.sentence_ids) == (expected_text, sentence_ids)
    assert_anchored(index, evidence)


@pytest.mark.parametrize(
    "quote",
    ["The trial lasts 15 days.", "", "   ", '""', "[S1]", "lasts  14  weeks"],
)
def test_quotes_not_in_the_context_do_not_anchor(quote: str) -> None:
    assert _index().anchor(quote) is None


def test_within_restricts_anchoring_to_the_chunk() -> None:
    index = _index(["Alpha one. Beta two.", "Alpha one. Gamma three."])
    first, second = index.sentences[0], index.sentences[2]
    assert index.anchor("Gamma three.", within=(0, index.sentences[1].end)) is None
    in_second_passage = index.anchor("Alpha one.", within=(second.start, index.sentences[3].end))
    assert in_second_passage is not None
    assert (in_second_passage.start, in_second_passage.sentence_ids) == (second.start, [2])
    anywhere = index.anchor("Alpha one.")
    assert anywhere is not None and anywhere.start == first.start


def test_anchor_quotes_reports_missing_quotes_and_drops_duplicates() -> None:
    index = _index()
    evidence, missing = anchor_quotes(
        index, ["The trial lasts 14 days.", "made up", "The  trial lasts 14 days."]
    )
    assert [e.text for e in evidence] == ["The trial lasts 14 days."]
    assert missing == ["made up"]


_CONTEXT_PIECES = st.sampled_from(
    ["The trial", "lasts", "14 days.", "Dr. Smith", "agreed.", "3.5%", "\n", "\n\n", "  ", "\t", "Yes!"]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_CONTEXT_PIECES, min_size=1, max_size=20).map(" ".join), st.data())
def test_any_slice_of_the_context_anchors_back_to_itself(context: str, data: st.DataObject) -> None:
    index = _index(context)
    start = data.draw(st.integers(0, len(context) - 1))
    end = data.draw(st.integers(start + 1, len(context)))
    # The judge may re-space the quote; matching ignores how whitespace is written.
    quote = re.sub(r"\s+", " ", context[start:end])
    evidence = index.anchor(quote)
    if not quote.strip() or not index.sentences:
        return
    assert evidence is not None
    assert context[evidence.start : evidence.end] == evidence.text
    assert re.sub(r"\s+", " ", evidence.text) == quote.strip()


def _example_with(
    verify_rules: list[dict[str, Any]], rewrite: Rewrite | None = None, ungrounded: str = "downgrade"
) -> tuple[Report, RecordingBackend]:
    """The running example, decomposed as in the shipped rules, verified by ``verify_rules``."""
    backend = scripted(example_rules(verify=verify_rules))
    backend.rewrite = rewrite
    report = rt4chart.verify(running_example_sample(), judge=backend, window=2, overlap=1, ungrounded=ungrounded)
    return report, backend


def test_every_evidence_item_of_the_running_example_is_anchored() -> None:
    report = rt4chart.verify(running_example_sample(), judge=running_example_judge(), window=2, overlap=1)
    index = _index(running_example_sample().context)
    votes_evidence = [e for claim in report.claims for vote in claim.votes for e in vote.evidence]
    claims_evidence = [e for claim in report.claims for e in claim.evidence]
    assert len(votes_evidence) == 4 and len(claims_evidence) == 6
    for item in votes_evidence + claims_evidence:
        assert_anchored(index, item)
    spanning = report.claims[3].evidence
    assert [e.sentence_ids for e in spanning] == [[1], [2], [3]], "global evidence may span chunks"


SENTENCE_3 = "Eligible users may request one seven-day extension of the trial."


@pytest.mark.parametrize("ungrounded", ["downgrade", "keep"])
def test_a_local_quote_from_outside_the_chunk_is_rejected_and_reasked_once(ungrounded: str) -> None:
    # Chunk 0 holds s0 and s1; the rule quotes s3, which only the global stage may cite.
    report, backend = _example_with([
        {"claim": "lasts 14 days", "stage": "local", "chunk_contains": "premium feature",
         "label": "entailed", "evidence": [SENTENCE_3]},
        {"claim": "lasts 14 days", "stage": "global", "label": "entailed", "evidence": [SENTENCE_3]},
    ], ungrounded=ungrounded)
    claim = report.claims[2]
    vote = claim.votes[0]
    # The paper's rule (the default): an ungrounded verdict is baseless; kept, it stands untrusted.
    label = Label.BASELESS if ungrounded == "downgrade" else Label.ENTAILED
    assert (vote.label, vote.grounded, vote.evidence) == (label, False, [])
    assert vote.error is not None and "not found" in vote.error and "re-ask" in vote.error
    assert ("downgraded to baseless" in vote.error) is (ungrounded == "downgrade")
    asked = [r for r in backend.requests_for_claim(claim.text, "local") if r.payload.chunk == 0]
    assert [is_reask(r) for r in asked] == [False, True]
    # The same quote is fine against the full context: the final verdict is grounded.
    assert claim.grounded and claim.label == Label.ENTAILED
    assert [e.sentence_ids for e in claim.evidence] == [[3]]


@pytest.mark.parametrize("ungrounded", ["downgrade", "keep"])
def test_an_unfound_quote_is_reasked_once_then_marked_ungrounded(ungrounded: str) -> None:
    report, backend = _example_with([
        {"claim": "phone support", "stage": "global", "label": "entailed",
         "evidence": ["Phone support is included."]},
    ], ungrounded=ungrounded)
    claim = report.claims[4]
    if ungrounded == "keep":
        assert claim.label == Label.ENTAILED, "the label stands; the output says it is not trusted"
    else:
        assert claim.label == Label.BASELESS and any("downgraded to baseless" in e for e in claim.errors)
    assert claim.grounded is False and claim.evidence == []
    assert any("not found in the context" in e and "still ungrounded after a re-ask" in e for e in claim.errors)
    assert [is_reask(r) for r in backend.requests_for_claim(claim.text, "global")] == [False, True]
    assert report.usage.calls == len(backend.requests)


def test_an_entailed_verdict_without_quotes_is_ungrounded() -> None:
    report, _ = _example_with([{"claim": "phone support", "stage": "global", "label": "entailed"}])
    claim = report.claims[4]
    assert claim.grounded is False
    assert any("no evidence quoted" in e for e in claim.errors)


def _quote_verbatim_when_reasked(request: JudgeRequest, response: JudgeResponse) -> JudgeResponse:
    """A judge that answers a re-ask with a verbatim quote."""
    if not is_reask(request) or not isinstance(response.parsed, VerifyOutput):
        return response
    fixed = [j.model_copy(update={"evidence": [SENTENCE_3]}) for j in response.parsed.judgements]
    return response.model_copy(update={"parsed": VerifyOutput(judgements=fixed)})


def test_a_reask_that_quotes_verbatim_makes_the_verdict_grounded() -> None:
    report, _ = _example_with(
        [{"claim": "phone support", "stage": "global", "label": "entailed",
          "evidence": ["paraphrase of the extension rule"]}],
        rewrite=_quote_verbatim_when_reasked,
    )
    claim = report.claims[4]
    assert claim.grounded and not claim.errors
    assert [(e.text, e.sentence_ids) for e in claim.evidence] == [(SENTENCE_3, [3])]


def test_baseless_verdicts_carry_no_evidence_and_are_never_reasked() -> None:
    # The judge quotes something (even a made-up quote) while saying baseless: no evidence is kept.
    report, backend = _example_with([
        {"claim": "phone support", "label": "baseless", "evidence": [SENTENCE_3, "not in the context"]},
    ])
    claim = report.claims[4]
    assert claim.label == Label.BASELESS and claim.grounded and not claim.errors
    assert claim.evidence == [] and all(v.evidence == [] for v in claim.votes)
    assert not any(is_reask(r) for r in backend.requests)
    assert all(other.evidence == [] for other in report.claims if other.label == Label.BASELESS)
