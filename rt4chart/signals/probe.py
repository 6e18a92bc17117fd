"""Trained probes over AggTruth window features: head selectors, logistic regression, JSON files.

A probe is a class-balanced logistic regression over min-max scaled window features (one
AggTruth feature of the selected heads, plus the passage percentage), as in AggTruth. Training
needs scikit-learn (the ``signals`` extra); applying a saved probe needs only numpy: the file holds
the scaler's ``scale``/``offset`` (``x * scale + offset``, scikit-learn's MinMaxScaler transform),
the coefficients and the intercept, plus what it was trained on (model identity, template version,
feature, selector, window, sha256 of the training data, scikit-learn version). Plain JSON, never a
pickle: loading a probe runs no code.

Head selectors, each decided on the training windows only. The first four are AggTruth's (Matys
et al. 2025, section 3.2):

- ``center:R``: per head, the median of the feature over positive windows divided by its median
  over negative windows; keep the R/2 heads with the highest and the R/2 with the lowest ratio (R a
  count of heads, or a fraction in (0, 1) of all heads; an odd count gives the extra head to the
  highest). A median ratio of 0/0 counts as 1 (no difference between the classes);
- ``random:N:K``: Boruta-like. Append a uniform random column, fit the class-balanced logistic
  regression on the scaled heads and that column, and mark every head whose |coefficient| beats the
  random column's; repeat N times (seeded); keep the heads marked at least K times;
- ``random-positive:N:K`` (the paper's Random+): as ``random``, but a head is marked only when its
  coefficient is positive and beats the random column's |coefficient| (a larger value means more
  likely hallucinated);
- ``spearman``: Spearman's rho of each head's window feature with the window label; keep the heads
  whose |rho| is above half the highest |rho|.

Our own, kept beside them:

- ``spearman:significant`` / ``spearman:R``: heads that correlate at Spearman p < 0.001, ranked by
  |rho|; every one of them, or the top fraction R of all heads;
- ``lasso`` / ``lasso:C``: heads with a non-zero coefficient in an L1-penalised, class-balanced
  logistic regression (inverse strength C, default 0.05) on the scaled features;
- ``best-of-random:N:K``: N seeded random sets of K heads, each fitted on 80% of the training
  answers and scored by AUROC on the other 20%; the best set is kept;
- ``best-of-random-positive:N:K``: the best random set, then only its heads whose coefficient is
  positive, refitted;
- ``layers-center:R``: every head of the central fraction R of the layers;
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


SelectorKind = Literal[
    "center",
    "random",
    "random-positive",
    "spearman",
    "spearman-significant",
    "lasso",
    "best-of-random",
    "best-of-random-positive",
    "layers-center",
    "all",
]
COUNTED_KINDS: dict[str, SelectorKind] = {
    kind: kind for kind in ("random", "random-positive", "best-of-random", "best-of-random-positive")
}
"""Selectors written ``KIND:N:K``."""
SELECTOR_SYNTAX = (
    "center:R, random:N:K, random-positive:N:K, spearman (AggTruth's), spearman:significant, spearman:R, "
    "lasso, lasso:C, best-of-random:N:K, best-of-random-positive:N:K, layers-center:R or all"
)
"""Every selector string :func:`parse_selector` reads, for help texts and errors."""


@dataclass(frozen=True)
class Selector:
    """A parsed head selector (see the module docstring)."""

    kind: SelectorKind
    fraction: float | None = None
    """``center``: share of all heads; ``spearman-significant``: top share (None: every significant head);
    ``layers-center``: share of the layers."""
    count: int = 0
    """``center``: heads kept (when no fraction is given); ``random*``: repeats N; ``best-of-random*``: sets N."""
    size: int = 0
    """``random*``: times a head must be marked (K); ``best-of-random*``: heads per set (K)."""
    lasso_c: float = DEFAULT_LASSO_C

    def __str__(self) -> str:
        if self.kind == "spearman-significant":
            return f"spearman:{'significant' if self.fraction is None else f'{self.fraction:g}'}"
        if self.kind == "lasso":
            return f"lasso:{self.lasso_c:g}"
        if self.kind in COUNTED_KINDS:
            return f"{self.kind}:{self.count}:{self.size}"
        if self.kind == "center":
            return f"center:{self.count if self.fraction is None else f'{self.fraction:g}'}"
        if self.kind == "layers-center":
            return f"layers-center:{self.fraction:g}"
        return self.kind


def parse_selector(text: str) -> Selector:
    """One of :data:`SELECTOR_SYNTAX`; anything else is a :class:`SignalError` that lists them."""
    kind, *arguments = text.strip().split(":")
    try:
        if kind == "spearman" and not arguments:
            return Selector("spearman")
        if kind == "all" and not arguments:
            return Selector("all")
        if kind == "spearman" and len(arguments) == 1:
            if arguments[0] == "significant":
                return Selector("spearman-significant")
            return Selector("spearman-significant", fraction=_fraction(float(arguments[0])))
        if kind == "lasso" and len(arguments) <= 1:
            c = float(arguments[0]) if arguments else DEFAULT_LASSO_C
            if not (math.isfinite(c) and c > 0):
                raise ValueError
            return Selector("lasso", lasso_c=c)
        if kind in COUNTED_KINDS and len(arguments) == 2:
            count, size = int(arguments[0]), int(arguments[1])
            # Boruta-like selectors accept a head marked K of N times, so K cannot exceed N.
            if count < 1 or size < 1 or (kind.startswith("random") and size > count):
                raise ValueError
            return Selector(COUNTED_KINDS[kind], count=count, size=size)
        if kind == "center" and len(arguments) == 1:
            value = float(arguments[0])
            if 0 < value < 1:
                return Selector("center", fraction=value)
            if value.is_integer() and value >= 1:
                return Selector("center", count=int(value))
            raise ValueError
        if kind == "layers-center" and len(arguments) == 1:
            return Selector("layers-center", fraction=_fraction(float(arguments[0])))
    except ValueError:
        pass
    raise SignalError(
        f"unknown head selector {text!r}: use {SELECTOR_SYNTAX} "
        "(R of center a head count or a fraction in (0, 1); other R a fraction in (0, 1]; K <= N for random)"
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
        return _median_ratio_extremes(head_matrix, windows.labels, selector)
    if selector.kind in ("random", "random-positive"):
        return _boruta_heads(head_matrix, windows.labels, selector, seed)
    if selector.kind == "spearman":
        scored = _spearman_scores(head_matrix, windows.labels)
        if not scored:
            raise SignalError("no head's feature varies with the labels; more training data needed")
        half_best = max(rho for rho, _, _ in scored) / 2
        chosen = sorted(column for rho, _, column in scored if rho > half_best)
        if not chosen:
            raise SignalError("no head's feature correlates with the labels (every rho is 0)")
        return chosen
    if selector.kind == "spearman-significant":
        return _spearman_significant(head_matrix, windows.labels, selector.fraction)
    if selector.kind == "layers-center":
        assert selector.fraction is not None
        kept = max(1, round(windows.layers * selector.fraction))
        low = (windows.layers - kept) // 2
        return list(range(low * windows.heads, (low + kept) * windows.heads))
    if selector.kind == "lasso":
        model = fit_scaled_logistic(head_matrix, windows.labels, l1_c=selector.lasso_c)
        chosen = [column for column, weight in enumerate(model.coefficients) if weight != 0.0]
        if not chosen:
            raise SignalError(f"lasso:{selector.lasso_c:g} kept no head; use a larger C")
        return chosen
    return _best_of_random(windows, selector, seed)


def _median_ratio_extremes(matrix: FloatArray, labels: BoolArray, selector: Selector) -> list[int]:
    """AggTruth's Center: the heads whose class medians differ most, on both sides of the ratio."""
    heads = matrix.shape[1]
    kept = selector.count if selector.fraction is None else max(1, round(selector.fraction * heads))
    if kept > heads:
        raise SignalError(f"{selector}: more heads asked for than the model's {heads}")
    if labels.all() or not labels.any():
        raise SignalError(f"{selector}: the training windows need both classes")
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.median(matrix[labels], axis=0) / np.median(matrix[~labels], axis=0)
    # 0/0: both classes' medians are zero, so the head does not tell them apart.
    ratio = np.where(np.isnan(ratio), 1.0, ratio)
    order = np.argsort(ratio, kind="stable")  # ties keep column order, so the choice is deterministic
    lowest, highest = order[: kept // 2], order[heads - (kept - kept // 2) :]
    return sorted(int(column) for column in np.concatenate([lowest, highest]))


def _boruta_heads(matrix: FloatArray, labels: BoolArray, selector: Selector, seed: int) -> list[int]:
    """AggTruth's Random / Random+: heads that beat an appended random column often enough."""
    generator = np.random.default_rng(seed)
    marked = np.zeros(matrix.shape[1], dtype=np.int64)
    for _ in range(selector.count):
        shadow = generator.random(len(labels))
        weights = np.asarray(fit_scaled_logistic(np.column_stack([matrix, shadow]), labels).coefficients)
        heads, bar = weights[:-1], abs(float(weights[-1]))
        marked += (heads > bar) if selector.kind == "random-positive" else (np.abs(heads) > bar)
    chosen = [int(column) for column in np.flatnonzero(marked >= selector.size)]
    if not chosen:
        raise SignalError(f"{selector}: no head beat the random column {selector.size} times of {selector.count}")
    return chosen


def _spearman_scores(matrix: FloatArray, labels: BoolArray) -> list[tuple[float, float, int]]:
    """(|rho|, p, column) of every head whose feature is not constant."""
    from scipy.stats import spearmanr

    scored = []
    for column in range(matrix.shape[1]):
        values = matrix[:, column]
        if np.ptp(values) == 0:
            continue
        result = spearmanr(values, labels)
        rho, p = float(result.statistic), float(result.pvalue)
        if math.isfinite(rho):
            scored.append((abs(rho), p, column))
    return scored


def _spearman_significant(matrix: FloatArray, labels: BoolArray, fraction: float | None) -> list[int]:
    scored = sorted(
        ((rho, column) for rho, p, column in _spearman_scores(matrix, labels) if p < SPEARMAN_P), reverse=True
    )
    if not scored:
        raise SignalError(f"no head correlates with the labels at Spearman p < {SPEARMAN_P}; more training data needed")
    keep = len(scored) if fraction is None else max(1, min(len(scored), math.ceil(fraction * matrix.shape[1])))
    return sorted(column for _, column in scored[:keep])


def _best_of_random(windows: WindowSet, selector: Selector, seed: int) -> list[int]:
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
    for _ in range(selector.count):
        columns = sorted(generator.sample(range(count), selector.size))
        model = fit_scaled_logistic(windows.matrix[train][:, columns], windows.labels[train])
        score = float(roc_auc_score(windows.labels[test], model.probabilities(windows.matrix[test][:, columns])))
        if best is None or score > best[0]:
            best = (score, columns)
    assert best is not None
    if selector.kind == "best-of-random":
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
