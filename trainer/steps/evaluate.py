"""The evaluate step: score a model on the test split, report it and decide the promotion gate."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import torch

from trainer import outputs, storage
from trainer.data import TabularDataset
from trainer.errors import InputError
from trainer.export import LoadedModel, load_model, predict
from trainer.models import validate_plugin_entries
from trainer.redact import redact

__all__ = [
    "AUTO_METRIC",
    "HIGHER_IS_BETTER",
    "TASK_METRICS",
    "EvaluateConfig",
    "EvaluateResult",
    "GateConfig",
    "decide_gate",
    "evaluate",
    "read_history",
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
HISTORY_FILE = "history.jsonl"
"""The training log the train step places inside the model directory (optional)."""
_TIE_TOLERANCE = 1e-12  # an improvement of exactly min_improvement passes despite float rounding


@dataclass(kw_only=True, slots=True)
class GateConfig:
    """When a candidate model may be promoted."""

    metric: str = "auto"
    """Metric that decides: ``auto`` (classification: accuracy, regression: rmse) or one of
    accuracy, f1_macro, roc_auc, log_loss (classification), rmse, mae, r2 (regression)."""
    threshold: float | None = None
    """The candidate must reach this: at least it for higher-is-better metrics, at most it for
    rmse, mae and log_loss. ``None``: no threshold."""
    min_improvement: float = 0.0
    """Where a champion exists, the candidate must beat it by at least this much in the metric's
    direction; with 0 it must be strictly better (a tie keeps the champion)."""

    def __post_init__(self) -> None:
        known = ["auto", *HIGHER_IS_BETTER]
        if self.metric not in known:
            raise InputError(
                "E_CONFIG",
                f"gate.metric must be one of {known}, got {self.metric!r}",
                "gate.metric",
            )
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise InputError(
                "E_CONFIG",
                f"gate.threshold must be a finite number, got {self.threshold!r}",
                "gate.threshold",
            )
        if not (math.isfinite(self.min_improvement) and self.min_improvement >= 0):
            raise InputError(
                "E_CONFIG",
                f"gate.min_improvement must be >= 0, got {self.min_improvement!r}",
                "gate.min_improvement",
            )


@dataclass(kw_only=True, slots=True)
class EvaluateConfig:
    """How the evaluate step scores and gates a model."""

    gate: GateConfig = field(default_factory=GateConfig)
    """The promotion gate."""
    batch_size: int = 8192
    """Rows per forward pass while scoring."""
    split: str = "test"
    """Which split of the preprocessed dataset to score: ``<dataset>/<split>.parquet``."""
    model_plugins: list[str] = field(default_factory=list)
    """User-model plugins that loading the candidate or the champion may import
    (``package.module:build``, its module, or a package above it), from the installed
    environment only. Built-in models always load; a model whose ``model.json`` names any
    other plugin is refused (E_MODEL) before anything is imported: an artifact never chooses
    which code runs."""

    def __post_init__(self) -> None:
        try:
            validate_plugin_entries(self.model_plugins, "model_plugins")
        except ValueError as e:
            raise InputError("E_CONFIG", str(e), "model_plugins") from e
        if self.batch_size <= 0:
            raise InputError(
                "E_CONFIG", f"batch_size must be > 0, got {self.batch_size!r}", "batch_size"
            )
        if not self.split or "/" in self.split or self.split.startswith("."):
            raise InputError(
                "E_CONFIG",
                f"split must name a split such as 'test' (no slashes), got {self.split!r}",
                "split",
            )


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

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (what ``metrics_uri`` holds)."""
        return dataclasses.asdict(self)


@dataclass
class _Scored:
    """A model's predictions and metrics on one split."""

    metrics: dict[str, float]
    y_true: np.ndarray
    y_pred: np.ndarray
    proba: np.ndarray | None = None


# --- Loading --------------------------------------------------------------------------------------


def _load(uri: str, role: str, allowed_plugins: list[str]) -> LoadedModel:
    """Load a tabular model; a missing, garbled or non-tabular artifact is E_MODEL naming it."""
    try:
        loaded = load_model(uri, allowed_plugins=allowed_plugins)
    except InputError:
        raise
    except ValueError as e:
        raise InputError("E_MODEL", f"{role} model is unusable: {e}", uri) from e
    if loaded.spec.task not in TASK_METRICS:
        raise InputError(
            "E_MODEL",
            f"{role} model has task {loaded.spec.task!r}; evaluate scores "
            f"{' or '.join(TASK_METRICS)} models",
            uri,
        )
    if not loaded.meta.get("features") or not loaded.meta.get("target"):
        raise InputError(
            "E_MODEL", f"{role} model records no feature or target columns in model.json", uri
        )
    return loaded


def _split_columns(split_uri: str) -> list[str]:
    """Column names of the split (a .parquet file or a folder of them), read from one footer."""
    import pyarrow.parquet as pq

    if not storage.exists(split_uri):
        raise InputError("E_DATA", "dataset split not found", split_uri)
    first = split_uri
    if storage.is_dir(split_uri):
        names = [
            n
            for n in storage.list_dir(split_uri)
            if n.endswith(".parquet") and not n.startswith((".", "_"))
        ]
        if not names:
            raise InputError("E_DATA", "dataset split folder holds no .parquet files", split_uri)
        first = storage.join(split_uri, names[0])
    try:
        with storage.open_input(first) as f:
            return list(pq.ParquetFile(f).schema_arrow.names)
    except OSError as e:  # pyarrow's ArrowInvalid for a file that is not Parquet
        raise InputError("E_DATA", f"dataset split is not readable Parquet: {e}", first) from e


def _load_split(loaded: LoadedModel, split_uri: str, columns: list[str]) -> TabularDataset:
    """The split's rows in the model's feature order; missing columns are one E_SCHEMA error."""
    features: list[str] = list(loaded.meta["features"])
    target: str = loaded.meta["target"]
    missing = [c for c in [*features, target] if c not in columns]
    if missing:
        raise InputError(
            "E_SCHEMA",
            f"the split lacks {len(missing)} column(s) the model needs: {', '.join(missing)}",
            split_uri,
        )
    try:
        ds = TabularDataset.from_parquet(
            split_uri, target=target, features=features, task=loaded.spec.task
        )
    except InputError:
        raise
    except ValueError as e:  # names the column and file already
        raise InputError("E_DATA", str(e), split_uri) from e
    k = loaded.spec.num_classes
    if k is not None and len(ds) and int(ds.target.max()) >= k:
        raise InputError(
            "E_SCHEMA",
            f"target {target!r} holds class {int(ds.target.max())}, but the model knows "
            f"{k} classes (0..{k - 1})",
            split_uri,
        )
    return ds


def _labels(loaded: LoadedModel) -> list[str]:
    """Class names: the schema's original labels when they fit, else the class ids."""
    k = loaded.spec.num_classes or 0
    schema = loaded.meta.get("schema")
    classes = schema.get("classes") if isinstance(schema, dict) else None
    if isinstance(classes, list) and len(classes) == k:
        return [str(c) for c in classes]
    return [str(i) for i in range(k)]


def read_history(model_uri: str) -> list[dict[str, Any]] | None:
    """The training log ``<model_uri>/history.jsonl`` as records; None if there is none.

    The log only feeds pictures, so lines that are not JSON objects are skipped rather than
    failing the step.
    """
    uri = storage.join(model_uri, HISTORY_FILE)
    try:
        text = storage.read_text(uri)
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


# --- Metrics --------------------------------------------------------------------------------------


def _softmax(logits: torch.Tensor) -> np.ndarray:
    # float64: sklearn checks that multiclass probabilities sum to 1, which float32 can miss.
    return torch.softmax(logits.double(), dim=-1).numpy()


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


def _roc(y: np.ndarray, proba: np.ndarray) -> dict[str, list[float]] | None:
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


def _score(loaded: LoadedModel, ds: TabularDataset, batch_size: int) -> _Scored:
    """Predict the split and compute the task's metrics (non-finite ones are left out)."""
    from sklearn.metrics import (
        accuracy_score,
        f1_score,
        log_loss,
        mean_absolute_error,
        mean_squared_error,
        r2_score,
    )

    out = predict(loaded, ds.features, batch_size=batch_size)
    y = ds.target.numpy()
    if loaded.spec.task == "classification":
        k = loaded.spec.num_classes
        assert k is not None  # ModelSpec guarantees it for classification
        proba = _softmax(out)
        pred = proba.argmax(axis=1)
        metrics: dict[str, float | None] = {
            "accuracy": float(accuracy_score(y, pred)),
            # Macro over the classes seen in truth or predictions: a class absent from both has
            # no F1, and counting it as 0 would punish the model for the split's make-up.
            "f1_macro": float(f1_score(y, pred, average="macro", zero_division=0)),
            "roc_auc": _roc_auc(y, proba),
            "log_loss": float(log_loss(y, proba, labels=range(k))),
        }
        scored = _Scored({}, y, pred, proba)
    else:
        pred = out.double().numpy()
        y = y.astype(np.float64)
        metrics = {
            "rmse": math.sqrt(float(mean_squared_error(y, pred))),
            "mae": float(mean_absolute_error(y, pred)),
            "r2": float(r2_score(y, pred)) if len(y) > 1 else None,
        }
        scored = _Scored({}, y, pred)
    scored.metrics = {k: v for k, v in metrics.items() if v is not None and math.isfinite(v)}
    return scored


# --- Gate -----------------------------------------------------------------------------------------


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def decide_gate(
    *,
    metric: str,
    value: float | None,
    threshold: float | None,
    min_improvement: float,
    has_champion: bool,
    champion_value: float | None,
    champion_name: str = "",
    champion_note: str = "",
) -> tuple[bool, str]:
    """Apply the threshold and the champion comparison; return (passed, one-sentence reason).

    Args:
        metric: The gate metric; its direction comes from ``HIGHER_IS_BETTER``.
        value: The candidate's score; None when it is undefined on the split (the gate fails).
        threshold: The bar to reach, or None.
        min_improvement: How much the candidate must beat the champion by.
        has_champion: Whether a champion exists.
        champion_value: The champion's score; None when it has none (the gate fails: a
            champion that cannot be compared is not beaten).
        champion_name: How the reason names the champion.
        champion_note: Where the champion's score came from, added in the parentheses.

    Returns:
        Whether the gate passes, and why, e.g.
        ``accuracy 0.86 >= threshold 0.8 and beats champion v3 (0.84)``.
    """
    higher = HIGHER_IS_BETTER[metric]
    if value is None:
        return False, f"{metric} is undefined on this split (one class only), so the gate fails"
    passed = True
    if threshold is None:
        parts = [f"{metric} {_fmt(value)} (no threshold)"]
    else:
        ok = value >= threshold if higher else value <= threshold
        op = (">=" if ok else "<") if higher else ("<=" if ok else ">")
        parts = [f"{metric} {_fmt(value)} {op} threshold {_fmt(threshold)}"]
        passed = ok
    name = f"champion {champion_name}".rstrip()
    note = f"; {champion_note}" if champion_note else ""
    if not has_champion:
        parts.append("no champion to beat")
    elif champion_value is None:
        parts.append(f"{name} has no {metric} to compare against{note}")
        passed = False
    else:
        gain = value - champion_value if higher else champion_value - value
        shown = f"{name} ({_fmt(champion_value)}{note})"
        if gain <= 0:
            parts.append(f"does not beat {shown}")
            passed = False
        elif gain < min_improvement - _TIE_TOLERANCE:
            parts.append(
                f"beats {shown} by only {_fmt(gain)}, less than min_improvement "
                f"{_fmt(min_improvement)}"
            )
            passed = False
        elif min_improvement > 0:
            parts.append(
                f"beats {shown} by {_fmt(gain)} >= min_improvement {_fmt(min_improvement)}"
            )
        else:
            parts.append(f"beats {shown}")
    return passed, " and ".join(parts)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _stored_metric(metrics: dict[str, Any], metric: str) -> tuple[float | None, str]:
    """The champion's stored score for ``metric`` and the key it came from."""
    for key in (metric, f"test_{metric}", f"val_{metric}"):
        value = metrics.get(key)
        if _is_number(value) and math.isfinite(value):
            return float(value), key
    return None, metric


def _incompatibility(candidate: LoadedModel, champion: LoadedModel) -> str | None:
    """Why the champion cannot be re-scored on the candidate's split, or None if it can."""
    c, p = candidate.meta, champion.meta
    if candidate.spec.task != champion.spec.task:
        return f"its task ({champion.spec.task}) differs from the candidate's"
    if p.get("target") != c.get("target"):
        return "its target column differs from the candidate's"
    if p.get("features") != c.get("features"):
        return "its features differ from the candidate's"
    if champion.spec.num_classes != candidate.spec.num_classes:
        return "its classes differ from the candidate's"
    return None


# --- The step -------------------------------------------------------------------------------------


def evaluate(
    cfg: EvaluateConfig,
    *,
    model_uri: str,
    dataset_uri: str,
    report_uri: str,
    champion_model_uri: str | None = None,
    metrics_uri: str | None = None,
    champion_name: str | None = None,
    champion_stored_metrics: dict[str, float] | None = None,
) -> EvaluateResult:
    """Score the model on a split of the dataset, write the report, and decide the gate.

    The champion, if given, is re-scored on the same split so that both models face the same
    rows; when its task, target, features or classes differ (the schema changed), its stored
    metrics are used instead (``champion_stored_metrics``, else its ``metrics.json``) and the
    reason says so. Outputs are written only after
    everything succeeded, each atomically.

    Args:
        cfg: Scoring and gate settings.
        model_uri: The candidate model directory.
        dataset_uri: The preprocessed dataset directory (``<split>.parquet`` inside).
        report_uri: Where the self-contained HTML report goes (a file).
        champion_model_uri: The registry's current champion model directory, if any.
        metrics_uri: Where to write :meth:`EvaluateResult.to_dict` as JSON, if wanted.
        champion_name: How the reason names the champion (e.g. ``v3``); defaults to its URI.
        champion_stored_metrics: The champion's recorded metrics (e.g. from the registry), used
            when it cannot be re-scored; defaults to its ``metrics.json``.

    Returns:
        The metrics, the gate decision and the classification curves.

    Raises:
        InputError: ``E_MODEL`` for a missing or garbled model, ``E_DATA`` for a missing or
            unreadable split, ``E_SCHEMA`` for columns the model needs but the split lacks,
            ``E_CONFIG`` for a gate metric the task does not have.
    """
    # Before any work: the report (a file) must be new or an earlier report of this step.
    inputs = {"model": model_uri, "dataset": dataset_uri, "champion": champion_model_uri}
    for out in (report_uri, metrics_uri):
        if out is not None:
            outputs.check_output_location(out, "evaluate", inputs=inputs, kind="file")
    from trainer.steps import report

    candidate = _load(model_uri, "candidate", cfg.model_plugins)
    task = candidate.spec.task
    metric = AUTO_METRIC[task] if cfg.gate.metric == "auto" else cfg.gate.metric
    if metric not in TASK_METRICS[task]:
        raise InputError(
            "E_CONFIG",
            f"gate.metric {metric!r} does not apply to {task}; choose one of "
            f"{['auto', *TASK_METRICS[task]]}",
            "gate.metric",
        )
    split_uri = storage.join(dataset_uri, f"{cfg.split}.parquet")
    columns = _split_columns(split_uri)
    ds = _load_split(candidate, split_uri, columns)
    scored = _score(candidate, ds, cfg.batch_size)

    champion_metrics: dict[str, float] | None = None
    champion_note = ""
    champion_value: float | None = None
    if champion_model_uri is not None:
        champion = _load(champion_model_uri, "champion", cfg.model_plugins)
        why = _incompatibility(candidate, champion)
        if why is None:
            champion_metrics = _score(champion, ds, cfg.batch_size).metrics
            champion_value = champion_metrics.get(metric)
        else:
            source = "its metrics.json"
            stored: dict[str, Any] = champion.metrics
            if champion_stored_metrics is not None:
                source, stored = "the registry", champion_stored_metrics
            champion_metrics = {
                k: float(v) for k, v in stored.items() if _is_number(v) and math.isfinite(v)
            }
            champion_value, key = _stored_metric(champion_metrics, metric)
            champion_note = f"stored {key} from {source}: {why}, so it was not re-scored"
    passed, reason = decide_gate(
        metric=metric,
        value=scored.metrics.get(metric),
        threshold=cfg.gate.threshold,
        min_improvement=cfg.gate.min_improvement,
        has_champion=champion_model_uri is not None,
        champion_value=champion_value,
        champion_name=champion_name or (champion_model_uri or ""),
        champion_note=champion_note,
    )

    result = EvaluateResult(
        task=task,
        metrics=scored.metrics,
        gate_passed=passed,
        gate_reason=redact(reason),  # it names the champion, e.g. by a URI
        champion_metrics=champion_metrics,
        confusion_matrix=None,
        labels=None,
        roc=None,
        gate_metric=metric,
        num_rows=len(ds),
    )
    if scored.proba is not None:
        from sklearn.metrics import confusion_matrix

        k = scored.proba.shape[1]
        cm = confusion_matrix(scored.y_true, scored.y_pred, labels=range(k))
        result.confusion_matrix = [[int(v) for v in row] for row in cm]
        result.labels = _labels(candidate)
        result.roc = _roc(scored.y_true, scored.proba)

    html = report.render_report(
        result,
        model_uri=model_uri,
        dataset_uri=dataset_uri,
        split=cfg.split,
        champion_uri=champion_model_uri,
        champion_rescored=champion_model_uri is not None and not champion_note,
        history=read_history(model_uri),
        y_true=scored.y_true if task == "regression" else None,
        y_pred=scored.y_pred if task == "regression" else None,
    )
    # Everything is computed: only now touch the outputs, so a failure above leaves none.
    outputs.write_output_file(report_uri, html, step="evaluate")
    if metrics_uri is not None:
        body = json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n"
        outputs.write_output_file(metrics_uri, body, step="evaluate")
    return result
