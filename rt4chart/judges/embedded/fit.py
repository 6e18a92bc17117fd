"""Fitting the embedded verifier's head: the regression, its C by held-out log loss, the Platt map,
and the :class:`~rt4chart.judges.embedded.model.Head` the verifier runs.

``evals/embedded/train.py`` (the shipped head, on dev splits) and ``rt4 calibrate --refit`` (a head
on a team's own labels) fit with this code, so a refitted head is the shipped one's method on other
labels. Needs scikit-learn (the ``signals`` or ``dev`` extra); the verifier itself applies a head in
plain Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rt4chart.judges.embedded.model import FEATURES, Guard, Head, Platt

if TYPE_CHECKING:
    from numpy.typing import NDArray
    from sklearn.pipeline import Pipeline

C_GRID = (0.003, 0.01, 0.03)
"""Inverse regularisation strengths tried; the one with the best held-out log loss is kept."""

Folds = Sequence[tuple["NDArray[np.int64]", "NDArray[np.int64]"]]
"""(training rows, held-out rows) of each fold."""


def regression(c: float) -> Pipeline:
    """Standardised features and their pairwise products, standardised again -> logistic regression."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures, StandardScaler

    return make_pipeline(
        StandardScaler(),
        PolynomialFeatures(degree=2, include_bias=False),
        StandardScaler(),
        LogisticRegression(C=c, max_iter=5000),
    )


def platt(scores: NDArray[np.float64], outcomes: NDArray[np.bool_]) -> Platt:
    """Fit sigmoid(a * score + b) to outcomes (an almost unregularised 1-D logistic regression)."""
    from sklearn.linear_model import LogisticRegression

    fitted = LogisticRegression(C=1e6).fit(scores.reshape(-1, 1), outcomes)
    return Platt(slope=float(fitted.coef_[0, 0]), intercept=float(fitted.intercept_[0]))


def out_of_fold_logits(
    matrix: NDArray[np.float64], target: NDArray[np.bool_], folds: Folds, c: float
) -> NDArray[np.float64]:
    """Each row's regression logit from the fit on the folds that do not hold it."""
    logits = np.zeros(len(matrix))
    for train, held in folds:
        logits[held] = regression(c).fit(matrix[train], target[train]).decision_function(matrix[held])
    return logits


def choose_c(
    matrix: NDArray[np.float64], target: NDArray[np.bool_], folds: Folds, grid: Sequence[float] = C_GRID
) -> tuple[float, NDArray[np.float64]]:
    """The C of ``grid`` with the lowest out-of-fold log loss, and its out-of-fold logits."""
    from sklearn.metrics import log_loss

    best: tuple[float, float, NDArray[np.float64]] | None = None
    for c in grid:
        logits = out_of_fold_logits(matrix, target, folds, c)
        loss = float(log_loss(target, 1 / (1 + np.exp(-logits)), labels=[False, True]))
        if best is None or loss < best[0]:
            best = (loss, c, logits)
    assert best is not None, "the grid is never empty"
    return best[1], best[2]


def fitted_head(
    fitted: Pipeline, claim_map: Platt, threshold: float, answer_map: Platt, guard: Guard | None,
    training: dict[str, float | int | str], check_rows: NDArray[np.float64],
) -> Head:
    """The :class:`Head` of a fitted :func:`regression`, checked to compute what the pipeline does on
    ``check_rows`` (the shipped arithmetic must be scikit-learn's, to rounding)."""
    scaler, _, expanded_scaler, model = (step for _, step in fitted.steps)
    head = Head(
        mean=[float(x) for x in scaler.mean_],
        scale=[float(x) for x in scaler.scale_],
        expanded_mean=[float(x) for x in expanded_scaler.mean_],
        expanded_scale=[float(x) for x in expanded_scaler.scale_],
        coefficients=[float(x) for x in model.coef_[0]],
        intercept=float(model.intercept_[0]),
        claim_calibration=claim_map,
        threshold=threshold,
        answer_calibration=answer_map,
        guard=guard,
        training=training,
    )
    expected = [claim_map(float(z)) for z in fitted.decision_function(check_rows)]
    computed = [head.unsupported_probability(row.tolist()) for row in check_rows]
    if not np.allclose(expected, computed, atol=1e-9):
        raise AssertionError("Head.unsupported_probability drifted from the fitted scikit-learn pipeline")
    return head


def feature_names(fitted: Pipeline) -> list[str]:
    """Names of the expanded features of a fitted :func:`regression` (for printing its weights)."""
    return [str(name) for name in fitted.steps[1][1].get_feature_names_out(list(FEATURES))]
