"""The learned head of the embedded verifier: claim features -> a calibrated probability.

The embedded verifier measures each claim against the sentences in view (``ClaimAnalysis`` in
:mod:`rt4chart.judges.embedded.verifier`: MiniLM similarities, content-word coverage, number, negation
and antonym cues). This module turns those measurements into the probability that the claim is
*not* supported by the context, with a logistic regression trained on dev data and a Platt map
fitted on held-out dev folds, and into an answer-level probability. The regression reads the
standardised features and their pairwise products (degree-2 interactions, such as "high
similarity but a missing number"), which scored higher in cross-validation on dev than the
features alone and than gradient-boosted trees.

The trained constants live in ``model.json`` next to this module: plain JSON (feature
names, standardisation, coefficients, Platt parameters, decision thresholds), written by
``python evals/embedded/train.py`` and never unpickled. Its sha256 is part of the judge's name.

Two heads are shipped: one for requests with a question (RAG QA answers, trained on RAGTruth QA
dev) and one for requests without (summaries, trained on the FaithBench dev part): the two fail
differently (QA answers add background the passages lack, summaries distort the source).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from rt4chart.judges.embedded.verifier import ClaimAnalysis

ARTEFACT = Path(__file__).with_name("model.json")
"""The shipped model (written by evals/embedded/train.py)."""

HeadName = Literal["question", "no_question"]

TOP_SIMILARITIES = 3
"""Best sentence similarities used as features (fewer sentences in view are padded with 0)."""

FEATURES: tuple[str, ...] = (
    "similarity_1",
    "similarity_2",
    "similarity_3",
    "coverage",
    "best_overlap",
    "missing_share",
    "missing",
    "log_content_words",
    "log_words",
    "question_share",
    "claim_numbers",
    "absent_numbers",
    "cue_number",
    "cue_negation",
    "cue_antonym",
    "cue_overlap",
    "meta",
    "similarity_x_coverage",
)
"""Names of the features, in the order of the coefficients (checked against the artefact)."""


def features(analysis: ClaimAnalysis) -> list[float]:
    """The feature vector of one analysed claim, in :data:`FEATURES` order."""
    top = [*analysis.top_similarities[:TOP_SIMILARITIES]]
    top += [0.0] * (TOP_SIMILARITIES - len(top))
    content = analysis.content_words
    return [
        *top,
        analysis.coverage,
        analysis.best_overlap,
        analysis.missing / content if content else 0.0,
        float(min(analysis.missing, 10)),
        math.log1p(content),
        math.log1p(analysis.words),
        analysis.question_share,
        float(min(analysis.claim_numbers, 5)),
        float(min(len(analysis.absent_numbers), 5)),
        float(analysis.cue_kind == "number"),
        float(analysis.cue_kind == "negation"),
        float(analysis.cue_kind == "antonym"),
        analysis.cue_overlap,
        float(analysis.meta),
        max(analysis.similarity, 0.0) * analysis.coverage,
    ]


def pairwise(values: Sequence[float]) -> list[float]:
    """The values followed by every product ``values[i] * values[j]`` with i <= j (scikit-learn's
    ``PolynomialFeatures(degree=2, include_bias=False)`` order)."""
    count = len(values)
    return [*values, *(values[i] * values[j] for i in range(count) for j in range(i, count))]


def _sigmoid(value: float) -> float:
    if value >= 0:
        return 1.0 / (1.0 + math.exp(-value))
    exponential = math.exp(value)
    return exponential / (1.0 + exponential)


def _logit(probability: float) -> float:
    clipped = min(max(probability, 1e-6), 1 - 1e-6)
    return math.log(clipped / (1 - clipped))


class Platt(BaseModel):
    """A Platt map ``sigmoid(slope * x + intercept)`` fitted on held-out dev folds."""

    model_config = ConfigDict(frozen=True)

    slope: float
    """Weight of the input score."""
    intercept: float
    """Bias."""

    def __call__(self, value: float) -> float:
        return _sigmoid(self.slope * value + self.intercept)


class Guard(BaseModel):
    """A negation or antonym cue on a sentence that says nearly what the claim says makes the claim
    contradicted, whatever the regression says: real dev data hold too few such contradictions
    for the regression to learn them; seeded synthetic flips (evals/embedded/synthetic.py) choose
    how close the sentence must be, at a measured cost on real dev claims."""

    model_config = ConfigDict(frozen=True)

    overlap: float = Field(ge=0.0, le=1.0)
    """Share of the claim's content words the cue's sentence must hold."""
    similarity: float = Field(ge=-1.0, le=1.0)
    """Embedding similarity the claim's best-matching sentence must reach."""

    def fires(self, analysis: ClaimAnalysis) -> bool:
        """Whether the guard calls this analysed claim contradicted."""
        return (
            analysis.cue_kind in ("negation", "antonym")
            and analysis.cue_overlap >= self.overlap
            and analysis.similarity >= self.similarity
        )


class Head(BaseModel):
    """One trained head: standardised features and their pairwise products, standardised again ->
    logistic regression -> Platt -> probability."""

    model_config = ConfigDict(frozen=True)

    mean: list[float]
    """Per-feature mean of the training claims (standardisation)."""
    scale: list[float]
    """Per-feature standard deviation of the training claims (1 where constant)."""
    expanded_mean: list[float]
    """Mean of each standardised feature and pairwise product over the training claims."""
    expanded_scale: list[float]
    """Standard deviation of each of them (1 where constant)."""
    coefficients: list[float]
    """Logistic-regression weights of the standardised expanded features."""
    intercept: float
    """Logistic-regression bias."""
    claim_calibration: Platt
    """Maps the regression's logit to a calibrated P(claim not supported)."""
    threshold: float = Field(ge=0.0, le=1.0)
    """A claim with calibrated P(not supported) at or above this is labelled not entailed; chosen on
    dev for the answer-level target metric (F1 for QA, balanced accuracy for summaries)."""
    answer_calibration: Platt
    """Maps the logit of the answer score (1 - prod of the claims' P(supported)) to a calibrated
    P(answer hallucinated)."""
    guard: Guard | None = None
    """The negation/antonym guard chosen on dev for this head; None where every setting tried cost
    more than the training script allows."""
    training: dict[str, float | int | str]
    """What it was trained on and its held-out (cross-validated) dev figures, for the record."""

    @model_validator(mode="after")
    def _widths(self) -> Head:
        expanded = len(pairwise([0.0] * len(FEATURES)))
        if not len(self.mean) == len(self.scale) == len(FEATURES):
            raise ValueError(f"a head needs {len(FEATURES)} feature means and scales")
        if not len(self.expanded_mean) == len(self.expanded_scale) == len(self.coefficients) == expanded:
            raise ValueError(f"a head needs {expanded} expanded means, scales and coefficients")
        return self

    def unsupported_probability(self, vector: Sequence[float]) -> float:
        """Calibrated probability that the claim with feature ``vector`` is not supported."""
        standard = [(value - mean) / scale for value, mean, scale in zip(vector, self.mean, self.scale, strict=True)]
        expanded = pairwise(standard)
        logit = self.intercept + sum(
            weight * (value - mean) / scale
            for weight, value, mean, scale in zip(
                self.coefficients, expanded, self.expanded_mean, self.expanded_scale, strict=True
            )
        )
        return self.claim_calibration(logit)

    def answer_probability(self, unsupported: Sequence[float]) -> float:
        """Calibrated probability that an answer is hallucinated, from its claims' P(not supported).

        The score is 1 - prod(1 - p) (some claim is unsupported, as if claims were independent);
        the Platt map corrects for their dependence. An answer without claims scores 0.
        """
        supported = math.prod(1.0 - p for p in unsupported)
        return self.answer_calibration(_logit(1.0 - supported))


class ModelArtefact(BaseModel):
    """The shipped file: the feature names it was trained with and one head per request kind."""

    model_config = ConfigDict(frozen=True)

    features: list[str]
    """Feature names in coefficient order; must equal :data:`FEATURES`."""
    heads: dict[HeadName, Head]
    """``question`` for requests with a question, ``no_question`` for the others."""
    command: str
    """The command that wrote the file."""

    @model_validator(mode="after")
    def _features_match(self) -> ModelArtefact:
        if tuple(self.features) != FEATURES:
            raise ValueError("the model file was trained on other features than this code computes; retrain it")
        return self

    def head(self, has_question: bool) -> Head:
        """The head for a request with or without a question."""
        return self.heads["question" if has_question else "no_question"]

    def with_thresholds(self, thresholds: Mapping[HeadName, float]) -> ModelArtefact:
        """This model with the claim threshold of each head named in ``thresholds`` replaced (a
        calibrated judge profile's ``claim_thresholds``, written by ``rt4 calibrate``)."""
        heads = {name: head.model_copy(update={"threshold": thresholds[name]}) if name in thresholds else head
                 for name, head in self.heads.items()}
        return self.model_copy(update={"heads": heads})


def artefact_sha256(path: Path = ARTEFACT) -> str:
    """sha256 of the model file's bytes; ``absent`` before the first training (loading it fails)."""
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"


@cache
def load_model(path: Path = ARTEFACT) -> ModelArtefact:
    """Read and validate the model file (once per process and path); ValueError when unusable."""
    try:
        return ModelArtefact.model_validate_json(path.read_bytes())
    except OSError as error:
        raise ValueError(f"cannot read the embedded verifier's model {path}: {error}") from error
