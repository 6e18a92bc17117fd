"""Answer -> claims. Every claim keeps the answer sentence (and its span) it came from.

The decomposer sees the answer and the question only, never the context, so claims cannot be
bent towards what the context happens to say.
"""

from __future__ import annotations

import re
from typing import Literal

from rt4chart.backends.base import (
    DecomposeInput,
    DecomposeOutput,
    HolisticDecomposeInput,
    HolisticDecomposeOutput,
    JudgeRequest,
)
from rt4chart.session import JudgeSession
from rt4chart.types import Claim, Sentence, Span

DecomposerKind = Literal["judge", "rules", "auto", "holistic"]

_CLAUSE_BREAK = re.compile(r"\s*;\s+")

NO_CLAIMS = "the judge found no claim in a non-empty answer; used one claim per sentence"
"""The error of a decomposition that returns no claim at all. An answer with nothing to check
would pass, so text that talks the judge out of every claim (or a judge that fails that way)
falls back to the rule-based claims, which are then judged, and the record says so."""


def claims_from_texts(per_sentence: list[tuple[Sentence, list[str]]]) -> list[Claim]:
    """Number claims in answer order, each pointing at its sentence's span."""
    claims: list[Claim] = []
    for sentence, texts in per_sentence:
        for text in texts:
            claims.append(
                Claim(
                    index=len(claims),
                    text=text,
                    sentence_index=sentence.index,
                    answer_span=Span(start=sentence.start, end=sentence.end),
                )
            )
    return claims


def rule_claims(sentence: Sentence) -> list[str]:
    """One claim per clause: a sentence split at semicolons, nothing rewritten."""
    return [part for part in _CLAUSE_BREAK.split(sentence.text) if part.strip()]


def decompose_by_rules(sentences: list[Sentence]) -> list[Claim]:
    """The offline, zero-cost decomposer."""
    return claims_from_texts([(s, rule_claims(s)) for s in sentences])


def decompose_request(
    session: JudgeSession, sentences: list[Sentence], question: str | None
) -> JudgeRequest:
    """The request that asks the judge for the claims of every answer sentence."""
    payload = DecomposeInput(question=question, sentences=[s.text for s in sentences])
    fields = {
        "question": question or "(none)",
        "sentences": "\n".join(f"[{s.index}] {s.text}" for s in sentences),
    }
    return session.request("decompose", "decompose", payload, fields)


async def decompose_by_judge(
    session: JudgeSession, sentences: list[Sentence], question: str | None
) -> tuple[list[Claim], list[str]]:
    """Ask the judge for claims of every answer sentence in one call.

    A sentence the reply leaves out keeps its rule-based claims; a failed call falls back to the
    rule-based decomposer for the whole answer. Both are reported in the returned errors.
    """
    if not sentences:
        return [], []
    response = await session.send(decompose_request(session, sentences, question))
    if not isinstance(response.parsed, DecomposeOutput):
        error = f"decomposition failed ({response.error}); used one claim per sentence"
        return decompose_by_rules(sentences), [error]
    by_sentence: dict[int, list[str]] = {}
    for entry in response.parsed.sentences:
        if entry.sentence < len(sentences) and entry.sentence not in by_sentence:
            by_sentence[entry.sentence] = [c.strip() for c in entry.claims if c.strip()]
    missing = [s.index for s in sentences if s.index not in by_sentence]
    errors = (
        [f"decomposition skipped answer sentences {missing}; used them as claims"] if missing else []
    )
    per_sentence = [(s, by_sentence.get(s.index, rule_claims(s))) for s in sentences]
    claims = claims_from_texts(per_sentence)
    if not claims:
        return decompose_by_rules(sentences), [NO_CLAIMS]
    return claims, errors


def holistic_request(session: JudgeSession, answer: str, question: str | None) -> JudgeRequest:
    """The request that asks the judge for the claims of the whole answer at once."""
    payload = HolisticDecomposeInput(question=question, answer=answer)
    fields = {"question": question or "(none)", "answer": answer}
    return session.request("decompose_holistic", "decompose_holistic", payload, fields)


async def decompose_holistically(
    session: JudgeSession, answer: str, sentences: list[Sentence], question: str | None
) -> tuple[list[Claim], list[str]]:
    """Ablation: claims drawn from the whole answer in one call, tied to no sentence (so no span).

    A failed call falls back to the rule-based, sentence-based claims, reported in the errors.
    """
    if not sentences:
        return [], []
    response = await session.send(holistic_request(session, answer, question))
    if not isinstance(response.parsed, HolisticDecomposeOutput):
        error = f"holistic decomposition failed ({response.error}); used one claim per sentence"
        return decompose_by_rules(sentences), [error]
    texts = [text.strip() for text in response.parsed.claims if text.strip()]
    if not texts:
        return decompose_by_rules(sentences), [NO_CLAIMS]
    claims = [
        Claim(index=position, text=text, sentence_index=None, answer_span=None)
        for position, text in enumerate(texts)
    ]
    return claims, []
