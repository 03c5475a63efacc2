"""Reference models for the evaluate step: what a model must beat to be worth registering.

Each baseline is fitted on the training split (the rows the model learned from) and scored on
the evaluated split with the same metrics as the model (:func:`trainer.steps.evaluate.metrics.
score_predictions`), so the report and the gate compare like with like:

- ``trivial``: the majority class with the training class frequencies as probabilities
  (classification) or the training mean (regression): a model worse than this learned nothing;
- ``linear``: scikit-learn's ``LogisticRegression`` or ``Ridge``;
- ``hgb``: scikit-learn's ``HistGradientBoostingClassifier`` or ``...Regressor``.

The features are the preprocessed ones (imputed, standardised, one-hot), as the model sees them.
Tables larger than :data:`MAX_FIT_ROWS` fit the baselines on a seeded sample of that many rows.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from trainer.steps.evaluate.metrics import Scored, score_predictions

__all__ = [
    "BASELINES",
    "MAX_FIT_ROWS",
    "FittedBaseline",
    "baseline_label",
    "fit_and_score",
    "fit_baselines",
    "log_scored",
    "sample_rows",
]

log = logging.getLogger(__name__)

BASELINES = ("trivial", "linear", "hgb")
"""The baselines, in report order."""
MAX_FIT_ROWS = 200_000
"""Training rows a baseline is fitted on at most (a seeded sample beyond that)."""

SINGLE_THREAD_CELLS = 4_000_000
"""Training cells (rows x features) up to which a baseline is fitted on one thread."""

_LABELS = {
    ("trivial", "classification"): "majority class",
    ("trivial", "regression"): "training mean",
    ("linear", "classification"): "logistic regression",
    ("linear", "regression"): "ridge regression",
    ("hgb", "classification"): "histogram gradient boosting",
    ("hgb", "regression"): "histogram gradient boosting",
}


def baseline_label(name: str, task: str) -> str:
    """What a baseline is, in words (``majority class``, ``ridge regression`` ...)."""
    return _LABELS.get((name, task), name)


def _estimator(name: str, task: str, seed: int) -> Any:
    from sklearn.dummy import DummyClassifier, DummyRegressor
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression, Ridge

    classify = task == "classification"
    if name == "trivial":
        return DummyClassifier(strategy="prior") if classify else DummyRegressor(strategy="mean")
    if name == "linear":
        return LogisticRegression(max_iter=1000) if classify else Ridge()
    if classify:
        return HistGradientBoostingClassifier(random_state=seed)
    return HistGradientBoostingRegressor(random_state=seed)


def _predicted(model: Any, x: np.ndarray, task: str, num_classes: int | None) -> np.ndarray:
    """Probabilities over all ``num_classes`` (a class absent from training gets 0), or values."""
    if task != "classification":
        return np.asarray(model.predict(x), dtype=np.float64)
    assert num_classes is not None  # classification always knows its classes
    proba = np.zeros((x.shape[0], num_classes), dtype=np.float64)
    proba[:, np.asarray(model.classes_, dtype=np.int64)] = model.predict_proba(x)
    # float64 rounding can leave rows a hair off 1, which scikit-learn's log_loss warns about.
    return proba / proba.sum(axis=1, keepdims=True)


@dataclass(slots=True)
class FittedBaseline:
    """A baseline fitted on the training rows, ready to predict batch by batch."""

    name: str
    model: Any
    threads: int | None
    rows: int
    seconds: float

    def predict(self, x: np.ndarray, task: str, num_classes: int | None) -> np.ndarray:
        """Probabilities over all classes, or values, for the rows ``x``."""
        with threadpool_limits(limits=self.threads):
            return _predicted(self.model, x, task, num_classes)


def sample_rows(n: int, seed: int = 0) -> np.ndarray | None:
    """The sorted rows of ``n`` training rows that the baselines fit on, or None for all of them
    (at most :data:`MAX_FIT_ROWS`, drawn with ``seed``)."""
    if n <= MAX_FIT_ROWS:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, MAX_FIT_ROWS, False))


def fit_baselines(
    task: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    *,
    seed: int = 0,
    names: tuple[str, ...] = BASELINES,
) -> list[FittedBaseline]:
    """Fit each baseline on the training rows (a sample of :data:`MAX_FIT_ROWS` if more).

    A baseline needs at least two classes in the training rows (classification) except
    ``trivial``; one that cannot be fitted is left out, with a log line saying why.
    """
    keep = sample_rows(len(y_train), seed)
    if keep is not None:
        x_train, y_train = x_train[keep], y_train[keep]
    out = []
    one_class = task == "classification" and len(np.unique(y_train)) < 2
    for name in names:
        if one_class and name != "trivial":
            log.info("baseline %s skipped: the training split holds a single class", name)
            continue
        started = time.perf_counter()
        # Small fits lose more to OpenMP's thread start-up and spinning than they gain
        # (4-10x slower with 2 threads on a busy 2-core machine): one thread below that size.
        threads = 1 if x_train.size <= SINGLE_THREAD_CELLS else None
        with threadpool_limits(limits=threads):
            model = _estimator(name, task, seed).fit(x_train, y_train)
        out.append(
            FittedBaseline(name, model, threads, len(y_train), time.perf_counter() - started)
        )
    return out


def log_scored(fitted: FittedBaseline, task: str, scored: Scored) -> None:
    """The log line of a baseline fitted and scored."""
    log.info(
        "baseline %s (%s) fitted on %d rows in %.1f s: %s",
        fitted.name,
        baseline_label(fitted.name, task),
        fitted.rows,
        fitted.seconds,
        ", ".join(f"{k} {v:.4g}" for k, v in scored.metrics.items()),
    )


def fit_and_score(
    task: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_eval: np.ndarray,
    y_eval: np.ndarray,
    *,
    num_classes: int | None,
    seed: int = 0,
    names: tuple[str, ...] = BASELINES,
) -> dict[str, Scored]:
    """Fit each baseline on the training rows and score it on the evaluated rows.

    Args:
        task: ``classification`` or ``regression``.
        x_train: Training features ``[N, F]``.
        y_train: Training class ids or values ``[N]``.
        x_eval: Features of the evaluated split.
        y_eval: Its class ids or values.
        num_classes: Classes of the task (classification).
        seed: Seeds the row sample and the boosting.
        names: Which baselines, in order.

    Returns:
        Each baseline's predictions and metrics, by name (see :func:`fit_baselines`).
    """
    out: dict[str, Scored] = {}
    for fitted in fit_baselines(task, x_train, y_train, seed=seed, names=names):
        started = time.perf_counter()
        predicted = fitted.predict(x_eval, task, num_classes)
        fitted.seconds += time.perf_counter() - started
        out[fitted.name] = score_predictions(task, y_eval, predicted)
        log_scored(fitted, task, out[fitted.name])
    return out
