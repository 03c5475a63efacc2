"""The evaluate step: score a model on the test split, report it and decide the promotion gate.

The step itself (loading the models and the split, comparing with the champion, writing the
outputs) lives here; the metrics in :mod:`trainer.steps.evaluate.metrics`, the gate in
:mod:`trainer.steps.evaluate.gate`, the HTML page in :mod:`trainer.steps.evaluate.report`.
What other code may use is exported by :mod:`trainer.steps.evaluate`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainer.base import outputs, storage
from trainer.base.errors import InputError
from trainer.base.redact import redact
from trainer.base.typedconfig import from_dict
from trainer.data.datasets import TabularRowGroups
from trainer.models import validate_plugin_entries
from trainer.models.export import LoadedModel, load_model, predict
from trainer.registry_files import MAX_CHAMPION_BYTES
from trainer.steps.evaluate.baselines import (
    BASELINES,
    FittedBaseline,
    baseline_label,
    fit_baselines,
    log_scored,
    sample_rows,
)
from trainer.steps.evaluate.gate import MIN_GATE_ROWS, GateConfig, decide_gate, stored_metric
from trainer.steps.evaluate.metrics import (
    AUTO_METRIC,
    TASK_METRICS,
    EvaluateResult,
    is_number,
    roc,
    score_predictions,
    softmax,
)
from trainer.steps.evaluate.report import render_report
from trainer.steps.train import AUTO_SETTINGS_FILE, COST_FILE

__all__ = ["EvaluateConfig", "evaluate", "evaluate_config", "read_history"]

MANY_CLASSES = 20
"""Above this many classes the baselines are not fitted on a split too small to gate on."""

HISTORY_FILE = "history.jsonl"
"""The training log the train step places inside the model directory (optional)."""


@dataclass(kw_only=True, slots=True)
class EvaluateConfig:
    """How the evaluate step scores and gates a model."""

    gate: GateConfig = field(default_factory=GateConfig)
    """The promotion gate."""
    batch_size: int = 8192
    """Rows per forward pass while scoring."""
    split: str = "test"
    """Which split of the preprocessed dataset to score: ``<dataset>/<split>.parquet``."""
    baselines: bool = True
    """Fit the baselines (trivial, linear, gradient boosting) on ``<dataset>/train.parquet`` and
    score them on the same split, for the report, the metrics and the gate."""
    model_plugins: list[str] = field(default_factory=list)
    """User-model plugins that loading the candidate or the champion may import
    (``package.module:build``, its module, or a package above it), from the installed
    environment only. Built-in models always load; a model whose ``model.json`` names any
    other plugin is refused (E_MODEL) before anything is imported: an artifact never chooses
    which code runs."""
    max_champion_bytes: int = MAX_CHAMPION_BYTES
    """The most bytes of the registry's champion that the step downloads (1 GiB): more, told
    by the registry's listing, a file's Content-Length or counted while it streams, is one
    E_MODEL line naming this limit, and nothing of the download is left."""

    def __post_init__(self) -> None:
        try:
            validate_plugin_entries(self.model_plugins, "model_plugins")
        except ValueError as e:
            raise InputError("E_CONFIG", str(e), "model_plugins") from e
        if self.max_champion_bytes <= 0:
            raise InputError(
                "E_CONFIG",
                f"max_champion_bytes must be > 0, got {self.max_champion_bytes!r}",
                "max_champion_bytes",
            )
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


def evaluate_config(
    *,
    gate_metric: str,
    gate_threshold: float,
    gate_baseline: str,
    model_name: str,
    max_champion_bytes: int,
) -> EvaluateConfig:
    """The evaluate step's config for pipeline parameters (same names, defaulted once, in the
    pipeline's signature): the one mapping the component and the pipeline's parameter check
    share.

    ``gate_threshold`` 0 means no threshold. ``model_name`` is the pipeline's model: a plugin
    (``package.module:build``) named there is the only code a model artifact may make the step
    import, and only from the installed environment.

    Raises:
        InputError: a bad value, naming the field (``gate.metric``, ``gate.threshold``,
            ``gate.baseline``, ``model_plugins``, ``max_champion_bytes``).
    """
    gate = {"metric": gate_metric, "threshold": gate_threshold or None, "baseline": gate_baseline}
    plugins = [model_name] if ":" in model_name else []
    return from_dict(
        EvaluateConfig,
        {"gate": gate, "model_plugins": plugins, "max_champion_bytes": max_champion_bytes},
    )


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


def _open_split(loaded: LoadedModel, split_uri: str, columns: list[str]) -> TabularRowGroups:
    """The split, to be read row group by row group in the model's feature order; missing
    columns are one E_SCHEMA error."""
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
        return TabularRowGroups(split_uri, target=target, features=features, task=loaded.spec.task)
    except InputError:
        raise
    except ValueError as e:  # names the column and file already
        raise InputError("E_DATA", str(e), split_uri) from e


def _row_groups(
    loaded: LoadedModel, rows: TabularRowGroups, split_uri: str
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``rows``' blocks, each checked against the model's classes; bad values are E_DATA."""
    k = loaded.spec.num_classes
    blocks = iter(rows)
    while True:
        try:
            x, y = next(blocks)
        except StopIteration:
            return
        except InputError:
            raise
        except ValueError as e:  # names the column and file already
            raise InputError("E_DATA", str(e), split_uri) from e
        if k is not None and len(y) and int(y.max()) >= k:
            raise InputError(
                "E_SCHEMA",
                f"target {rows.target!r} holds class {int(y.max())}, but the model knows "
                f"{k} classes (0..{k - 1})",
                split_uri,
            )
        yield x, y


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


def _read_auto_settings(model_uri: str) -> dict[str, Any] | None:
    """The settings the train step chose from the data (``auto_settings.json``), if recorded."""
    try:
        record = json.loads(storage.read_text(storage.join(model_uri, AUTO_SETTINGS_FILE)))
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _read_cost(model_uri: str) -> dict[str, Any] | None:
    """The train step's cost estimate and actual (``cost.json``), if recorded."""
    try:
        record = json.loads(storage.read_text(storage.join(model_uri, COST_FILE)))
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _read_data_decisions(dataset_uri: str) -> dict[str, Any]:
    """What preprocess decided about the columns (``schema.json``: decisions and warnings)."""
    try:
        doc = json.loads(storage.read_text(storage.join(dataset_uri, "schema.json")))
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {"decisions": doc.get("decisions") or [], "warnings": doc.get("warnings") or []}


def _fit_baselines(
    candidate: LoadedModel, dataset_uri: str
) -> tuple[list[FittedBaseline], dict[str, str]]:
    """Every baseline fitted on the training split (the rows :func:`sample_rows` draws, gathered
    row group by row group) and each one's label in words (the trivial regressor's with the
    training mean it predicts)."""
    train_uri = storage.join(dataset_uri, "train.parquet")
    if not storage.exists(train_uri):
        return [], {}
    rows = _open_split(candidate, train_uri, _split_columns(train_uri))
    keep = sample_rows(rows.num_rows)
    xs, ys, total, off = [], [], 0.0, 0
    for x, y in _row_groups(candidate, rows, train_uri):
        total += float(y.astype(np.float64).sum())
        if keep is None:
            xs.append(x)
            ys.append(y)
        else:
            lo, hi = np.searchsorted(keep, [off, off + len(y)])
            xs.append(x[keep[lo:hi] - off])
            ys.append(y[keep[lo:hi] - off])
        off += len(y)
    task = candidate.spec.task
    labels = {name: baseline_label(name, task) for name in BASELINES}
    if task == "regression" and off:
        labels["trivial"] = f"{labels['trivial']} {total / off:.4g}"
    fitted = fit_baselines(task, np.concatenate(xs), np.concatenate(ys))
    return fitted, labels


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


def _champion_stored(
    champion: LoadedModel, why: str, metric: str, stored_metrics: dict[str, float] | None
) -> tuple[dict[str, float], float | None, str]:
    """The champion's stored metrics (``stored_metrics`` from the registry, else its
    ``metrics.json``), its gate-metric value, and the note that says why it was not re-scored."""
    source = "its metrics.json"
    stored: dict[str, Any] = champion.metrics
    if stored_metrics is not None:
        source, stored = "the registry", stored_metrics
    metrics = {k: float(v) for k, v in stored.items() if is_number(v) and math.isfinite(v)}
    value, key = stored_metric(metrics, metric)
    return metrics, value, f"stored {key} from {source}: {why}, so it was not re-scored"


def _outputs(loaded: LoadedModel, x: np.ndarray, batch_size: int) -> np.ndarray:
    """What the metrics take of a model's predictions for rows ``x``: class probabilities
    (float64) or predicted values."""
    out = predict(loaded, torch.from_numpy(x), batch_size=batch_size)
    if loaded.spec.task == "classification":
        return softmax(out)
    return out.double().numpy()


@dataclass(slots=True)
class _SplitPredictions:
    """One pass over the split: its targets, and each model's and baseline's predictions."""

    y: np.ndarray
    models: list[np.ndarray]
    baselines: dict[str, np.ndarray]


def _predict_split(
    candidate: LoadedModel,
    rows: TabularRowGroups,
    split_uri: str,
    models: list[LoadedModel],
    baselines: list[FittedBaseline],
    batch_size: int,
) -> _SplitPredictions:
    """Score every model and baseline on the split, row group by row group: the features are
    never held whole, only the predictions (a number per class, or one, per row)."""
    task, k = candidate.spec.task, candidate.spec.num_classes
    ys: list[np.ndarray] = []
    outs: list[list[np.ndarray]] = [[] for _ in models]
    base: dict[str, list[np.ndarray]] = {b.name: [] for b in baselines}
    for x, y in _row_groups(candidate, rows, split_uri):
        ys.append(y)
        for i, model in enumerate(models):
            outs[i].append(_outputs(model, x, batch_size))
        for b in baselines:
            started = time.perf_counter()
            base[b.name].append(b.predict(x, task, k))
            b.seconds += time.perf_counter() - started
    return _SplitPredictions(
        y=np.concatenate(ys),
        models=[np.concatenate(o) for o in outs],
        baselines={name: np.concatenate(o) for name, o in base.items()},
    )


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
    rows = _open_split(candidate, split_uri, columns)

    champion_metrics, champion_value, champion_note = None, None, ""
    models = [candidate]
    if champion_model_uri is not None:
        champion = _load(champion_model_uri, "champion", cfg.model_plugins)
        why = _incompatibility(candidate, champion)
        if why is None:
            models.append(champion)  # re-scored on the candidate's rows, in the same pass
        else:
            champion_metrics, champion_value, champion_note = _champion_stored(
                champion, why, metric, champion_stored_metrics
            )
    # Too few rows to gate on: the baselines still say what the split can tell (the gate refuses
    # it anyway), except with many classes, where gradient boosting alone takes minutes.
    many_classes = (candidate.spec.num_classes or 0) > MANY_CLASSES
    skip = rows.num_rows < MIN_GATE_ROWS and many_classes
    fitted, labels = (
        _fit_baselines(candidate, dataset_uri) if cfg.baselines and not skip else ([], {})
    )
    pred = _predict_split(candidate, rows, split_uri, models, fitted, cfg.batch_size)
    scored = score_predictions(task, pred.y, pred.models[0])
    if len(models) > 1:
        champion_metrics = score_predictions(task, pred.y, pred.models[1]).metrics
        champion_value = champion_metrics.get(metric)
    baselines: dict[str, dict[str, float]] = {}
    for b in fitted:
        scored_b = score_predictions(task, pred.y, pred.baselines[b.name])
        log_scored(b, task, scored_b)
        baselines[b.name] = scored_b.metrics
    n_rows = rows.num_rows
    del pred
    passed, reason = decide_gate(
        metric=metric,
        value=scored.metrics.get(metric),
        threshold=cfg.gate.threshold,
        min_improvement=cfg.gate.min_improvement,
        has_champion=champion_model_uri is not None,
        champion_value=champion_value,
        champion_name=champion_name or (champion_model_uri or ""),
        champion_note=champion_note,
        baselines={
            name: (labels.get(name) or baseline_label(name, task), m[metric])
            for name, m in baselines.items()
            if metric in m
        },
        baseline=cfg.gate.baseline,
        rows=n_rows,
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
        num_rows=n_rows,
        baselines=baselines,
        auto_settings=_read_auto_settings(model_uri),
        cost=_read_cost(model_uri),
    )
    if scored.proba is not None:
        from sklearn.metrics import confusion_matrix

        k = scored.proba.shape[1]
        cm = confusion_matrix(scored.y_true, scored.y_pred, labels=range(k))
        result.confusion_matrix = [[int(v) for v in row] for row in cm]
        result.labels = _labels(candidate)
        result.roc = roc(scored.y_true, scored.proba)

    html = render_report(
        result,
        model_uri=model_uri,
        dataset_uri=dataset_uri,
        split=cfg.split,
        champion_uri=champion_model_uri,
        champion_rescored=champion_model_uri is not None and not champion_note,
        history=read_history(model_uri),
        y_true=scored.y_true if task == "regression" else None,
        y_pred=scored.y_pred if task == "regression" else None,
        data=_read_data_decisions(dataset_uri),
    )
    # Everything is computed: only now touch the outputs, so a failure above leaves none.
    outputs.write_output_file(report_uri, html, step="evaluate")
    if metrics_uri is not None:
        body = json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n"
        outputs.write_output_file(metrics_uri, body, step="evaluate")
    return result
