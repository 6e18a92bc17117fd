"""The embedded offline verifier: real model, real pipeline, no network."""

from __future__ import annotations

import asyncio

import pytest
from conftest import require_embedded

from rt4chart.judges.embedded.verifier import VERSION, EmbeddedBackend, load_encoder
from rt4chart.method.tasks import ClaimJudgement, DecomposeInput, DecomposeOutput, VerifyInput, VerifyOutput
from rt4chart.method.text import segment_context
from rt4chart.options import AuditOptions
from rt4chart.protocol import Backend, JudgeRequest
from rt4chart.runs.engine import Pipeline
from rt4chart.types import AuditRecord, Label, Sample

require_embedded()

CONTEXT = [
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris. "
    "It was completed in 1889 as the entrance arch to the World's Fair. "
    "The tower is 330 metres tall and was the tallest man-made structure in the world for 41 years.",
    "Gustave Eiffel's company designed and built the tower. "
    "The tower has three levels for visitors, with restaurants on the first and second levels. "
    "The top level's upper platform is 276 metres above the ground.",
]


@pytest.fixture(scope="module")
def backend() -> EmbeddedBackend:
    return EmbeddedBackend()


def audit(backend: EmbeddedBackend, answer: str, question: str | None = None) -> AuditRecord:
    sample = Sample(id="s", context=CONTEXT, question=question, answer=answer)
    pipeline = Pipeline(backend, AuditOptions(decomposer="auto", window=2, overlap=1))
    return asyncio.run(pipeline.verify_sample(sample))


def only_claim_label(report: AuditRecord) -> Label | None:
    assert len(report.claims) == 1
    return report.claims[0].label


def test_implements_the_backend_contract(backend: EmbeddedBackend) -> None:
    assert isinstance(backend, Backend)
    assert backend.name == f"embedded#{VERSION}", "the name carries the verifier's version"
    assert backend.capabilities.can_write_text is False


def test_numeric_contradiction_is_contradicted(backend: EmbeddedBackend) -> None:
    report = audit(backend, "The Eiffel Tower was completed in 1901 as the entrance arch to the World's Fair.")
    assert only_claim_label(report) == Label.CONTRADICTED
    assert report.hallucinated is True
    assert "1889" in report.claims[0].evidence[0].text


def test_paraphrased_claim_is_entailed(backend: EmbeddedBackend) -> None:
    report = audit(backend, "Gustave Eiffel's company built and designed the tower.")
    assert only_claim_label(report) == Label.ENTAILED
    assert report.hallucinated is False
    assert report.claims[0].evidence


def test_unrelated_claim_is_baseless(backend: EmbeddedBackend) -> None:
    report = audit(backend, "Bananas are rich in potassium and grow in tropical plantations.")
    assert only_claim_label(report) == Label.BASELESS
    assert report.claims[0].evidence == []


def test_evidence_is_anchored_in_the_context(backend: EmbeddedBackend) -> None:
    report = audit(
        backend,
        "The Eiffel Tower stands 330 metres tall. Its top platform is 276 metres above the ground. "
        "It was completed in 1901 as the entrance arch to the World's Fair.",
    )
    context, _ = segment_context(CONTEXT)
    assert [c.label for c in report.claims] == [Label.ENTAILED, Label.ENTAILED, Label.CONTRADICTED]
    for claim in report.claims:
        assert claim.grounded, claim.errors
        for evidence in claim.evidence:
            assert context[evidence.start : evidence.end] == evidence.text


def test_output_is_deterministic(backend: EmbeddedBackend) -> None:
    answer = "The tower is 330 metres tall. It has four levels for visitors. Cats are mammals."
    first, second = audit(backend, answer), audit(backend, answer)
    assert first.model_dump() == second.model_dump()
    fresh = audit(EmbeddedBackend(), answer)
    assert fresh.model_dump() == first.model_dump()


def test_model_is_loaded_once_per_process(backend: EmbeddedBackend) -> None:
    other = EmbeddedBackend(name="embedded-2")
    assert other.encoder is backend.encoder
    assert load_encoder() is backend.encoder


def test_decompose_request_gets_an_error_not_an_exception(backend: EmbeddedBackend) -> None:
    request = JudgeRequest(
        task="decompose",
        payload=DecomposeInput(question=None, sentences=["The tower is tall."]),
        output_schema=DecomposeOutput,
        messages=[],
        prompt_version="test",
    )
    response = asyncio.run(backend.complete(request))
    assert response.parsed is None
    assert response.error and "decompose" in response.error
    assert response.judge == backend.name


def test_verify_reply_is_free_and_has_one_judgement_per_claim(backend: EmbeddedBackend) -> None:
    _, sentences = segment_context(CONTEXT)
    request = JudgeRequest(
        task="verify",
        payload=VerifyInput(
            stage="global", claims=["The tower is 330 metres tall.", "Cats purr."], sentences=sentences
        ),
        output_schema=VerifyOutput,
        messages=[],
        prompt_version="test",
    )
    response = asyncio.run(backend.complete(request))
    assert isinstance(response.parsed, VerifyOutput)
    assert [j.claim for j in response.parsed.judgements] == [0, 1]
    assert all(j.confidence is not None and 0.0 <= j.confidence <= 1.0 for j in response.parsed.judgements)
    assert all(j.rationale for j in response.parsed.judgements)
    assert response.usage.calls == 1
    assert response.usage.prompt_tokens == response.usage.completion_tokens == 0
    assert response.usage.cost_usd == 0.0
    assert backend.max_cost_usd(request) == 0.0


@pytest.mark.parametrize("answer", ["Dogs bark.", "Cats purr loudly."])
def test_a_short_claim_against_an_unrelated_context_is_not_entailed(backend: EmbeddedBackend, answer: str) -> None:
    assert only_claim_label(audit(backend, answer)) == Label.BASELESS


def test_a_short_claim_the_context_states_is_entailed(backend: EmbeddedBackend) -> None:
    assert only_claim_label(audit(backend, "Gustave Eiffel built it.")) == Label.ENTAILED


@pytest.mark.parametrize(
    ("claim", "cue"),
    [
        ("The tower does not have three levels for visitors, with restaurants on the first and second levels.",
         "negation"),
        ("The tower has three levels for visitors, with restaurants on the first and second levels.", None),
        ("The top level's lower platform is 276 metres above the ground.", "antonym"),
        ("The top level's upper platform is 276 metres above the ground.", None),
    ],
)
def test_a_summary_that_flips_a_sentence_is_contradicted(backend: EmbeddedBackend, claim: str, cue: str | None) -> None:
    """Negation flips and antonyms of a context sentence: the guard of the summaries' head (chosen on
    synthetic flips, evals/embedded/synthetic.py) calls them contradicted; the copies stay entailed."""
    label = only_claim_label(audit(backend, claim))
    assert label == (Label.CONTRADICTED if cue else Label.ENTAILED)


def _judge_alone(backend: EmbeddedBackend, context: str, claims: list[str]) -> list[ClaimJudgement]:
    _, sentences = segment_context([context])
    return backend.judge(VerifyInput(stage="global", claims=claims, sentences=sentences, question=None)).judgements


@pytest.mark.parametrize(
    ("context", "claim"),
    [
        ("Paris has about two million inhabitants.", "About 12 million people live in Paris."),
        ("The trial lasts 60 days.", "The trial lasts thirty days."),
        ("The box holds a dozen eggs.", "The box holds 20 eggs."),
        ("The library is on the third floor.", "The library is on the 5th floor."),
    ],
)
def test_numbers_in_words_are_numbers_to_the_guard(backend: EmbeddedBackend, context: str, claim: str) -> None:
    [judgement] = _judge_alone(backend, context, [claim])
    assert judgement.label == Label.CONTRADICTED
    assert judgement.score is not None and judgement.score.decided_by == "number_guard"


@pytest.mark.parametrize(
    ("context", "claim"),
    [
        ("The town has 2,500,000 people.", "The town has 2.5 million people."),
        ("The box holds a dozen eggs.", "The box holds 12 eggs."),
        ("Half of the residents voted.", "50% of the residents voted."),
    ],
)
def test_the_same_number_written_two_ways_is_no_conflict(backend: EmbeddedBackend, context: str, claim: str) -> None:
    [judgement] = _judge_alone(backend, context, [claim])
    assert judgement.label == Label.ENTAILED


@pytest.mark.parametrize(
    "claim", ["\u200b\u200b", "...", "!?", "\U0001f600", "42.", "The sky is 42 metres tall and costs 17 dollars."]
)
def test_claims_with_nothing_checkable_in_the_context_are_baseless(backend: EmbeddedBackend, claim: str) -> None:
    [judgement] = _judge_alone(backend, "The sky is blue.", [claim])
    assert judgement.label == Label.BASELESS
    assert judgement.score is not None and judgement.score.decided_by != "head"


def test_every_verdict_names_its_probability_threshold_and_decider(backend: EmbeddedBackend) -> None:
    claims = ["The Eiffel Tower was completed in 1901.", "Gustave Eiffel's company built the tower.", "Dogs bark."]
    judgements = _judge_alone(backend, " ".join(CONTEXT), claims)
    for judgement in judgements:
        score = judgement.score
        assert score is not None and 0.0 <= score.p_unsupported <= 1.0 and 0.0 < score.threshold < 1.0
        # The confidence is the probability of the label's side, and a head decision obeys the threshold.
        side = 1.0 - score.p_unsupported if judgement.label == Label.ENTAILED else score.p_unsupported
        assert judgement.confidence == pytest.approx(side, abs=1e-4)
        if score.decided_by == "head":
            assert (judgement.label == Label.ENTAILED) is (score.p_unsupported < score.threshold)
    report = audit(backend, claims[0])
    assert report.claims[0].score is not None, "the score reaches the record"


SUBSTITUTION_CONTEXT = (
    "The bridge was designed by Jones and opened to traffic in May. Sales of the new model rose by a small "
    "margin in the first quarter. The race course is 42 kilometers long and climbs steeply. The drug may cause "
    "mild headaches in some patients. The company bought the old factory in the north of the town."
)


@pytest.mark.parametrize(
    ("claim", "label", "changed"),
    [
        ("Sales of the new model fell by a small margin in the first quarter.", Label.CONTRADICTED, "'rose'"),
        ("The bridge was designed by Smith and opened to traffic in May.", Label.CONTRADICTED, "another name"),
        ("The bridge was designed by Jones and opened to traffic in June.", Label.CONTRADICTED, "another month"),
        ("The race course is 42 miles long and climbs steeply.", Label.CONTRADICTED, "another unit"),
        ("The drug will cause mild headaches in some patients.", Label.BASELESS, "hedges"),
        # A stretch of the sentence: its start or its end left out (a "passage 2:" label, a clause).
        ("the new model fell by a small margin in the first quarter.", Label.CONTRADICTED, "'rose'"),
        ("The bridge was designed by Smith.", Label.CONTRADICTED, "another name"),
    ],
)
def test_a_sentence_copied_with_one_deciding_word_changed_is_not_entailed(
    backend: EmbeddedBackend, claim: str, label: Label, changed: str
) -> None:
    [judgement] = _judge_alone(backend, SUBSTITUTION_CONTEXT, [claim])
    assert judgement.label == label and changed in judgement.rationale
    assert judgement.score is not None and judgement.score.decided_by == "substitution_guard"


@pytest.mark.parametrize(
    "claim",
    [
        "The company purchased the old factory in the north of the town.",  # a synonym decides nothing
        "The drug may cause mild headaches in some patients.",  # the sentence itself
        "The drug may cause mild headaches.",  # a stretch of the sentence
    ],
)
def test_a_copy_or_a_synonym_is_left_to_the_head(backend: EmbeddedBackend, claim: str) -> None:
    [judgement] = _judge_alone(backend, SUBSTITUTION_CONTEXT, [claim])
    assert judgement.score is not None and judgement.score.decided_by != "substitution_guard"


def test_a_claim_one_sentence_states_word_for_word_is_no_changed_copy_of_another(backend: EmbeddedBackend) -> None:
    stated = "In American the meaning of the name Theresa is reaper and harvester."
    [judgement] = _judge_alone(backend, f"{stated.replace('American', 'Greek')} {stated}", [stated])
    assert judgement.label == Label.ENTAILED
    assert judgement.score is not None and judgement.score.decided_by != "substitution_guard"


@pytest.mark.parametrize(
    ("appended", "guarded"),
    [
        ("the riders wear yellow helmets made of carbon", True),  # nothing of it in view
        ("the company bought the old factory", False),  # another sentence in view says it
    ],
)
def test_a_copied_sentence_with_an_unsupported_clause_appended_is_baseless(
    backend: EmbeddedBackend, appended: str, guarded: bool
) -> None:
    claim = f"The race course is 42 kilometers long and climbs steeply, and {appended}."
    [judgement] = _judge_alone(backend, SUBSTITUTION_CONTEXT, [claim])
    assert judgement.score is not None and (judgement.score.decided_by == "clause_guard") is guarded
    if guarded:
        assert judgement.label == Label.BASELESS and "appended clause" in judgement.rationale
