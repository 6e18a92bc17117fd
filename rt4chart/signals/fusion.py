"""Claim-level fusion of the judge's verdict with white-box signals over the claim's answer span.

Beyond the papers, and off by default: a class-balanced logistic regression on min-max scaled
claim features, trained on a dev split, that re-scores each claim as P(not supported). Features:

- ``judge_unsupported``: 1 when the judge's final label is not entailed, 0 when entailed, 0.5 when
  the judge gave none;
- ``judge_p_unsupported``: the judge's confidence turned into P(not entailed) (``confidence`` for
  a non-entailed label, ``1 - confidence`` for an entailed one; the 0/1 label when the judge
  reports no confidence);
- per named token signal (an AggTruth probe's token scores, CSR, ...): its mean and max over the
  tokens that overlap the claim's answer span (the whole answer when the claim has no span).

A claim's gold label: its answer span overlaps a gold hallucinated span. Stored as JSON like the
probes (:class:`rt4chart.signals.probe.ScaledLogistic`), applied in plain numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ValidationError

from rt4chart.records.io import write_lines_atomically
from rt4chart.signals.base import SignalError
from rt4chart.signals.probe import BoolArray, FloatArray, ScaledLogistic, fit_scaled_logistic
from rt4chart.types import ClaimVerdict, Label, Span

FUSION_FORMAT = 1
"""Version of the fusion file format."""
JUDGE_FEATURES = ("judge_unsupported", "judge_p_unsupported")

TokenValues = Sequence[tuple[int, int, float]]
"""A token signal: (start, end, value) per answer token, offsets into the answer."""


def judge_features(claim: ClaimVerdict) -> list[float]:
    """``judge_unsupported`` and ``judge_p_unsupported`` of one claim."""
    if claim.label is None:
        return [0.5, 0.5]
    unsupported = 0.0 if claim.label == Label.ENTAILED else 1.0
    if claim.confidence is None or not math.isfinite(claim.confidence):
        return [unsupported, unsupported]
    confidence = min(max(claim.confidence, 0.0), 1.0)
    return [unsupported, confidence if unsupported else 1.0 - confidence]


def span_statistics(tokens: TokenValues, span: Span | None) -> tuple[float, float]:
    """Mean and max of the values of the tokens overlapping ``span`` (all tokens when ``span`` is None)."""
    values = [v for start, end, v in tokens if span is None or (start < span.end and end > span.start)]
    if not values:
        values = [v for _, _, v in tokens]
    if not values:
        raise SignalError("a token signal without tokens cannot describe a claim")
    return float(np.mean(values)), float(np.max(values))


def signal_feature_names(signals: Sequence[str]) -> list[str]:
    """Column names of the fusion rows for these named token signals."""
    return [*JUDGE_FEATURES, *(f"{name}_{stat}" for name in signals for stat in ("mean", "max"))]


def claim_row(claim: ClaimVerdict, signals: Mapping[str, TokenValues]) -> list[float]:
    """One claim's fusion features, signals in the mapping's order."""
    row = judge_features(claim)
    for tokens in signals.values():
        row.extend(span_statistics(tokens, claim.answer_span))
    return row


def claim_is_hallucinated(claim: ClaimVerdict, gold: Sequence[Span]) -> bool:
    """Gold label of a claim: its answer span overlaps a gold hallucinated span."""
    span = claim.answer_span
    return span is not None and any(g.start < span.end and g.end > span.start for g in gold)


class FusionTraining(BaseModel):
    """What a fusion model was trained on."""

    data_sha256: str
    """sha256 of the training claims' rows and labels."""
    claims: int
    """Training claims."""
    positive_claims: int
    """Claims whose span overlaps a gold hallucinated span."""
    sklearn_version: str
    """scikit-learn version that fitted the model."""


class FusionModel(BaseModel):
    """A trained claim-level combiner, as stored in its JSON file."""

    format: int = FUSION_FORMAT
    """File format version."""
    features: list[str]
    """Column names, in order (see :func:`signal_feature_names`)."""
    classifier: ScaledLogistic
    """Scaler and logistic regression over the columns."""
    threshold: float = 0.5
    """Claims scoring at or above it are relabelled as not supported."""
    training: FusionTraining
    """What it was trained on."""

    def scores(self, rows: FloatArray) -> FloatArray:
        """P(not supported) of each claim row."""
        if rows.ndim != 2 or rows.shape[1] != len(self.features):
            raise SignalError(f"the fusion model expects {len(self.features)} columns ({', '.join(self.features)})")
        return self.classifier.probabilities(rows)


def fit_fusion(names: Sequence[str], rows: FloatArray, labels: BoolArray) -> FusionModel:
    """Fit the combiner on claim rows (dev data only)."""
    import hashlib

    import sklearn

    if rows.shape != (len(labels), len(names)):
        raise SignalError("fusion rows, labels and names disagree in size")
    digest = hashlib.sha256(rows.astype(np.float64).tobytes() + labels.astype(np.uint8).tobytes()).hexdigest()
    return FusionModel(
        features=list(names),
        classifier=fit_scaled_logistic(rows, labels),
        training=FusionTraining(
            data_sha256=digest,
            claims=len(labels),
            positive_claims=int(labels.sum()),
            sklearn_version=sklearn.__version__,
        ),
    )


def save_fusion(model: FusionModel, path: Path) -> None:
    """Write the model as indented JSON (through io's atomic writer: a temporary file, fsynced, then a rename)."""
    write_lines_atomically(path, [model.model_dump_json(indent=1)])


def load_fusion(path: Path) -> FusionModel:
    """Read a fusion file; a missing, damaged or other-version file is a :class:`SignalError`."""
    try:
        model = FusionModel.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise SignalError(f"cannot read the fusion model {path}: {error.strerror or error}") from None
    except ValidationError as error:
        raise SignalError(f"{path} is not an rt4chart fusion file ({error.errors()[0]['msg']})") from None
    if model.format != FUSION_FORMAT or len(model.classifier.coefficients) != len(model.features):
        raise SignalError(f"{path}: unsupported fusion format or a classifier that does not match its features")
    return model
