"""Trained probes over AggTruth window features: head selectors, logistic regression, JSON files.

A probe is a class-balanced logistic regression over min-max scaled window features (one
AggTruth feature of the selected heads, plus the passage percentage), as in AggTruth. Training
needs scikit-learn (the ``signals`` extra); applying a saved probe needs only numpy: the file holds
the scaler's ``scale``/``offset`` (``x * scale + offset``, scikit-learn's MinMaxScaler transform),
the coefficients and the intercept, plus what it was trained on (model identity, template version,
feature, selector, window, sha256 of the training data, scikit-learn version). Plain JSON, never a
pickle: loading a probe runs no code.

Head selectors (our reading of the paper's, each decided on the training data only):

- ``spearman:R`` / ``spearman:auto``: heads whose window feature correlates with the window label
  at Spearman p < 0.001, ranked by |rho|; keep the top fraction R of all heads (``auto``: every
  significant head);
- ``lasso`` / ``lasso:C``: heads with a non-zero coefficient in an L1-penalised, class-balanced
  logistic regression (inverse strength C, default 0.05) on the scaled features;
- ``random:N:K``: N seeded random sets of K heads, each fitted on 80% of the training answers and
  scored by AUROC on the other 20%; the best set is kept;
- ``random-positive:N:K``: the best random set, then only its heads whose coefficient is positive
  (a larger value means more likely hallucinated), refitted;
- ``center:R``: every head of the central fraction R of the layers;
- ``all``: every head.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ValidationError

from rt4chart.records.io import write_lines_atomically
from rt4chart.signals.attention import FEATURES, WINDOW, AttentionFeatures, token_labels, window_average, window_labels
from rt4chart.signals.base import SignalError
from rt4chart.types import Span

PROBE_FORMAT = 1
"""Version of the probe file format; a file of another version is refused."""
SPEARMAN_P = 0.001
"""Significance a head needs for the Spearman selector."""
DEFAULT_LASSO_C = 0.05
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


class ScaledLogistic(BaseModel):
    """Min-max scaling followed by logistic regression, as plain numbers."""

    scale: list[float]
    """Per input column, multiplied first (scikit-learn MinMaxScaler ``scale_``)."""
    offset: list[float]
    """Per input column, added after scaling (MinMaxScaler ``min_``)."""
    coefficients: list[float]
    """Logistic regression weights, one per input column."""
    intercept: float
    """Logistic regression intercept."""

    def probabilities(self, matrix: FloatArray) -> FloatArray:
        """P(positive) of each row, in plain numpy."""
        scaled = matrix * np.asarray(self.scale) + np.asarray(self.offset)
        logits = scaled @ np.asarray(self.coefficients) + self.intercept
        result: FloatArray = 1.0 / (1.0 + np.exp(-logits))
        return result


def fit_scaled_logistic(matrix: FloatArray, labels: BoolArray, *, l1_c: float | None = None) -> ScaledLogistic:
    """Class-balanced logistic regression on min-max scaled columns (L1 with inverse strength ``l1_c``)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import MinMaxScaler

    if len(set(labels.tolist())) < 2:
        raise SignalError("training data needs both positive and negative windows")
    scaler = MinMaxScaler().fit(matrix)
    if l1_c is None:
        model = LogisticRegression(class_weight="balanced", max_iter=2000)
    else:
        model = LogisticRegression(class_weight="balanced", l1_ratio=1.0, C=l1_c, solver="liblinear", max_iter=2000)
    model.fit(scaler.transform(matrix), labels)
    return ScaledLogistic(
        scale=[float(v) for v in scaler.scale_],
        offset=[float(v) for v in scaler.min_],
        coefficients=[float(v) for v in model.coef_[0]],
        intercept=float(model.intercept_[0]),
    )


@dataclass(frozen=True)
class Selector:
    """A parsed head selector (see the module docstring)."""

    kind: Literal["spearman", "lasso", "random", "random-positive", "center", "all"]
    fraction: float | None = None
    sets: int = 0
    size: int = 0
    lasso_c: float = DEFAULT_LASSO_C

    def __str__(self) -> str:
        if self.kind == "spearman":
            return f"spearman:{'auto' if self.fraction is None else f'{self.fraction:g}'}"
        if self.kind == "lasso":
            return f"lasso:{self.lasso_c:g}"
        if self.kind in ("random", "random-positive"):
            return f"{self.kind}:{self.sets}:{self.size}"
        if self.kind == "center":
            return f"center:{self.fraction:g}"
        return "all"


def parse_selector(text: str) -> Selector:
    """``spearman:auto|R``, ``lasso[:C]``, ``random:N:K``, ``random-positive:N:K``, ``center:R``, ``all``."""
    kind, *arguments = text.strip().split(":")
    try:
        if kind == "spearman" and len(arguments) == 1:
            if arguments[0] == "auto":
                return Selector("spearman")
            return Selector("spearman", fraction=_fraction(float(arguments[0])))
        if kind == "lasso" and len(arguments) <= 1:
            c = float(arguments[0]) if arguments else DEFAULT_LASSO_C
            if not (math.isfinite(c) and c > 0):
                raise ValueError
            return Selector("lasso", lasso_c=c)
        if kind in ("random", "random-positive") and len(arguments) == 2:
            sets, size = int(arguments[0]), int(arguments[1])
            if sets < 1 or size < 1:
                raise ValueError
            return Selector("random" if kind == "random" else "random-positive", sets=sets, size=size)
        if kind == "center" and len(arguments) == 1:
            return Selector("center", fraction=_fraction(float(arguments[0])))
        if kind == "all" and not arguments:
            return Selector("all")
    except ValueError:
        pass
    raise SignalError(
        f"unknown head selector {text!r}: use spearman:auto, spearman:R, lasso, lasso:C, random:N:K, "
        "random-positive:N:K, center:R or all (R a fraction in (0, 1])"
    )


def _fraction(value: float) -> float:
    if not (0 < value <= 1):
        raise ValueError
    return value


@dataclass
class WindowSet:
    """Window features of one AggTruth feature over a set of answers."""

    matrix: FloatArray
    """``[window, layer*head + 1]``: heads layer-major, the passage percentage last."""
    labels: BoolArray
    """Per window: holds a gold hallucinated token."""
    answers: npt.NDArray[np.int64]
    """Per window: index of its answer."""
    layers: int
    heads: int

    @property
    def answer_count(self) -> int:
        return int(self.answers.max()) + 1 if len(self.answers) else 0


def build_windows(
    features: Sequence[AttentionFeatures], spans: Sequence[Sequence[Span]], feature: str, window: int = WINDOW
) -> WindowSet:
    """Windows of every answer (gold spans give the labels)."""
    if feature not in FEATURES:
        raise SignalError(f"feature must be one of {', '.join(FEATURES)} (got {feature!r})")
    if not features:
        raise SignalError("no answers to build windows from")
    matrices, labels, answers = [], [], []
    for index, (item, gold) in enumerate(zip(features, spans, strict=True)):
        averaged = window_average(item.token_matrix(feature), window)
        matrices.append(averaged)
        labels.append(window_labels(token_labels(item.offsets, gold), window))
        answers.append(np.full(len(averaged), index, dtype=np.int64))
    layers, heads = features[0].heads
    return WindowSet(np.concatenate(matrices), np.concatenate(labels), np.concatenate(answers), layers, heads)


def select_heads(windows: WindowSet, selector: Selector, *, seed: int = 0) -> list[int]:
    """Columns (``layer * heads + head``) the selector keeps, decided on these windows only."""
    count = windows.layers * windows.heads
    head_matrix = windows.matrix[:, :count]
    if selector.kind == "all":
        return list(range(count))
    if selector.kind == "center":
        assert selector.fraction is not None
        kept = max(1, round(windows.layers * selector.fraction))
        low = (windows.layers - kept) // 2
        return list(range(low * windows.heads, (low + kept) * windows.heads))
    if selector.kind == "spearman":
        return _spearman(head_matrix, windows.labels, selector.fraction)
    if selector.kind == "lasso":
        model = fit_scaled_logistic(head_matrix, windows.labels, l1_c=selector.lasso_c)
        chosen = [column for column, weight in enumerate(model.coefficients) if weight != 0.0]
        if not chosen:
            raise SignalError(f"lasso:{selector.lasso_c:g} kept no head; use a larger C")
        return chosen
    return _random_heads(windows, selector, seed)


def _spearman(matrix: FloatArray, labels: BoolArray, fraction: float | None) -> list[int]:
    from scipy.stats import spearmanr

    scored = []
    for column in range(matrix.shape[1]):
        values = matrix[:, column]
        if np.ptp(values) == 0:
            continue
        result = spearmanr(values, labels)
        rho, p = float(result.statistic), float(result.pvalue)
        if math.isfinite(p) and p < SPEARMAN_P:
            scored.append((abs(rho), column))
    if not scored:
        raise SignalError(f"no head correlates with the labels at Spearman p < {SPEARMAN_P}; more training data needed")
    scored.sort(reverse=True)
    keep = len(scored) if fraction is None else max(1, min(len(scored), math.ceil(fraction * matrix.shape[1])))
    return sorted(column for _, column in scored[:keep])


def _random_heads(windows: WindowSet, selector: Selector, seed: int) -> list[int]:
    from sklearn.metrics import roc_auc_score

    count = windows.layers * windows.heads
    if selector.size > count:
        raise SignalError(f"{selector}: K is larger than the model's {count} heads")
    generator = random.Random(seed)
    answers = list(range(windows.answer_count))
    held_out = set(generator.sample(answers, max(1, len(answers) // 5)))
    validation = np.isin(windows.answers, list(held_out))
    train, test = ~validation, validation
    if len(set(windows.labels[test].tolist())) < 2 or len(set(windows.labels[train].tolist())) < 2:
        raise SignalError(
            f"{selector}: the training answers' 80/20 split needs positive and negative windows on both sides"
        )
    best: tuple[float, list[int]] | None = None
    for _ in range(selector.sets):
        columns = sorted(generator.sample(range(count), selector.size))
        model = fit_scaled_logistic(windows.matrix[train][:, columns], windows.labels[train])
        score = float(roc_auc_score(windows.labels[test], model.probabilities(windows.matrix[test][:, columns])))
        if best is None or score > best[0]:
            best = (score, columns)
    assert best is not None
    if selector.kind == "random":
        return best[1]
    model = fit_scaled_logistic(windows.matrix[:, best[1]], windows.labels)
    positive = [column for column, weight in zip(best[1], model.coefficients, strict=True) if weight > 0]
    if not positive:
        raise SignalError(f"{selector}: no head of the best set has a positive coefficient")
    return positive


class ProbeTraining(BaseModel):
    """What a probe was trained on."""

    data_sha256: str
    """sha256 of the training answers (ids, texts, gold spans)."""
    answers: int
    """Answers in the training data."""
    windows: int
    """Training windows."""
    positive_windows: int
    """Windows holding a gold hallucinated token."""
    sklearn_version: str
    """scikit-learn version that fitted the probe."""
    seed: int
    """Seed of the random selectors."""


class AttentionProbe(BaseModel):
    """A trained AggTruth probe, as stored in its JSON file."""

    format: int = PROBE_FORMAT
    """File format version."""
    signal: Literal["aggtruth"] = "aggtruth"
    """The signal the probe reads."""
    model: str
    """Identity of the model whose attention it reads (name and content hash)."""
    template_version: str
    """Version of the prompt template that placed the context and question."""
    feature: str
    """AggTruth feature: sum, cossim, entropy or jsdiv."""
    window: int
    """Answer tokens per window."""
    selector: str
    """Head selector that chose the heads."""
    layers: int
    """Layers of the model."""
    heads: int
    """Attention heads per layer."""
    columns: list[int]
    """Selected heads as ``layer * heads + head``; the passage percentage follows them."""
    threshold: float = 0.5
    """Windows scoring at or above it are flagged."""
    classifier: ScaledLogistic
    """Scaler and logistic regression over the selected columns."""
    training: ProbeTraining
    """What it was trained on."""

    @property
    def selected_heads(self) -> list[tuple[int, int]]:
        """(layer, head) of every selected column."""
        return [divmod(column, self.heads) for column in self.columns]

    def window_scores(self, matrix: FloatArray) -> FloatArray:
        """P(hallucinated) of each window row (``[window, layer*head + 1]``)."""
        if matrix.shape[1] != self.layers * self.heads + 1:
            raise SignalError(
                f"the probe expects {self.layers}x{self.heads} heads; the features have {matrix.shape[1] - 1} columns"
            )
        return self.classifier.probabilities(matrix[:, [*self.columns, matrix.shape[1] - 1]])

    def check_model(self, identity: str) -> None:
        """Refuse features from another model than the one the probe was trained on."""
        if identity != self.model:
            raise SignalError(f"the probe was trained on {self.model}, not {identity}")


def training_hash(ids: Sequence[str], answers: Sequence[str], spans: Sequence[Sequence[Span]]) -> str:
    """sha256 of the training answers and their gold spans."""
    digest = hashlib.sha256()
    for sample_id, answer, gold in zip(ids, answers, spans, strict=True):
        digest.update(repr((sample_id, answer, [(span.start, span.end) for span in gold])).encode())
    return digest.hexdigest()


def train_probe(
    windows: WindowSet,
    *,
    feature: str,
    selector: Selector,
    model: str,
    template_version: str,
    data_sha256: str,
    window: int = WINDOW,
    seed: int = 0,
) -> AttentionProbe:
    """Select heads, then fit the probe on the selected heads plus the passage percentage."""
    import sklearn

    columns = select_heads(windows, selector, seed=seed)
    passage = windows.matrix.shape[1] - 1
    classifier = fit_scaled_logistic(windows.matrix[:, [*columns, passage]], windows.labels)
    return AttentionProbe(
        model=model,
        template_version=template_version,
        feature=feature,
        window=window,
        selector=str(selector),
        layers=windows.layers,
        heads=windows.heads,
        columns=columns,
        classifier=classifier,
        training=ProbeTraining(
            data_sha256=data_sha256,
            answers=windows.answer_count,
            windows=len(windows.labels),
            positive_windows=int(windows.labels.sum()),
            sklearn_version=sklearn.__version__,
            seed=seed,
        ),
    )


def save_probe(probe: AttentionProbe, path: Path) -> None:
    """Write the probe as indented JSON (through io's atomic writer: a temporary file, fsynced, then a rename)."""
    write_lines_atomically(path, [probe.model_dump_json(indent=1)])


def load_probe(path: Path) -> AttentionProbe:
    """Read a probe file; a missing, damaged or other-version file is a :class:`SignalError`."""
    try:
        raw: Any = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SignalError(f"cannot read the probe {path}: {error.strerror or error}") from None
    try:
        probe = AttentionProbe.model_validate_json(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "file"
        raise SignalError(f"{path} is not an rt4chart probe file ({where}: {first['msg']})") from None
    if probe.format != PROBE_FORMAT:
        raise SignalError(f"{path} is probe format {probe.format}; this rt4chart reads format {PROBE_FORMAT}")
    width = len(probe.columns) + 1
    if (
        len(probe.classifier.coefficients) != width
        or len(probe.classifier.scale) != width
        or len(probe.classifier.offset) != width
    ):
        raise SignalError(f"{path}: the classifier does not match its {len(probe.columns)} selected heads")
    return probe
