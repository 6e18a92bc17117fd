"""LettuceDetect's token classifiers from the hub as judges: answer tokens flagged, flags mapped onto claims.

LettuceDetect (ModernBERT ``ForTokenClassification``, 149M and 395M) reads its prompt (the RAGTruth
generation prompt: the question and the passages for QA, or the text to summarise) as the first
segment and the answer as the second, and labels every answer token supported (0) or hallucinated (1).
This backend builds that input as its authors' ``TransformerDetector`` does (:data:`QA_PROMPT`,
:data:`SUMMARY_PROMPT`; the sentences in view as passage 1), with the answer under audit as the answer:
it declares :attr:`~rt4chart.protocol.Capabilities.reads_answer`, so its verify requests carry the
answer as given and each claim's answer span (the span of the sentence it was taken from), and a
claim's tokens are the answer's tokens inside its span (claims of one sentence share them). A claim
whose span is unknown (a holistic claim), or a request without the answer (one built elsewhere, such as
``rt4 calibrate``'s), is read as before: those claims, in order and joined by spaces, are the answer,
and each claim's tokens are those inside its own text.

Windows: when the prompt and the answer do not fit in ``max_tokens``, the sentences are packed, whole
and in order, into windows that do, and each answer token keeps its highest P(hallucinated) over the
windows (the authors' ``max()`` aggregation: a token is supported only where every window supports
it). A claim's P(not supported) is its most hallucinated token's; it is baseless when that reaches
``1 - threshold`` (0.5: the authors' argmax), else entailed with every sentence in view as its evidence.
``confidence`` and ``score`` carry that probability, as the pair classifiers' do.

torch and transformers are imported when the first request arrives (the ``verifiers`` extra).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from rt4chart.judges.hub import PullRecord, VerifierModel, snapshot_dir
from rt4chart.judges.pair_classifier import HubVerifierBackend, Unjudgeable, cut_to_tokens
from rt4chart.method.tasks import ClaimJudgement, VerifyInput, VerifyOutput
from rt4chart.types import JudgeScore, Label, Span

QA_PROMPT = (
    "\nBriefly answer the following question:\n{question}\n"
    "Bear in mind that your response should be strictly based on the following {num_passages} passages:\n"
    "{context}\n"
    "In case the passages do not contain the necessary information to answer the question, please reply with: "
    '"Unable to answer based on given passages."\n'
    "output:\n"
)
"""LettuceDetect's prompt for an answer to a question (RAGTruth's QA generation prompt)."""

SUMMARY_PROMPT = """
Summarize the following text:
{text}
output:
"""
"""LettuceDetect's prompt for an answer without a question (RAGTruth's summary prompt)."""

SPECIAL_TOKENS = 3
"""Tokens the tokenizer adds around the two segments (``[CLS] prompt [SEP] answer [SEP]``)."""


def lettuce_prompt(passages: list[str], question: str | None) -> str:
    """The first segment, as LettuceDetect's ``TransformerDetector`` forms it."""
    context = "\n".join(f"passage {number}: {passage}" for number, passage in enumerate(passages, start=1))
    if question is None:
        return SUMMARY_PROMPT.format(text=context)
    return QA_PROMPT.format(question=question, num_passages=len(passages), context=context)


class TokenClassifier:
    """A loaded token classifier: P(hallucinated) for each answer token, against the sentences in view."""

    def __init__(self, model: VerifierModel, record: PullRecord, directory: Path | None = None) -> None:
        import torch
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        folder = snapshot_dir(record.repos[0], directory)
        self.spec = model
        self.tokenizer: Any = AutoTokenizer.from_pretrained(snapshot_dir(record.repos[-1], directory))
        self.network: Any = AutoModelForTokenClassification.from_pretrained(folder)
        self.network.eval()
        self._torch = torch
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        """Tokens of ``text`` without special tokens."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def windows(self, sentences: list[str], question: str | None, answer: str) -> list[str]:
        """The sentences packed into passages whose prompt, with ``answer``, fits in ``max_tokens``."""
        budget = self.spec.max_tokens - self.count(answer) - SPECIAL_TOKENS - self.count(lettuce_prompt([""], question))
        if budget < 1:
            raise Unjudgeable(f"the claims take {self.count(answer)} of the verifier's {self.spec.max_tokens} tokens, "
                                "leaving none for the context")
        budget = min(budget, self.spec.window_tokens)
        windows: list[str] = []
        members: list[str] = []
        for sentence in sentences:
            if members and self.count(" ".join([*members, sentence])) > budget:
                windows.append(" ".join(members))
                members = []
            members.append(sentence)
        if members:
            windows.append(" ".join(members))
        # A sentence longer than a window is cut at a token boundary (never the answer).
        return [cut_to_tokens(self.tokenizer, window, budget) for window in windows] or [""]

    def hallucination(self, sentences: list[str], question: str | None, answer: str) -> list[tuple[int, int, float]]:
        """Each answer token's character span in ``answer`` and its highest P(hallucinated) over the windows."""
        torch = self._torch
        highest: dict[tuple[int, int], float] = {}
        with self._lock, torch.inference_mode():
            for window in self.windows(sentences, question, answer):
                # only_first: should a join of prompt and window ever count more than its parts, the
                # prompt's end is cut, never the answer.
                encoding = self.tokenizer(lettuce_prompt([window], question), answer, truncation="only_first",
                                          max_length=self.spec.max_tokens, return_offsets_mapping=True,
                                          return_tensors="pt")
                offsets = encoding.pop("offset_mapping")[0].tolist()
                segments = encoding.sequence_ids(0)
                probabilities = torch.softmax(self.network(**encoding).logits[0], dim=-1)[:, 1].tolist()
                for (start, end), segment, probability in zip(offsets, segments, probabilities, strict=True):
                    if segment == 1 and end > start:
                        highest[(start, end)] = max(probability, highest.get((start, end), 0.0))
        return [(start, end, probability) for (start, end), probability in sorted(highest.items())]


class TokenClassifierBackend(HubVerifierBackend[TokenClassifier]):
    """A LettuceDetect token classifier as a judge (see the module docstring)."""

    capabilities = HubVerifierBackend.capabilities.model_copy(update={"reads_answer": True})
    """As the pair classifiers', and it reads the answer and each claim's span in it."""

    def load(self) -> TokenClassifier:
        return TokenClassifier(self.model, self._record, self._directory)

    def judge(self, payload: VerifyInput) -> VerifyOutput:
        """Verdicts for every claim of one request, from the flags of its answer's tokens."""
        texts = [sentence.text for sentence in payload.sentences]
        spans: list[Span | None] = payload.answer.spans if payload.answer is not None else [None] * len(payload.claims)
        # Each claim's tokens: its span of the answer where known, else its own text in the claims joined.
        flags: list[list[tuple[str, float]]] = [[] for _ in payload.claims]
        if payload.answer is not None and any(span is not None for span in spans):
            answer = payload.answer.text
            tokens = self.classifier.hallucination(texts, payload.question, answer)
            for position, span in enumerate(spans):
                if span is not None:
                    flags[position] = [(answer[a:b], p) for a, b, p in tokens if a < span.end and b > span.start]
        unplaced = [position for position, span in enumerate(spans) if span is None]
        joined = " ".join(payload.claims[position] for position in unplaced)
        if joined:
            tokens = self.classifier.hallucination(texts, payload.question, joined)
            start = 0
            for position in unplaced:
                end = start + len(payload.claims[position])
                flags[position] = [(joined[a:b], p) for a, b, p in tokens if a < end and b > start]
                start = end + 1
        return VerifyOutput(judgements=[self._judgement(position, inside, texts)
                                        for position, inside in enumerate(flags)])

    def _judgement(self, position: int, inside: list[tuple[str, float]], texts: list[str]) -> ClaimJudgement:
        """Claim ``position``'s verdict from its tokens' P(hallucinated): its most hallucinated token's."""
        unsupported = max((p for _, p in inside), default=0.0)
        entailed = unsupported < 1.0 - self.model.threshold
        flagged = [text for text, p in inside if p >= 1.0 - self.model.threshold]
        return ClaimJudgement(
            claim=position,
            label=Label.ENTAILED if entailed else Label.BASELESS,
            evidence=texts if entailed else [],
            rationale=(f"{len(flagged)} of {len(inside)} token(s) flagged hallucinated"
                       + (f": {' '.join(flagged)}" if flagged else "")
                       + f"; highest P(hallucinated) {unsupported:.3f}"),
            confidence=1.0 - unsupported if entailed else unsupported,
            score=JudgeScore(p_unsupported=unsupported, threshold=1.0 - self.model.threshold, decided_by="head"),
        )
