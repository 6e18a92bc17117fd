"""Seeded synthetic training claims for the embedded verifier, made from dev contexts.

    python evals/embedded/synthetic.py --dataset ragtruth-qa --seed 0 --show 20   # print examples

The dev data holds few contradictions of the kinds users meet first (5 of 3,606 RAGTruth QA dev
claims carry a number cue), so the learned head never saw "closed" said of what the context calls
"open". This module rewrites context sentences into claims whose label is known by construction:

- ``copy`` (supported): the sentence itself;
- ``number`` (unsupported): one number or year changed;
- ``negation`` (unsupported): a negation added after the first auxiliary verb, or removed;
- ``antonym`` (unsupported): a word replaced by an opposite from the verifier's antonym table;
- ``entity`` (unsupported): a name replaced by another name of the same context;
- ``qualifier`` (unsupported): a hedge or quantifier dropped ("may cause" -> "cause");
- ``elsewhere`` (unsupported): a sentence copied from another source's context.

Every rewrite of a sentence comes with its ``copy``, so the head learns what the change does,
not that near-copies are suspect. Generation is deterministic for a seed (Python's ``random``
seeded per source, sources visited in sorted order). ``evals/embedded/train.py`` adds these claims
to the training folds only (never to the folds it scores), grouped with the source they came from.
"""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from rt4chart.analysis.datasets import load_dataset, source_key
from rt4chart.judges.embedded.verifier import ANTONYMS
from rt4chart.method.text import segment_context
from rt4chart.types import Sample

Kind = Literal["copy", "number", "negation", "antonym", "entity", "qualifier", "elsewhere"]
REWRITES: tuple[Kind, ...] = ("number", "negation", "antonym", "entity", "qualifier", "elsewhere")
SENTENCES_PER_SOURCE = 12
"""Context sentences rewritten per source (each yields its copy and up to two rewrites)."""
REWRITES_PER_SENTENCE = 2
MIN_WORDS, MAX_WORDS = 6, 40
"""Sentences usable as claims: long enough to state something, short enough to be one claim."""

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_NUMBER = re.compile(r"(?<![\d.,])\d+(?:[.,]\d+)*(?![\d.,]*\d)")
_AUXILIARY = re.compile(
    r"\b(is|are|was|were|will|can|could|should|would|has|have|had|does|do|did|must)\b(\s+not\b|n't)?",
    re.IGNORECASE,
)
_NEGATED_VERB = re.compile(
    r"\b(is|are|was|were|will|can|could|should|would|has|have|had|does|do|did|must)(\s+not\b|n't)", re.IGNORECASE
)
_NEVER = re.compile(r"\s+never\b", re.IGNORECASE)
_NAME = re.compile(r"(?<=\s)[A-Z][a-z]{2,}\b")
_PASSAGE_LABEL = re.compile(r"^passage \d+:\s*", re.IGNORECASE)
"""RAGTruth QA contexts label their passages ("passage 2:..."): not part of a claim."""
QUALIFIERS = frozenset((
    "some", "many", "most", "often", "usually", "sometimes", "occasionally", "generally", "mostly",
    "may", "might", "could", "possibly", "probably", "likely", "partly", "partially", "nearly",
    "almost", "several", "few", "certain", "typically", "rarely",
))
"""Hedges and quantifiers that narrow a statement; dropping one says more than the context."""
_SWAPPED_MODALS = {"may": "will", "might": "will", "could": "will"}


@dataclass(frozen=True)
class SyntheticClaim:
    """One generated claim about one source's context."""

    source: str
    """Key of the source (the sha256 of its context), the cross-validation group."""
    sample: int
    """Index (in the dataset) of a sample with that context: its sentences and question are used."""
    claim: str
    """The claim text."""
    kind: Kind
    """How it was made."""
    unsupported: bool
    """Its label by construction (only ``copy`` is supported)."""


def _changed_number(sentence: str, rng: random.Random) -> str | None:
    matches = list(_NUMBER.finditer(sentence))
    if not matches:
        return None
    match = rng.choice(matches)
    text = match.group()
    value = float(text.replace(",", ""))
    if value.is_integer() and 1000 <= value <= 2100:
        new = f"{int(value) + rng.choice([-7, -3, -2, -1, 1, 2, 3, 5])}"
    elif value.is_integer():
        new = f"{int(value) * rng.choice([2, 3]) + rng.choice([1, 2, 5])}"
    else:
        new = f"{value * rng.choice([1.5, 2, 3]):.{len(text.split('.')[-1]) if '.' in text else 0}f}"
    return sentence[: match.start()] + new + sentence[match.end() :]


def _flipped_negation(sentence: str, rng: random.Random) -> str | None:
    negated = _NEGATED_VERB.search(sentence)
    if negated:
        return sentence[: negated.end(1)] + sentence[negated.end(2) :]
    never = _NEVER.search(sentence)
    if never:
        return sentence[: never.start()] + sentence[never.end() :]
    auxiliary = _AUXILIARY.search(sentence)
    if auxiliary:
        return sentence[: auxiliary.end(1)] + " not" + sentence[auxiliary.end(1) :]
    return None


def _with_antonym(sentence: str, rng: random.Random) -> str | None:
    candidates = [m for m in _WORD.finditer(sentence) if m.group().lower() in ANTONYMS]
    if not candidates:
        return None
    match = rng.choice(candidates)
    opposite = rng.choice(sorted(ANTONYMS[match.group().lower()]))
    if match.group()[0].isupper():
        opposite = opposite.capitalize()
    return sentence[: match.start()] + opposite + sentence[match.end() :]


def _without_qualifier(sentence: str, rng: random.Random) -> str | None:
    candidates = [m for m in _WORD.finditer(sentence) if m.group().lower() in QUALIFIERS]
    if not candidates:
        return None
    match = rng.choice(candidates)
    word = match.group().lower()
    if word in _SWAPPED_MODALS:
        return sentence[: match.start()] + _SWAPPED_MODALS[word] + sentence[match.end() :]
    end = match.end() + 1 if sentence[match.end() : match.end() + 1] == " " else match.end()
    rest = sentence[end:]
    if match.start() == 0:
        rest = rest[:1].upper() + rest[1:]
    return sentence[: match.start()] + rest


def rewrites(sentence: str, names: list[str], elsewhere: list[str], rng: random.Random) -> dict[Kind, str]:
    """Every rewrite of ``sentence`` that applies (``names``: names of its context; ``elsewhere``:
    sentences of other sources)."""

    def swapped_entity(text: str, generator: random.Random) -> str | None:
        present = list(_NAME.finditer(text))
        others = [n for n in names if n not in text]
        if not present or not others:
            return None
        match = generator.choice(present)
        return text[: match.start()] + generator.choice(others) + text[match.end() :]

    makers: dict[Kind, Callable[[str, random.Random], str | None]] = {
        "number": _changed_number,
        "negation": _flipped_negation,
        "antonym": _with_antonym,
        "entity": swapped_entity,
        "qualifier": _without_qualifier,
        "elsewhere": lambda _text, generator: generator.choice(elsewhere) if elsewhere else None,
    }
    made: dict[Kind, str] = {}
    for kind in REWRITES:
        rewritten = makers[kind](sentence, rng)
        if rewritten and rewritten != sentence:
            made[kind] = rewritten
    return made


def generate(samples: list[Sample], seed: int) -> list[SyntheticClaim]:
    """Synthetic claims for every source of ``samples`` (deterministic for ``seed``)."""
    first_sample: dict[str, int] = {}
    for index, sample in enumerate(samples):
        first_sample.setdefault(source_key(sample), index)
    usable: dict[str, list[str]] = {}
    for key, index in first_sample.items():
        _, sentences = segment_context(samples[index].context)
        texts = [_PASSAGE_LABEL.sub("", s.text) for s in sentences]
        usable[key] = [text for text in texts if MIN_WORDS <= len(text.split()) <= MAX_WORDS]
    claims: list[SyntheticClaim] = []
    for key in sorted(usable):
        rng = random.Random(f"{seed}:{key}")
        own = usable[key]
        names = sorted({m.group() for text in own for m in _NAME.finditer(text)})
        other_key = rng.choice([k for k in sorted(usable) if k != key and usable[k]] or [key])
        elsewhere = usable[other_key] if other_key != key else []
        for sentence in rng.sample(own, min(SENTENCES_PER_SOURCE, len(own))):
            made = rewrites(sentence, names, elsewhere, rng)
            claims.append(SyntheticClaim(key, first_sample[key], sentence, "copy", False))
            for kind in rng.sample(sorted(made), min(REWRITES_PER_SENTENCE, len(made))):
                claims.append(SyntheticClaim(key, first_sample[key], made[kind], kind, True))
    return claims


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="ragtruth-qa", help="dev dataset whose contexts are rewritten")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=20, help="claims to print")
    args = parser.parse_args()
    claims = generate(load_dataset(args.dataset, split="dev"), args.seed)
    counts: dict[str, int] = {}
    for claim in claims:
        counts[claim.kind] = counts.get(claim.kind, 0) + 1
    print(f"{len(claims)} synthetic claims from {len({c.source for c in claims})} sources: {counts}")
    for claim in claims[: args.show]:
        print(f"{claim.kind:>10} {'unsupported' if claim.unsupported else 'supported':>11}  {claim.claim}")


if __name__ == "__main__":
    main()
