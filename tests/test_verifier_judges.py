"""Pair-classifier verifiers (MiniCheck, HHEM) run on tiny random checkpoints of their real classes,
laid out as pulled hub snapshots: inputs built as the authors build them, windows inside the token
limit, support read from the right label, and the judges usable by name once pulled."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.conftest import require_module

torch = require_module("torch", "torch (the verifiers extra)")
require_module("transformers", "transformers (the verifiers extra)")

from transformers import AutoModelForSequenceClassification, AutoTokenizer  # noqa: E402

from rt4chart.judges.hub import HubFile, PullRecord, VerifierModel, snapshot_dir  # noqa: E402
from rt4chart.judges.pair_classifier import HHEM_PROMPT, PairClassifierBackend  # noqa: E402
from rt4chart.method.tasks import VerifyInput, VerifyOutput  # noqa: E402
from rt4chart.protocol import JudgeRequest  # noqa: E402
from rt4chart.types import Label, Sentence  # noqa: E402
from tests.tiny_verifiers import tiny_deberta, tiny_flan_t5, tiny_hhem, tiny_roberta  # noqa: E402

CONTEXT = [
    "The Eiffel Tower is in Paris and it was finished in 1889 .",
    "The tower is 330 metres tall .",
    "Paris is the capital of France .",
    "The river Seine runs through the city .",
    "Prices rose by 12 percent in March while wages fell .",
    "The company was founded by Marie Curie in Warsaw .",
]
CLAIMS = ["The tower is 330 metres tall .", "The company was founded in Paris ."]


def _payload(sentences: list[str], claims: list[str]) -> VerifyInput:
    placed, offset = [], 0
    for index, text in enumerate(sentences):
        placed.append(Sentence(index=index, start=offset, end=offset + len(text), text=text))
        offset += len(text) + 1
    return VerifyInput(stage="local", claims=claims, sentences=placed, chunk=0)


def _model(family: str, max_tokens: int, window_tokens: int, tokenizer: bool = False) -> VerifierModel:
    return VerifierModel(
        family=family,  # type: ignore[arg-type]
        weights=HubFile(repo="x/weights", revision="main"),
        tokenizer=HubFile(repo="x/tokenizer", revision="main") if tokenizer else None,
        max_tokens=max_tokens,
        window_tokens=window_tokens,
    )


def _minicheck_reference(record: PullRecord, directory: Path, window: str, claim: str, max_tokens: int) -> float:
    """MiniCheck's own recipe for RoBERTa/DeBERTa: ``doc + eos + claim``, truncated, softmax, index 1."""
    folder = snapshot_dir(record.repos[0], directory)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    inputs = tokenizer([tokenizer.eos_token.join([window, claim])], max_length=max_tokens, truncation=True,
                       padding=True, return_tensors="pt")
    with torch.no_grad():
        return float(torch.softmax(model(**inputs).logits, dim=1)[0, 1])


@pytest.mark.parametrize("build", [tiny_roberta, tiny_deberta])
def test_sequence_classifiers_score_as_minicheck_does(tmp_path: Path, build: object) -> None:
    record = build(tmp_path, "tiny")  # type: ignore[operator]
    backend = PairClassifierBackend("tiny", _model("sequence-classification", 60, 50), record, tmp_path)
    output = backend.judge(_payload(CONTEXT[:2], CLAIMS[:1]))
    window = " ".join(CONTEXT[:2])
    expected = _minicheck_reference(record, tmp_path, window, CLAIMS[0], 60)
    judgement = output.judgements[0]
    assert judgement.score is not None
    assert 1.0 - judgement.score.p_unsupported == pytest.approx(expected, abs=1e-5)


def test_windows_hold_whole_sentences_inside_the_token_limit(tmp_path: Path) -> None:
    record = tiny_roberta(tmp_path, "tiny")
    backend = PairClassifierBackend("tiny", _model("sequence-classification", 40, 30), record, tmp_path)
    classifier = backend.classifier
    windows = classifier.windows(CONTEXT, CLAIMS[1])
    assert len(windows) > 1
    assert [i for window in windows for i in window.sentences] == list(range(len(CONTEXT)))
    for window in windows:
        assert window.text == " ".join(CONTEXT[i] for i in window.sentences)
        tokens = classifier.tokenizer(classifier.render(window.text, CLAIMS[1]))["input_ids"]
        assert len(tokens) <= 40
    # The claim's support is its best window's, each scored as MiniCheck scores one chunk.
    output = backend.judge(_payload(CONTEXT, CLAIMS[1:]))
    references = [_minicheck_reference(record, tmp_path, w.text, CLAIMS[1], 40) for w in windows]
    assert output.judgements[0].score is not None
    assert 1.0 - output.judgements[0].score.p_unsupported == pytest.approx(max(references), abs=1e-5)


def test_a_sentence_longer_than_a_window_is_cut_and_the_claim_kept(tmp_path: Path) -> None:
    record = tiny_roberta(tmp_path, "tiny")
    backend = PairClassifierBackend("tiny", _model("sequence-classification", 40, 30), record, tmp_path)
    classifier = backend.classifier
    long_sentence = " ".join(CONTEXT)
    (window,) = classifier.windows([long_sentence], CLAIMS[0])
    assert long_sentence.startswith(window.text) and len(window.text) < len(long_sentence)
    rendered = classifier.render(window.text, CLAIMS[0])
    assert len(classifier.tokenizer(rendered)["input_ids"]) <= 40
    assert rendered.endswith(CLAIMS[0])


def _set_bias(record: PullRecord, directory: Path, supported: bool) -> None:
    """Make the tiny RoBERTa's head say label 1 (supported, as the real checkpoint's) or label 0."""
    folder = snapshot_dir(record.repos[0], directory)
    model = AutoModelForSequenceClassification.from_pretrained(folder)
    with torch.no_grad():
        model.classifier.out_proj.bias.copy_(torch.tensor([0.0, 50.0] if supported else [50.0, 0.0]))
    model.save_pretrained(folder)


@pytest.mark.parametrize("supported", [True, False])
def test_label_one_is_supported(tmp_path: Path, supported: bool) -> None:
    record = tiny_roberta(tmp_path, "tiny")
    _set_bias(record, tmp_path, supported)
    backend = PairClassifierBackend("tiny", _model("sequence-classification", 60, 50), record, tmp_path)
    (judgement,) = backend.judge(_payload(CONTEXT[:3], CLAIMS[:1])).judgements
    if supported:
        assert judgement.label == Label.ENTAILED
        assert judgement.evidence == CONTEXT[:3]  # the window that supported it
    else:
        assert judgement.label == Label.BASELESS
        assert judgement.evidence == []
    assert judgement.confidence == pytest.approx(1.0, abs=1e-6)


def test_flan_t5_reads_the_one_and_blank_tokens_after_one_decoder_step(tmp_path: Path) -> None:
    record = tiny_flan_t5(tmp_path, "tiny")
    backend = PairClassifierBackend("tiny", _model("minicheck-t5", 80, 60), record, tmp_path)
    output = backend.judge(_payload(CONTEXT[:2], CLAIMS[:1]))
    folder = snapshot_dir(record.repos[0], tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    inputs = tokenizer(["predict: " + tokenizer.eos_token.join([" ".join(CONTEXT[:2]), CLAIMS[0]])],
                       max_length=80, truncation=True, return_tensors="pt")
    labels = tokenizer.convert_tokens_to_ids(["▁", "▁1"])
    with torch.no_grad():
        logits = model(**inputs, decoder_input_ids=torch.zeros((1, 1), dtype=torch.long)).logits[:, 0, :]
    expected = float(torch.softmax(logits[:, labels], dim=-1)[0, 1])
    assert output.judgements[0].score is not None
    assert 1.0 - output.judgements[0].score.p_unsupported == pytest.approx(expected, abs=1e-5)


def test_hhem_head_runs_without_its_remote_code(tmp_path: Path) -> None:
    record, head = tiny_hhem(tmp_path, "tiny")
    backend = PairClassifierBackend("tiny", _model("hhem", 120, 100, tokenizer=True), record, tmp_path)
    output = backend.judge(_payload(CONTEXT[:2], CLAIMS[:1]))
    tokenizer = AutoTokenizer.from_pretrained(snapshot_dir(record.repos[1], tmp_path))
    prompt = HHEM_PROMPT.format(text1=" ".join(CONTEXT[:2]), text2=CLAIMS[0])
    with torch.no_grad():
        logits = head(**tokenizer([prompt], return_tensors="pt")).logits[:, 0, :]
    expected = float(torch.softmax(logits, dim=-1)[0, 1])
    assert output.judgements[0].score is not None
    assert 1.0 - output.judgements[0].score.p_unsupported == pytest.approx(expected, abs=1e-5)


def test_a_damaged_checkpoint_is_an_error_reply_naming_the_pull_command(tmp_path: Path) -> None:
    record = tiny_roberta(tmp_path, "tiny")
    weights = snapshot_dir(record.repos[0], tmp_path) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    backend = PairClassifierBackend("tiny", _model("sequence-classification", 60, 50), record, tmp_path)
    request = JudgeRequest(task="verify", payload=_payload(CONTEXT[:2], CLAIMS[:1]), output_schema=VerifyOutput,
                           messages=[], prompt_version="test")
    response = asyncio.run(backend.complete(request))
    assert response.parsed is None
    assert response.error is not None and "rt4 models pull tiny" in response.error


@pytest.mark.parametrize("supported", [True, False])
def test_a_pulled_verifier_settles_what_it_is_sure_of_as_a_cascade_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, supported: bool
) -> None:
    """``cascade:minicheck-roberta-large@0.9,scripted:...``: the verifier's confidence decides which
    claims it settles (a sure one) and which go on to the next stage (one at 0.5)."""
    from rt4chart.judges.cascade import CascadeBackend
    from rt4chart.judges.hub import models_dir
    from rt4chart.judges.registry import resolve_judge

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    record = tiny_roberta(models_dir(), "minicheck-roberta-large")
    if supported:
        _set_bias(record, models_dir(), supported=True)
    else:  # P(supported) exactly 0.5: confidence 0.5, under the stage's 0.9
        folder = snapshot_dir(record.repos[0], models_dir())
        model = AutoModelForSequenceClassification.from_pretrained(folder)
        with torch.no_grad():
            model.classifier.out_proj.weight.zero_()
            model.classifier.out_proj.bias.zero_()
        model.save_pretrained(folder)
    rules = tmp_path / "rules.json"
    rule = {"claim": "", "label": "contradicted", "evidence": [CONTEXT[1]]}
    rules.write_text(json.dumps({"verify": [rule]}))
    backend = resolve_judge(f"cascade:minicheck-roberta-large@0.9,scripted:{rules}")
    assert isinstance(backend, CascadeBackend)
    request = JudgeRequest(task="verify", payload=_payload(CONTEXT[:2], CLAIMS[:1]), output_schema=VerifyOutput,
                           messages=[], prompt_version="test")
    response = asyncio.run(backend.complete(request))
    assert isinstance(response.parsed, VerifyOutput) and response.claim_judges is not None
    (judgement,) = response.parsed.judgements
    if supported:
        assert judgement.label == Label.ENTAILED
        assert response.claim_judges == [f"minicheck-roberta-large#{record.repos[0].commit[:8]}"]
    else:
        assert judgement.label == Label.CONTRADICTED
        assert response.claim_judges[0].startswith("scripted:")
