"""The evaluate step's metrics: which each task reports, their direction, and the scoring.

Scores a model's predictions on a split with scikit-learn (imported lazily) and keeps the
results in the plain types KFP's Metrics and ClassificationMetrics take.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np

if TYPE_CHECKING:  # the scoring takes torch's tensors; register reads the directions without it
    import torch

__all__ = [
    "AUTO_METRIC",
    "HIGHER_IS_BETTER",
    "ROC_MAX_POINTS",
    "TASK_METRICS",
    "EvaluateResult",
    "Scored",
    "is_number",
    "roc",
    "score_predictions",
    "softmax",
]

TASK_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "f1_macro", "roc_auc", "log_loss"),
    "regression": ("rmse", "mae", "r2"),
}
"""The metrics each task reports, in report order; any of them can be the gate metric."""
HIGHER_IS_BETTER: dict[str, bool] = {
    "accuracy": True,
    "f1_macro": True,
    "roc_auc": True,
    "log_loss": False,
    "rmse": False,
    "mae": False,
    "r2": True,
}
"""The direction of each metric: which way "beats" points."""
AUTO_METRIC = {"classification": "accuracy", "regression": "rmse"}
"""What ``gate.metric: auto`` means per task."""
ROC_MAX_POINTS = 200
"""KFP's ClassificationMetrics stores the curve in the run's metadata: keep it small."""


@dataclass(kw_only=True)
class EvaluateResult:
    """What evaluate decided, in the plain types KFP's Metrics and ClassificationMetrics take."""

    task: str
    """``classification`` or ``regression``."""
    metrics: dict[str, float]
    """The candidate's scores on the split (a metric undefined on the split is left out)."""
    gate_passed: bool
    """Whether the candidate may be promoted."""
    gate_reason: str
    """One sentence saying why, e.g.
    ``accuracy 0.86 >= threshold 0.8 and beats champion v3 (0.84)``."""
    champion_metrics: dict[str, float] | None
    """The champion's scores (re-scored on the same split, or its stored metrics); None if none."""
    confusion_matrix: list[list[int]] | None
    """Classification: counts, rows = true label, columns = predicted label, in ``labels`` order."""
    labels: list[str] | None
    """Classification: the class names (schema's original labels, else ``"0"``, ``"1"``, ...)."""
    roc: dict[str, list[float]] | None
    """Classification: ``fpr``, ``tpr``, ``thresholds`` (binary: positive class; multiclass:
    micro-average), at most 200 points; None where the split holds a single class."""
    gate_metric: str = ""
    """The metric the gate used (``auto`` resolved)."""
    num_rows: int = 0
    """Rows scored."""
    baselines: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    """Reference models fitted on the training split and scored on the same rows, by name
    (``trivial``, ``linear``, ``hgb``): see :mod:`trainer.steps.evaluate.baselines`."""
    auto_settings: dict[str, Any] | None = None
    cost: dict[str, Any] | None = None
    """The train step's cost estimate and actual (``cost.json``), if recorded."""
    """The training settings chosen from the data (``chosen``, ``user_set``, ``inputs``), as
    the train step recorded them; None if it recorded none."""

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (what ``metrics_uri`` holds)."""
        return dataclasses.asdict(self)


@dataclass
class Scored:
    """A model's predictions and metrics on one split."""

    metrics: dict[str, float]
    y_true: np.ndarray
    y_pred: np.ndarray
    proba: np.ndarray | None = None


def is_number(value: Any) -> TypeGuard[int | float]:
    """A real number (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


# --- Metrics --------------------------------------------------------------------------------------


def softmax(logits: torch.Tensor) -> np.ndarray:
    """Class probabilities of logits, float64."""
    # float64: sklearn checks that multiclass probabilities sum to 1, which float32 can miss.
    return logits.double().softmax(dim=-1).numpy()


def _roc_auc(y: np.ndarray, proba: np.ndarray) -> float | None:
    """Binary: AUC of the positive class; multiclass: one-vs-rest macro average.

    A class absent from the split has no one-vs-rest AUC, so the macro average runs over the
    classes present; with fewer than two classes present there is no AUC at all (None).
    """
    from sklearn.metrics import roc_auc_score

    k = proba.shape[1]
    present = np.unique(y)
    if len(present) < 2:
        return None
    if k == 2:
        return float(roc_auc_score(y, proba[:, 1]))
    if len(present) == k:
        return float(roc_auc_score(y, proba, multi_class="ovr", average="macro", labels=range(k)))
    return float(np.mean([roc_auc_score(y == c, proba[:, c]) for c in present]))


def _downsample(n: int, limit: int) -> np.ndarray:
    """Indices of at most ``limit`` evenly spread points that keep the first and last."""
    if n <= limit:
        return np.arange(n)
    return np.unique(np.round(np.linspace(0, n - 1, limit)).astype(np.int64))


def roc(y: np.ndarray, proba: np.ndarray) -> dict[str, list[float]] | None:
    """ROC points (binary: positive class; multiclass: micro-average), at most 200 of them."""
    from sklearn.metrics import roc_curve

    k = proba.shape[1]
    if len(np.unique(y)) < 2:
        return None
    if k == 2:
        fpr, tpr, thr = roc_curve(y, proba[:, 1])
    else:
        onehot = np.eye(k, dtype=np.int64)[y]
        fpr, tpr, thr = roc_curve(onehot.ravel(), proba.ravel())
    # sklearn's first threshold is +inf ("predict nothing positive"), which JSON cannot hold;
    # no probability exceeds 1, so 1.0 is the same cut for all but exact-1.0 scores.
    thr = np.minimum(thr, 1.0)
    keep = _downsample(len(fpr), ROC_MAX_POINTS)
    return {
        "fpr": [float(v) for v in fpr[keep]],
        "tpr": [float(v) for v in tpr[keep]],
        "thresholds": [float(v) for v in thr[keep]],
    }


def score_predictions(task: str, y: np.ndarray, predicted: np.ndarray) -> Scored:
    """The task's metrics for predictions on a split (non-finite ones are left out).

    Args:
        task: ``classification`` or ``regression``.
        y: True class ids ``[N]`` or target values ``[N]``.
        predicted: Class probabilities ``[N, K]`` (classification) or predicted values ``[N]``
            in the target's units (regression).
    """
    from sklearn.metrics import (
        accuracy_score,
        f1_score,
        log_loss,
        mean_absolute_error,
        mean_squared_error,
        r2_score,
    )

    if task == "classification":
        proba = predicted
        pred = proba.argmax(axis=1)
        metrics: dict[str, float | None] = {
            "accuracy": float(accuracy_score(y, pred)),
            # Macro over the classes seen in truth or predictions: a class absent from both has
            # no F1, and counting it as 0 would punish the model for the split's make-up.
            "f1_macro": float(f1_score(y, pred, average="macro", zero_division=0)),
            "roc_auc": _roc_auc(y, proba),
            "log_loss": float(log_loss(y, proba, labels=range(proba.shape[1]))),
        }
        scored = Scored({}, y, pred, proba)
    else:
        pred = predicted.astype(np.float64)
        y = y.astype(np.float64)
        metrics = {
            "rmse": math.sqrt(float(mean_squared_error(y, pred))),
            "mae": float(mean_absolute_error(y, pred)),
            "r2": float(r2_score(y, pred)) if len(y) > 1 else None,
        }
        scored = Scored({}, y, pred)
    scored.metrics = {k: v for k, v in metrics.items() if v is not None and math.isfinite(v)}
    return scored
