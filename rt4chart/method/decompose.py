"""Answer -> claims. Every claim keeps the answer sentence (and its span) it came from.

The decomposer sees the answer (and the question only when the audit allows it), never the
context, so claims cannot be bent towards what the context happens to say.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import lru_cache

from rt4chart.languages import ENGLISH
from rt4chart.method.session import JudgeSession
from rt4chart.method.tasks import (
    DecomposeInput,
    DecomposeOutput,
    DecomposeSentenceInput,
    HolisticDecomposeInput,
    HolisticDecomposeOutput,
    SentenceClaims,
)
from rt4chart.method.text import STOPWORDS, content_words, numbers_in, same_number, shown_number
from rt4chart.options import AuditOptions
from rt4chart.protocol import JudgeRequest
from rt4chart.types import Claim, DecompositionStats, Sentence, Span

_CLAUSE_BREAK = re.compile(r"\s*;\s+")

NO_CLAIMS = "the judge found no claim in a non-empty answer; used one claim per sentence"
"""The error of a decomposition that returns no claim at all. An answer with nothing to check
would pass, so text that talks the judge out of every claim (or a judge that fails that way)
falls back to the rule-based claims, which are then judged, and the record says so."""


_PLACEHOLDER = re.compile(r"<[^<>]{1,40}>")
"""A template placeholder (``<claim>``, ``<sentence number>``) that a weak model copies as a claim."""
_NAME = re.compile(r"\b[A-Z][\w'-]*")
"""A capitalised word: a name, as far as spelling can tell (a capitalised function word that opens
the claim is not one)."""
NOUN_CAPITALISING = frozenset({"de", "lb"})
"""Languages that capitalise every noun, where a capitalised word is not a name by its spelling."""
CLAIM_SHARE = 0.5
"""Share of a claim's content words that must come from its own sentence (a pronoun's or an elided
subject's referent, spelled out from the rest of the answer or the question, counts as its own)."""
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:['\u2019][^\W\d_]+)*")
_REFERRING = frozenset({
    "it", "its", "itself", "they", "them", "their", "theirs", "themselves", "he", "him", "his", "himself",
    "she", "her", "hers", "herself", "this", "these", "those",
})
"""Words whose referent a claim may spell out from elsewhere ("It sells cakes." -> "Store 1 sells cakes.")."""


def _stem(word: str) -> str:
    # Enough morphology to match "opens" with "opening" and "cakes" with "cake"; a check of
    # provenance, not of meaning, so a crude prefix errs towards accepting.
    return word[:5]


@lru_cache(maxsize=4096)
def _stems(text: str) -> frozenset[str]:
    # Cached as numbers_in is: every claim of a sentence asks for the same sentence and rest of the answer.
    return frozenset(_stem(word) for word in content_words(text) if not word[0].isdigit())


@dataclass(frozen=True)
class _ClaimToken:
    """A word or number of a claim, and where it comes from."""

    text: str
    own: bool
    """Its sentence states it (a number) or holds its stem (a word)."""
    neutral: bool
    """A function word or a single letter: it says nothing about where the claim comes from."""
    around: bool
    """The rest of the answer or the question states or holds it (where a referent may come from)."""


def _claim_tokens(claim: str, sentence: str, around: str) -> list[_ClaimToken]:
    own_numbers, own_stems = numbers_in(sentence), _stems(sentence)
    # What the rest of the answer holds is read only for a claim with a token its own sentence lacks: most
    # claims are pieces of their sentence, and reading the rest once per claim made the default decomposition
    # path's client CPU grow with the square of the answer's length.
    tokens = []
    for match in _TOKEN.finditer(claim):
        text = match.group()
        lower = text.lower()
        if text[0].isdigit():
            values = numbers_in(text)
            own = bool(values) and all(same_number(value, own_numbers) for value in values)
            tokens.append(_ClaimToken(text, own, neutral=False, around=False))
        else:
            neutral = lower in STOPWORDS or len(lower) < 2
            tokens.append(_ClaimToken(text, not neutral and _stem(lower) in own_stems, neutral, around=False))
    if all(token.own or token.neutral for token in tokens):
        # ``around`` is read only for a token neither its own nor neutral (_referents, claim_problem).
        return tokens
    around_numbers, around_stems = numbers_in(around), _stems(around)
    return [
        token if token.own or token.neutral
        else replace(token, around=_around(token.text, around_numbers, around_stems))
        for token in tokens
    ]


def _around(text: str, around_numbers: frozenset[Decimal], around_stems: frozenset[str]) -> bool:
    """Whether the rest of the answer or the question states the number or holds the stem ``text``."""
    if text[0].isdigit():
        values = numbers_in(text)
        return bool(values) and all(same_number(value, around_numbers) for value in values)
    return _stem(text.lower()) in around_stems


def _referents(tokens: list[_ClaimToken], sentence: str) -> set[int]:
    """Positions of the claim's tokens that spell out a referent of its sentence: one stretch of
    words the rest of the answer or the question holds for each referring word of the sentence
    (the leftmost first); in a sentence without one, the lead before the claim's first own word when
    the sentence opens with that word (an elided subject: "Sells cakes." -> "Store 1 sells cakes.")."""
    stretches: list[list[int]] = []
    current: list[int] = []
    for position, token in enumerate([*tokens, None]):
        if token is not None and not token.own and (token.neutral or token.around):
            current.append(position)
            continue
        while current and tokens[current[-1]].neutral:
            current.pop()
        while current and tokens[current[0]].neutral:
            current.pop(0)
        if current:
            stretches.append(current)
        current = []
    referring = sum(word.lower() in _REFERRING for word in _TOKEN.findall(sentence))
    if referring:
        return {position for stretch in stretches[:referring] for position in stretch}
    first_own = next((position for position, token in enumerate(tokens) if token.own), None)
    opening = next(iter(content_words(sentence)), None)
    if first_own is None or opening is None or _stem(tokens[first_own].text.lower()) != _stem(opening):
        return set()
    return {position for stretch in stretches if stretch[-1] < first_own for position in stretch}


def claim_problem(claim: str, sentence: str, answer: str, question: str | None, language: str = ENGLISH) -> str | None:
    """Why ``claim`` is not a piece of its answer ``sentence``; ``None`` when it may be.

    A claim belongs to its own sentence: all its numbers and names, and at least
    :data:`CLAIM_SHARE` of its content words, come from that sentence, except a referent that a
    pronoun or an elided subject of the sentence leaves to its neighbours ("It sells cakes." ->
    "Store 1 sells cakes."), which may be spelled out from the rest of the ``answer`` or the
    ``question``. A claim is a decomposition failure when it is a template placeholder; states a
    number its sentence does not (replaced, or taken from elsewhere); names something its sentence
    does not name; takes content words from another sentence of the answer beyond such a referent;
    shares no content word or number with its sentence; or has too few of its words from it. A
    paraphrased verb passes; what fails is text its sentence does not say, such as a claim that an
    instruction elsewhere in the answer dictated.
    """
    if any(tag not in sentence for tag in _PLACEHOLDER.findall(claim)):  # markup the answer has is not one
        return f"the claim {claim!r} is a template placeholder"
    elsewhere = answer.replace(sentence, " ", 1)
    around = f"{elsewhere} {question or ''}"
    sentence_numbers, claim_numbers = numbers_in(sentence), numbers_in(claim)
    foreign = sorted(n for n in claim_numbers if not same_number(n, numbers_in(f"{answer} {question or ''}")))
    replaced = [n for n in claim_numbers if not same_number(n, sentence_numbers)] and [
        n for n in sentence_numbers if not same_number(n, claim_numbers)
    ]
    if foreign or replaced:
        listed = ", ".join(shown_number(n) for n in foreign or sorted(claim_numbers - sentence_numbers))
        return f"the claim {claim!r} states {listed}, which its sentence does not"
    tokens = _claim_tokens(claim, sentence, around)
    resolved = _referents(tokens, sentence)
    loose = [token for position, token in enumerate(tokens) if not token.own and position not in resolved]
    referent_numbers = numbers_in(" ".join(tokens[position].text for position in sorted(resolved)))
    taken_numbers = sorted(n for n in claim_numbers
                           if not same_number(n, sentence_numbers) and not same_number(n, referent_numbers))
    if taken_numbers:
        listed = ", ".join(f"{n:g}" for n in taken_numbers)
        return f"the claim {claim!r} states {listed}, which its sentence does not"
    # German capitalises every noun: a capitalised word is no name there, and the claim's share of
    # its sentence's words below is the check that remains.
    capitalised = set() if language in NOUN_CAPITALISING else {
        position for position, token in enumerate(tokens) if _NAME.fullmatch(token.text) and not token.neutral
    }
    names = [token.text for position, token in enumerate(tokens) if position in capitalised
             and token.text.lower() not in sentence.lower() and position not in resolved]
    unknown = [name for name in names if name.lower() not in around.lower()]
    if unknown:
        return f"the claim {claim!r} names {unknown}, which the answer does not"
    if names:
        return f"the claim {claim!r} names {names}, which its sentence does not"
    candidates = [token.text for token in loose if not token.neutral and not token.text[0].isdigit()]
    elsewhere_stems = _stems(elsewhere) if candidates else frozenset()
    taken = [text for text in candidates if _stem(text.lower()) in elsewhere_stems]
    if taken:
        return f"the claim {claim!r} takes {taken} from another sentence of the answer"
    words = [position for position, token in enumerate(tokens) if not token.neutral and not token.text[0].isdigit()]
    shared_number = any(same_number(n, sentence_numbers) for n in claim_numbers)
    if (words or claim_numbers) and not (any(tokens[position].own for position in words) or shared_number):
        return f"the claim {claim!r} shares no word or number with its answer sentence {sentence!r}"
    belonging = [position for position in words if tokens[position].own or position in resolved]
    if len(belonging) < CLAIM_SHARE * len(words):
        return f"the claim {claim!r} shares too few words with its answer sentence"
    return None


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


def rule_decomposition(sentences: list[Sentence]) -> Decomposition:
    """:func:`decompose_by_rules` with its stats."""
    stats = DecompositionStats(mode="rules", sentences=len(sentences))
    return Decomposition(decompose_by_rules(sentences), [], stats)


def decompose_request(
    session: JudgeSession, sentences: list[Sentence], question: str | None
) -> JudgeRequest:
    """The request that asks the judge for the claims of every answer sentence."""
    return session.request(DecomposeInput(question=question, sentences=[s.text for s in sentences]))


@dataclass
class Decomposition:
    """The claims of one answer and how they were obtained."""

    claims: list[Claim]
    errors: list[str] = field(default_factory=list)
    stats: DecompositionStats | None = None
    nothing_to_check: bool = False
    """The answer holds no word or number to verify (punctuation, emoji, invisible characters):
    no claim, and a defined verdict instead (:data:`NOTHING_TO_CHECK`)."""


NOTHING_TO_CHECK = (
    "the answer states nothing to check (no word or number in it): baseless, since an answer must "
    "never pass for saying nothing"
)


def nothing_to_check(sentences: list[Sentence]) -> Decomposition | None:
    """The decomposition of an answer with no content word or number in any sentence; ``None``
    for an answer with something to check. No judge is asked: there is no claim to give it."""
    if any(content_words(s.text) for s in sentences):
        return None
    stats = DecompositionStats(mode="none", sentences=len(sentences), without_claims=len(sentences))
    return Decomposition([], [NOTHING_TO_CHECK], stats, nothing_to_check=True)


async def decompose_by_judge(
    session: JudgeSession,
    sentences: list[Sentence],
    question: str | None,
    max_per_sentence: int,
    per_sentence: bool = False,
) -> Decomposition:
    """Ask the judge for the claims of every answer sentence, keeping each claim's sentence.

    Batched (one call for the answer): the reply counts only where its sentence numbers can be
    trusted. A reply with a number out of range or twice is numbered wrongly as a whole (one that
    counts from 1 shifts every sentence), so every sentence is asked again; otherwise only the
    sentences it left out are. ``per_sentence`` asks one call per sentence from the start (the
    paper's reference). A sentence asked again is asked alone, with the rest of the answer shown
    read-only; one whose call fails keeps its rule-based claims. A claim that is not a piece of its
    sentence (:func:`claim_problem`: a placeholder, a dictated claim) is a decomposition failure:
    the sentence is asked again alone (once more in per-sentence mode), then keeps its rule-based
    claims. Claims beyond ``max_per_sentence`` are dropped. Everything is reported in the errors
    and the stats.
    """
    stats = DecompositionStats(
        mode="judge-per-sentence" if per_sentence else "judge", sentences=len(sentences)
    )
    errors: list[str] = []
    found: dict[int, list[str]] = {}
    if not per_sentence:
        response = await session.send(decompose_request(session, sentences, question))
        if not isinstance(response.parsed, DecomposeOutput) and not response.raw:
            # No reply at all (a transport failure): asking sentence by sentence would only
            # multiply failing calls.
            stats.rule_fallback = len(sentences)
            errors.append(f"decomposition failed ({response.error}); used the answer's clauses as claims")
            return Decomposition(decompose_by_rules(sentences), errors, stats)
        if isinstance(response.parsed, DecomposeOutput):
            found, problem = _trusted_entries(response.parsed, len(sentences))
        else:
            problem = f"decomposition failed ({response.error})"
        if problem:
            errors.append(f"{problem}; asked the sentences again one by one")
        stats.reasked = len(sentences) - len(found)
    answer = " ".join(s.text for s in sentences)
    for sentence in sentences:
        rejected = _foreign_claims(found.get(sentence.index, []), sentence, answer, question, session.language)
        if rejected:
            stats.rejected_claims += len(rejected)
            errors.append(f"answer sentence {sentence.index}: {'; '.join(rejected)}; asked it again alone")
            del found[sentence.index]
            stats.reasked += not per_sentence
    texts = [s.text for s in sentences]
    pending = [s for s in sentences if s.index not in found]
    # Asked alone at most twice in all: a batched answer's sentence once more after the batch, a
    # per-sentence one once more after its own call; then its clauses stand in.
    for last_try in ([False, True] if per_sentence else [True]):
        requests = [
            session.request(DecomposeSentenceInput(question=question, sentences=texts, target=s.index))
            for s in pending
        ]
        replies = await asyncio.gather(*(session.send(request) for request in requests))
        again: list[Sentence] = []
        for sentence, reply in zip(pending, replies, strict=True):
            if not isinstance(reply.parsed, SentenceClaims):
                errors.append(
                    f"decomposition of answer sentence {sentence.index} failed ({reply.error}); "
                    "used its clauses as claims"
                )
                found[sentence.index] = rule_claims(sentence)
                stats.rule_fallback += 1
                continue
            drawn = [c.strip() for c in reply.parsed.claims if c.strip()]
            rejected = _foreign_claims(drawn, sentence, answer, question, session.language)
            if not rejected:
                found[sentence.index] = drawn
                continue
            stats.rejected_claims += len(rejected)
            if last_try:
                errors.append(f"answer sentence {sentence.index}: {'; '.join(rejected)}; used its clauses as claims")
                found[sentence.index] = rule_claims(sentence)
                stats.rule_fallback += 1
            else:
                errors.append(f"answer sentence {sentence.index}: {'; '.join(rejected)}; asked it again")
                again.append(sentence)
        pending = again
    overlong = [index for index, claims in sorted(found.items()) if len(claims) > max_per_sentence]
    if overlong:
        errors.append(
            f"decomposition gave answer sentences {overlong} more than {max_per_sentence} claims; kept the first"
        )
    stats.without_claims = sum(not found[s.index] for s in sentences)
    claims = claims_from_texts([(s, found[s.index][:max_per_sentence]) for s in sentences])
    if not claims:
        stats.rule_fallback = len(sentences)
        return Decomposition(decompose_by_rules(sentences), [*errors, NO_CLAIMS], stats)
    return Decomposition(claims, errors, stats)


def _foreign_claims(
    claims: list[str], sentence: Sentence, answer: str, question: str | None, language: str
) -> list[str]:
    """Why each claim that is not a piece of ``sentence`` (:func:`claim_problem`) is rejected."""
    return [
        problem for claim in claims if (problem := claim_problem(claim, sentence.text, answer, question, language))
    ]


def _trusted_entries(output: DecomposeOutput, n_sentences: int) -> tuple[dict[int, list[str]], str | None]:
    """The claims of a batched reply by sentence, and why some sentences cannot be taken from it."""
    numbers = [entry.sentence for entry in output.sentences]
    if any(number >= n_sentences for number in numbers) or len(set(numbers)) != len(numbers):
        return {}, f"the decomposition numbered the answer sentences {numbers}, not 0..{n_sentences - 1}"
    found = {entry.sentence: [c.strip() for c in entry.claims if c.strip()] for entry in output.sentences}
    left_out = sorted(set(range(n_sentences)) - set(found))
    return found, f"the decomposition left out answer sentences {left_out}" if left_out else None


def holistic_request(
    session: JudgeSession, answer: str, sentences: list[Sentence], question: str | None
) -> JudgeRequest:
    """The request that asks the judge for the claims of the whole answer at once."""
    return session.request(
        HolisticDecomposeInput(question=question, answer=answer, sentences=[s.text for s in sentences])
    )


async def decompose_holistically(
    session: JudgeSession, answer: str, sentences: list[Sentence], question: str | None, max_per_sentence: int
) -> Decomposition:
    """Ablation: claims drawn from the whole answer in one call, tied to no sentence (so no span).

    A failed call is a failure (no claims, an error), not a silent fallback to sentence claims;
    claims beyond ``max_per_sentence`` times the number of sentences are dropped, with an error.
    """
    stats = DecompositionStats(mode="holistic", sentences=len(sentences))
    response = await session.send(holistic_request(session, answer, sentences, question))
    if not isinstance(response.parsed, HolisticDecomposeOutput):
        return Decomposition([], [f"holistic decomposition failed ({response.error})"], stats)
    texts = [text.strip() for text in response.parsed.claims if text.strip()]
    if not texts:
        return Decomposition(decompose_by_rules(sentences), [NO_CLAIMS], stats)
    limit = max_per_sentence * len(sentences)
    errors = [f"holistic decomposition gave {len(texts)} claims; kept the first {limit}"] * (len(texts) > limit)
    claims = [
        Claim(index=position, text=text, sentence_index=None, answer_span=None)
        for position, text in enumerate(texts[:limit])
    ]
    return Decomposition(claims, errors, stats)


async def decompose_answer(
    session: JudgeSession | None, options: AuditOptions, sentences: list[Sentence], answer: str, question: str | None
) -> Decomposition:
    """The one decomposition front (``rt4 verify``'s pipeline and ``rt4 compare``'s shared claims):
    an answer with nothing to check gets its defined verdict; without a decomposing judge
    (``session`` ``None``) claims come by rules; with one, holistically (``--decomposer holistic``)
    or sentence by sentence. ``answer`` is what the holistic decomposer reads (citation markers out)."""
    if (empty := nothing_to_check(sentences)) is not None:
        return empty
    if session is None:
        return rule_decomposition(sentences)
    if options.decomposer == "holistic":
        return await decompose_holistically(session, answer, sentences, question, options.max_claims_per_sentence)
    return await decompose_by_judge(
        session, sentences, question, options.max_claims_per_sentence, options.decompose_per_sentence
    )
