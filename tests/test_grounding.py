"""The retromorphic check: evidence counts only when it is anchored in the context."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from faults import claims_in, fault_server
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
from typer.testing import CliRunner

import rt4chart
from rt4chart.cli.app import app
from rt4chart.method.grounding import ContextIndex, anchor_quotes
from rt4chart.method.tasks import VerifyOutput
from rt4chart.method.text import segment_context
from rt4chart.protocol import JudgeRequest, JudgeResponse
from rt4chart.types import AuditRecord, Evidence, Label

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
    anchoring = anchor_quotes(
        index, ["The trial lasts 14 days.", "made up", "The  trial lasts 14 days."]
    )
    assert [(e.text, e.match) for e in anchoring.evidence] == [("The trial lasts 14 days.", "exact")]
    assert anchoring.missing == ["made up"]


TYPOGRAPHIC = [
    "The earth\u2019s orbit takes 365 days.",
    "Tickets cost $5 \u2013 $10 \u2014 cash only\u2026",
    "He said \u201cwait\u201d\u00a0twice.",
    "\uff21\uff22\uff23 opened in 1990\uff0e",
]


@pytest.mark.parametrize(
    ("quote", "expected_text", "match"),
    [
        pytest.param("The earth's orbit takes 365 days.", TYPOGRAPHIC[0], "folded", id="apostrophe"),
        pytest.param("$5 - $10 - cash only...", "$5 \u2013 $10 \u2014 cash only\u2026", "folded", id="dashes-ellipsis"),
        pytest.param('said "wait" twice', "said \u201cwait\u201d\u00a0twice", "folded", id="curly-quotes-nbsp"),
        pytest.param("ABC opened in 1990.", TYPOGRAPHIC[3], "folded", id="full-width"),
        pytest.param("the EARTH'S orbit", "The earth\u2019s orbit", "case", id="case-last"),
        pytest.param("Tickets  cost", "Tickets cost", "whitespace", id="whitespace"),
        pytest.param("Tickets cost $5", "Tickets cost $5", "exact", id="exact"),
    ],
)
def test_typographic_quotes_anchor_to_the_contexts_own_text(quote: str, expected_text: str, match: str) -> None:
    index = _index(TYPOGRAPHIC)
    evidence = index.anchor(quote)
    assert evidence is not None
    assert (evidence.text, evidence.match) == (expected_text, match)
    assert_anchored(index, evidence)


@pytest.mark.parametrize(
    "quote",
    [
        "The earth's orbit takes 366 days.",  # a different fact, however it is spelt
        "Tickets cost $5 to $10",  # paraphrase
        "cash only.",  # one dot of the ellipsis character is not the ellipsis
        "cash only....",
        "$5 $10",
    ],
)
def test_folding_does_not_anchor_what_the_context_does_not_say(quote: str) -> None:
    assert _index(TYPOGRAPHIC).anchor(quote) is None


_TYPOGRAPHIC_PIECES = st.sampled_from(
    ["earth\u2019s", "earth's", "\u201cyes\u201d", '"yes"', "5\u201310", "5-10", "wait\u2026", "wait...",
     "Wait", "\u00a0", " ", "\n", "\u2014", "ABC", "\uff21\uff22\uff23", "x", "\u200b", "."]
)


def _fold(text: str) -> str:
    """The reference folding: what two texts must share for a folded match to be right."""
    folded = text.translate(str.maketrans({
        "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-", "\u2026": "...",
        "\u200b": "", "\uff21": "A", "\uff22": "B", "\uff23": "C",
    }))
    return re.sub(r"\s+", " ", folded).strip().lower()


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_TYPOGRAPHIC_PIECES, min_size=1, max_size=16).map(" ".join),
    st.lists(_TYPOGRAPHIC_PIECES, min_size=1, max_size=5).map("".join),
)
def test_folding_never_anchors_a_quote_to_text_it_does_not_match(context: str, quote: str) -> None:
    index = _index(context)
    evidence = index.anchor(quote)
    if evidence is None:
        # Nothing is missed either: a quote whose folded form is in the folded context is found
        # (up to the wrapping quotes and sentence markers the lookup strips).
        folded = _fold(quote.strip().strip("\"'\u201c\u201d\u2019 "))
        assert not folded or folded not in _fold(context) or "." in folded or "\u200b" in context
        return
    assert context[evidence.start : evidence.end] == evidence.text
    assert _fold(evidence.text) == _fold(quote.strip().strip("\"'\u201c\u201d\u2019 "))
    if evidence.match == "exact":
        assert evidence.text in quote


@pytest.mark.parametrize(
    ("quote", "slight"),
    [
        ("S", True),  # "quote any letter"
        ("14", True),
        ("The trial", True),  # one content word
        ("lasts 14 days", False),
        ("Yes!", False),  # a whole (short) context sentence
    ],
)
def test_evidence_needs_a_whole_sentence_or_several_content_words(quote: str, slight: bool) -> None:
    anchoring = anchor_quotes(_index([*PASSAGES, "Yes!"]), [quote])
    assert (anchoring.slight == [quote], bool(anchoring.evidence)) == (slight, not slight)
    assert (anchoring.problem is not None) is slight


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
) -> tuple[AuditRecord, RecordingBackend]:
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
    # The default (downgrade): an ungrounded verdict is baseless; kept, it stands untrusted.
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


ELIGIBILITY = "Only identity-verified new users are eligible for the free trial."
LOOSE_ELIGIBILITY = "Only identity-verified ... eligible for the free trial."
"""The eligibility sentence quoted loosely: the middle elided, as LLM judges often quote."""


@pytest.mark.parametrize("ungrounded", ["downgrade", "keep"])
def test_a_loosely_quoted_contradiction_is_baseless_when_downgraded_and_stands_when_kept(ungrounded: str) -> None:
    # Both eligibility claims are contradicted with the right sentence, quoted loosely in every call.
    contradictions = [
        {"claim": claim, "label": "contradicted", "evidence": [LOOSE_ELIGIBILITY]}
        for claim in ("All users can start", "Existing customers")
    ]
    report, _ = _example_with(contradictions, ungrounded=ungrounded)
    eligibility = report.claims[:2]
    assert all(not claim.grounded and claim.evidence == [] for claim in eligibility)
    if ungrounded == "downgrade":
        assert [claim.label for claim in eligibility] == [Label.BASELESS, Label.BASELESS]
        assert all(any("downgraded to baseless" in e for e in claim.errors) for claim in eligibility)
        # No claim is contradicted any more, so the answer is only baseless.
        assert report.label == Label.BASELESS
    else:
        assert [claim.label for claim in eligibility] == [Label.CONTRADICTED, Label.CONTRADICTED]
        assert not any("downgraded" in e for claim in eligibility for e in claim.errors)
        assert report.label == Label.CONTRADICTED
    assert report.hallucinated is True


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


# Against a real OpenAI-compatible server on 127.0.0.1 (tests/faults.py), through the real CLI.

_ASCII = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-",
                        "\u2026": "...", "\u00a0": " "})
TYPOGRAPHIC_SAMPLE = {
    "id": "typographic",
    "context": [
        "The earth\u2019s day lasts 24\u00a0hours.",
        "Tickets cost $5 \u2013 $10 \u2014 \u201ccash only\u201d\u2026",
    ],
    "answer": "The earth's day lasts 24 hours. Tickets cost $5 - $10.",
}


def _context_sentence_for(claim: str, user: str) -> str | None:
    """The numbered context sentence of a verify prompt that shares the claim's first words."""
    for line in user.splitlines():
        if line.startswith("[S") and "] " in line:
            sentence = line.split("] ", 1)[1]
            if sentence.translate(_ASCII).startswith(claim.split()[0]):
                return sentence
    return None


def llm_like(quote: Any) -> Any:
    """A reply function for a judge that decomposes into the answer's sentences and finds every claim
    entailed, quoting the context sentence it comes from, written by ``quote``."""

    def reply(body: dict[str, Any]) -> str:
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        if "Claims:\n" not in user:  # a decomposition request
            sentences = re.findall(r"^\[(\d+)\] (.+)$", user, flags=re.MULTILINE)
            return json.dumps({"sentences": [{"sentence": int(n), "claims": [text]} for n, text in sentences]})
        judgements = []
        for position, claim in enumerate(claims_in(body)):
            sentence = _context_sentence_for(claim, user.rsplit("Claims:\n", 1)[0])
            found = {"label": "entailed", "evidence": [quote(sentence)]} if sentence else {"label": "baseless"}
            judgements.append({"claim": position, "evidence": [], "rationale": "-", "confidence": 0.9, **found})
        return json.dumps({"judgements": judgements})

    return reply


def _verify_cli(tmp_path: Path, base_url: str, sample: dict[str, Any]) -> tuple[int, dict[str, Any], str]:
    inputs, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inputs.write_text(json.dumps(sample) + "\n", encoding="utf-8")
    result = CliRunner().invoke(app, [
        "verify", str(inputs), "--judge", "openai/fault", "--api-base", base_url, "--no-cache", "--out", str(out),
    ])
    [record] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return result.exit_code, record, result.output


def _evidence_spans(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for claim in record["claims"] for e in claim["evidence"]] + [
        e for claim in record["claims"] for vote in claim["votes"] for e in vote["evidence"]
    ]


@pytest.mark.parametrize(("quote", "expected_match"), [
    pytest.param(lambda sentence: sentence.translate(_ASCII), "folded", id="quotes-in-ascii"),
    pytest.param(lambda sentence: sentence, "exact", id="quotes-exactly"),
])
def test_a_faithful_answer_passes_whether_the_judge_quotes_in_ascii_or_exactly(
    tmp_path: Path, quote: Any, expected_match: str
) -> None:
    with fault_server(llm_like(quote)) as server:
        exit_code, record, output = _verify_cli(tmp_path, server.base_url, TYPOGRAPHIC_SAMPLE)
    assert exit_code == 0, output
    assert record["label"] == "entailed" and record["hallucinated"] is False
    assert [(c["label"], c["grounded"]) for c in record["claims"]] == [("entailed", True)] * 2
    context = "\n\n".join(TYPOGRAPHIC_SAMPLE["context"])
    spans = _evidence_spans(record)
    assert spans and all(context[e["start"] : e["end"]] == e["text"] for e in spans)
    assert {e["match"] for e in spans} == {expected_match}
    # No re-ask: one decomposition call, then per claim batch one local and one global call.
    assert len(server.requests) == record["usage"]["calls"] == 3


def test_a_judge_that_repeats_an_ungrounded_reply_makes_only_the_planned_calls(tmp_path: Path) -> None:
    # Every verify reply quotes text that is not in the context, the same way each time (a
    # temperature-0 model answering its re-ask with its earlier reply).
    sample = {"id": "one", "context": "The trial lasts 14 days.", "answer": "The trial lasts 14 days."}
    with fault_server(llm_like(lambda sentence: "The trial is free for a fortnight.")) as server:
        exit_code, record, output = _verify_cli(tmp_path, server.base_url, sample)
    # Decomposition, the local call and its re-ask, the global call and its re-ask: the plan's 5.
    assert len(server.requests) == record["usage"]["calls"] == 5, output
    [claim] = record["claims"]
    assert (claim["label"], claim["grounded"]) == ("baseless", False)
    assert any("still ungrounded after a re-ask" in error for error in claim["errors"])
    assert exit_code == 1
