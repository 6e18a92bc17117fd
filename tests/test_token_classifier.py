"""LettuceDetect's token classifier run on a tiny random ModernBERT of its real class, laid out as a pulled
hub snapshot: its input built as its authors build it (prompt, then the claims as the answer), windows
inside the token limit, answer tokens' flags mapped onto the claims whose spans hold them, and the judge
usable by name once pulled."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_module

torch = require_module("torch", "torch (the verifiers extra)")
require_module("transformers", "transformers (the verifiers extra)")

from transformers import AutoModelForTokenClassification, AutoTokenizer  # noqa: E402

from rt4chart.judges.cache import request_key  # noqa: E402
from rt4chart.judges.hub import HubFile, PullRecord, VerifierModel, snapshot_dir  # noqa: E402
from rt4chart.judges.scripted import ScriptedBackend, ScriptedRules  # noqa: E402
from rt4chart.judges.token_classifier import TokenClassifierBackend, lettuce_prompt  # noqa: E402
from rt4chart.method.session import JudgeSession  # noqa: E402
from rt4chart.method.tasks import AnswerSpans, VerifyInput, VerifyOutput, load_prompts, narrow_verify_request  # noqa: E402
from rt4chart.method.verification import ClaimVerifier  # noqa: E402
from rt4chart.protocol import JudgeRequest, Message  # noqa: E402
from rt4chart.types import Claim, Label, Sentence, Span  # noqa: E402
from tests.tiny_verifiers import tiny_lettucedetect  # noqa: E402

CONTEXT = [
    "The Eiffel Tower is in Paris and it was finished in 1889 .",
    "The tower is 330 metres tall .",
    "Paris is the capital of France .",
    "The river Seine runs through the city .",
]
CLAIMS = ["The tower is 330 metres tall .", "It was finished in 1850 .", "The river Seine runs through Warsaw ."]
QUESTION = "How tall is the tower ?"


def _payload(sentences: list[str], claims: list[str], question: str | None = QUESTION) -> VerifyInput:
    placed, offset = [], 0
    for index, text in enumerate(sentences):
        placed.append(Sentence(index=index, start=offset, end=offset + len(text), text=text))
        offset += len(text) + 1
    return VerifyInput(stage="local", claims=claims, sentences=placed, chunk=0, question=question)


def _backend(
    directory: Path, record: PullRecord, max_tokens: int = 400, threshold: float = 0.5
) -> TokenClassifierBackend:
    model = VerifierModel(family="lettucedetect", weights=HubFile(repo="x/weights", revision="main"),
                          max_tokens=max_tokens, window_tokens=max_tokens, threshold=threshold)
    return TokenClassifierBackend("tiny", model, record, directory)


def _reference(record: PullRecord, directory: Path, prompt: str, answer: str) -> list[tuple[int, int, float]]:
    """LettuceDetect's own recipe: ``tokenizer(prompt, answer)``, softmax, class 1 of each answer token."""
    folder = snapshot_dir(record.repos[0], directory)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    encoding = tokenizer(prompt, answer, return_offsets_mapping=True, return_tensors="pt")
    offsets = encoding.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        probabilities = torch.softmax(model(**encoding).logits[0], dim=-1)[:, 1].tolist()
    return [(start, end, p) for (start, end), segment, p in zip(offsets, encoding.sequence_ids(0), probabilities,
                                                                  strict=True) if segment == 1 and end > start]


def _claim_maxima(tokens: list[tuple[int, int, float]], claims: list[str]) -> list[float]:
    maxima, start = [], 0
    for claim in claims:
        end = start + len(claim)
        maxima.append(max(p for a, b, p in tokens if a < end and b > start))
        start = end + 1
    return maxima


@pytest.mark.parametrize("question", [QUESTION, None])
def test_answer_tokens_are_scored_as_lettucedetect_does(tmp_path: Path, question: str | None) -> None:
    record = tiny_lettucedetect(tmp_path, "tiny")
    output = _backend(tmp_path, record).judge(_payload(CONTEXT, CLAIMS, question))
    # One window: passage 1 is every sentence in view; the answer is the claims in order.
    expected = _claim_maxima(_reference(record, tmp_path, lettuce_prompt([" ".join(CONTEXT)], question),
                                        " ".join(CLAIMS)), CLAIMS)
    for judgement, unsupported in zip(output.judgements, expected, strict=True):
        assert judgement.score is not None
        assert judgement.score.p_unsupported == pytest.approx(unsupported, abs=1e-5)
        assert judgement.label == (Label.BASELESS if unsupported >= 0.5 else Label.ENTAILED)


def test_the_prompts_are_lettucedetects() -> None:
    qa = lettuce_prompt(["a b", "c"], "Why ?")
    assert qa.startswith("\nBriefly answer the following question:\nWhy ?\nBear in mind that your response should be "
                         "strictly based on the following 2 passages:\npassage 1: a b\npassage 2: c\nIn case")
    assert qa.endswith('please reply with: "Unable to answer based on given passages."\noutput:\n')
    assert lettuce_prompt(["a b"], None) == "\nSummarize the following text:\npassage 1: a b\noutput:\n"


def test_windows_keep_every_input_inside_the_limit_and_take_each_tokens_highest_flag(tmp_path: Path) -> None:
    record = tiny_lettucedetect(tmp_path, "tiny")
    backend = _backend(tmp_path, record, max_tokens=100)
    classifier = backend.classifier
    answer = " ".join(CLAIMS)
    windows = classifier.windows(CONTEXT, QUESTION, answer)
    assert len(windows) > 1 and " ".join(windows) == " ".join(CONTEXT)  # whole sentences, in order
    for limit in (100, 90):  # at 90 the first sentence alone is longer than a window: it is cut
        fitted = _backend(tmp_path, record, max_tokens=limit).classifier
        for window in fitted.windows(CONTEXT, QUESTION, answer):
            assert len(fitted.tokenizer(lettuce_prompt([window], QUESTION), answer)["input_ids"]) <= limit
    per_window = [_reference(record, tmp_path, lettuce_prompt([w], QUESTION), answer) for w in windows]
    highest = [(a, b, max(tokens[i][2] for tokens in per_window)) for i, (a, b, _) in enumerate(per_window[0])]
    output = backend.judge(_payload(CONTEXT, CLAIMS))
    for judgement, unsupported in zip(output.judgements, _claim_maxima(highest, CLAIMS), strict=True):
        assert judgement.score is not None and judgement.score.p_unsupported == pytest.approx(unsupported, abs=1e-5)


class _Flags:
    """A classifier stand-in flagging the answer tokens of given words (P 0.9), the others at P 0.1."""

    def __init__(self, *words: str) -> None:
        self.words = words

    def hallucination(self, sentences: list[str], question: str | None, answer: str) -> list[tuple[int, int, float]]:
        tokens, start = [], 0
        for word in answer.split(" "):
            tokens.append((start, start + len(word), 0.9 if word in self.words else 0.1))
            start += len(word) + 1
        return tokens


def test_a_claim_is_baseless_when_its_span_holds_a_flagged_token(tmp_path: Path) -> None:
    backend = _backend(tmp_path, tiny_lettucedetect(tmp_path, "tiny"))
    backend._classifier = _Flags("1850", "Warsaw")  # type: ignore[assignment]
    output = backend.judge(_payload(CONTEXT, CLAIMS))
    labels = [judgement.label for judgement in output.judgements]
    assert labels == [Label.ENTAILED, Label.BASELESS, Label.BASELESS]
    supported, dated, placed = output.judgements
    assert supported.evidence == CONTEXT and supported.confidence == pytest.approx(0.9)
    assert dated.evidence == [] and dated.confidence == pytest.approx(0.9) and "1850" in dated.rationale
    assert "Warsaw" in placed.rationale and "1850" not in placed.rationale
    # A stricter operating point (P(supported) >= 0.95): the claim at P(hallucinated) 0.1 is baseless too.
    strict = _backend(tmp_path, tiny_lettucedetect(tmp_path, "tiny"), threshold=0.95)
    strict._classifier = _Flags("1850")  # type: ignore[assignment]
    assert strict.judge(_payload(CONTEXT, CLAIMS[:1])).judgements[0].label == Label.BASELESS


def test_claims_that_fill_the_limit_are_an_error_reply(tmp_path: Path) -> None:
    backend = _backend(tmp_path, tiny_lettucedetect(tmp_path, "tiny"), max_tokens=40)
    request = JudgeRequest(task="verify", payload=_payload(CONTEXT, CLAIMS * 3), output_schema=VerifyOutput,
                           messages=[], prompt_version="test")
    response = asyncio.run(backend.complete(request))
    assert response.parsed is None and response.error is not None and "leaving none for the context" in response.error


def test_the_shipped_profile_resolves_once_pulled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rt4chart.judges.hub import models_dir
    from rt4chart.judges.registry import JudgeConfigError, resolve_judge

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(JudgeConfigError, match="rt4 models pull lettucedetect-base"):
        resolve_judge("lettucedetect-base")
    record = tiny_lettucedetect(models_dir(), "lettucedetect-base")
    backend: Any = resolve_judge("lettucedetect-base")
    assert isinstance(backend, TokenClassifierBackend)
    assert backend.name == f"lettucedetect-base#{record.repos[0].commit[:8]}"
    request = JudgeRequest(task="verify", payload=_payload(CONTEXT, CLAIMS[:1]), output_schema=VerifyOutput,
                           messages=[], prompt_version="test")
    response = asyncio.run(backend.complete(request))
    assert isinstance(response.parsed, VerifyOutput) and len(response.parsed.judgements) == 1


ANSWER = "The tower is 330 metres tall . It was finished in 1850 ."
"""An answer of two sentences: [0, 30) and [31, 56)."""
SPANS = [Span(start=0, end=30), Span(start=31, end=56), Span(start=31, end=56), None]
"""The claims' answer spans: a sentence claim, two finer claims of the second sentence, a holistic claim."""
FINE_CLAIMS = ["The tower is 330 metres tall .", "The tower was finished .", "It happened in 1850 .",
               "The river Seine runs through Warsaw ."]


def _answered(claims: list[str], spans: list[Span | None]) -> VerifyInput:
    return _payload(CONTEXT, claims).model_copy(update={"answer": AnswerSpans(text=ANSWER, spans=spans)})


def test_the_answer_is_read_and_its_tokens_mapped_onto_claims_through_their_spans(tmp_path: Path) -> None:
    record = tiny_lettucedetect(tmp_path, "tiny")
    output = _backend(tmp_path, record).judge(_answered(FINE_CLAIMS, SPANS))
    prompt = lettuce_prompt([" ".join(CONTEXT)], QUESTION)
    tokens = _reference(record, tmp_path, prompt, ANSWER)
    placed = [max(p for a, b, p in tokens if a < span.end and b > span.start) for span in SPANS if span is not None]
    # The holistic claim, without a span, is read as before: the unplaced claims joined are its answer.
    holistic = _claim_maxima(_reference(record, tmp_path, prompt, FINE_CLAIMS[3]), FINE_CLAIMS[3:])
    for judgement, unsupported in zip(output.judgements, placed + holistic, strict=True):
        assert judgement.score is not None and judgement.score.p_unsupported == pytest.approx(unsupported, abs=1e-5)


class _Recording(_Flags):
    """The flagging stand-in, recording the answers it was given."""

    def __init__(self, *words: str) -> None:
        super().__init__(*words)
        self.answers: list[str] = []

    def hallucination(self, sentences: list[str], question: str | None, answer: str) -> list[tuple[int, int, float]]:
        self.answers.append(answer)
        return super().hallucination(sentences, question, answer)


def test_claims_of_a_flagged_sentence_share_its_flags(tmp_path: Path) -> None:
    backend = _backend(tmp_path, tiny_lettucedetect(tmp_path, "tiny"))
    backend._classifier = flags = _Recording("1850", "Warsaw")  # type: ignore[assignment]
    output = backend.judge(_answered(FINE_CLAIMS, SPANS))
    # "The tower was finished ." says nothing flagged itself, but its sentence holds 1850.
    assert [j.label for j in output.judgements] == [Label.ENTAILED, Label.BASELESS, Label.BASELESS, Label.BASELESS]
    assert flags.answers == [ANSWER, FINE_CLAIMS[3]]
    flags.answers.clear()
    # Without the answer (a request built elsewhere): the claims joined, as before.
    backend.judge(_payload(CONTEXT, FINE_CLAIMS))
    assert flags.answers == [" ".join(FINE_CLAIMS)]


def test_only_a_judge_that_reads_the_answer_gets_it_and_other_keys_stay(tmp_path: Path) -> None:
    claims = [Claim(index=i, text=text, sentence_index=None, answer_span=span)
              for i, (text, span) in enumerate(zip(FINE_CLAIMS, SPANS, strict=True))]
    view = _payload(CONTEXT, []).sentences

    def request(backend: Any) -> JudgeRequest:
        verifier = ClaimVerifier(JudgeSession(backend, load_prompts()), None, QUESTION,  # type: ignore[arg-type]
                                 answer=ANSWER)
        return verifier.build_request(claims, view, "local", chunk=0)

    scripted = request(ScriptedBackend(ScriptedRules()))
    assert isinstance(scripted.payload, VerifyInput) and scripted.payload.answer is None
    reader = request(_backend(tmp_path, tiny_lettucedetect(tmp_path, "tiny")))
    assert isinstance(reader.payload, VerifyInput) and reader.payload.answer == AnswerSpans(text=ANSWER, spans=SPANS)
    # Same messages: only the answer tells the two keys apart, and it enters only the reader's.
    assert reader.messages == scripted.messages
    assert request_key("j", reader) != request_key("j", scripted)
    narrowed, _ = narrow_verify_request(reader, [1, 3])
    assert isinstance(narrowed.payload, VerifyInput) and narrowed.payload.answer is not None
    assert narrowed.payload.answer.spans == [SPANS[1], SPANS[3]]
    # A request without the answer keeps the key main's code gave it (computed there for this request).
    plain = JudgeRequest(task="verify", payload=_payload(["The tower is 330 metres tall."], CLAIMS[:1]),
                         output_schema=VerifyOutput, messages=[Message(role="system", content="judge"),
                                                               Message(role="user", content="claims")],
                         prompt_version="v1")
    assert request_key("embedded", plain) == "1f6d5d3def24910c35fb3b2d6ebcb452309ac605e5a5e67c31a1c237c51f331f"
