"""The evaluate step's report: one self-contained HTML page with the gate, metrics and plots."""

from __future__ import annotations

import datetime as dt
import math
from html import escape
from typing import Any

import numpy as np

from trainer.base.redact import redact
from trainer.base.version import __version__
from trainer.steps import figures
from trainer.steps.evaluate.baselines import baseline_label
from trainer.steps.evaluate.metrics import HIGHER_IS_BETTER, TASK_METRICS, EvaluateResult

__all__ = ["render_report"]

_MAX_SCATTER = 5000  # residual points drawn; more only blurs the picture and bloats the page
_MAX_ANNOTATED_CLASSES = 20  # beyond this, per-cell counts are unreadable
_MAX_TICK_CHARS = 24


# --- Plots ----------------------------------------------------------------------------------------


def _short(text: str) -> str:
    return text if len(text) <= _MAX_TICK_CHARS else text[: _MAX_TICK_CHARS - 1] + "…"


def _finite_points(
    records: list[dict[str, Any]], event: str, key: str
) -> tuple[list[float], list[float]]:
    steps: list[float] = []
    values: list[float] = []
    for r in records:
        step, value = r.get("step"), r.get(key)
        if r.get("event") != event or not isinstance(step, int | float):
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            steps.append(float(step))
            values.append(float(value))
    return steps, values


def loss_curve_png(history: list[dict[str, Any]]) -> str | None:
    """Train loss and validation loss against the optimizer step; None if the log has neither."""
    train = _finite_points(history, "step", "loss")
    val = _finite_points(history, "eval", "val_loss")
    if not train[0] and not val[0]:
        return None
    fig = figures.figure(7.5, 4)
    ax = fig.add_subplot()
    if train[0]:
        ax.plot(*train, label="train loss", color="#0969da", linewidth=1.2)
    if val[0]:
        ax.plot(*val, label="validation loss", color="#cf222e", marker="o", markersize=4)
    ax.set_title("Loss curves (training log)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    return figures.png(fig)


def confusion_png(matrix: list[list[int]], labels: list[str]) -> str:
    """Heat map of the confusion matrix, with counts in the cells when there are few classes."""
    cm = np.asarray(matrix)
    k = len(labels)
    side = min(12.0, max(4.5, 0.45 * k + 2.5))
    fig = figures.figure(side + 1, side)
    ax = fig.add_subplot()
    image = ax.imshow(cm, cmap="Blues", interpolation="nearest")
    fig.colorbar(image, ax=ax, label="rows")
    ticks = [_short(s) for s in labels]
    slanted = k > 4 or max(map(len, ticks), default=0) > 8  # else neighbours' names collide
    ax.set_xticks(
        range(k), ticks, rotation=45 if slanted else 0, ha="right" if slanted else "center"
    )
    ax.set_yticks(range(k), ticks)
    if k <= _MAX_ANNOTATED_CLASSES:
        cut = cm.max() / 2 if cm.size else 0
        for i in range(k):
            for j in range(k):
                colour = "white" if cm[i, j] > cut else "black"
                ax.text(j, i, str(cm[i, j]), ha="center", va="center", color=colour, fontsize=9)
    ax.set_title("Confusion matrix")
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    return figures.png(fig)


def roc_png(roc: dict[str, list[float]], auc: float | None, multiclass: bool) -> str:
    """The ROC curve against the chance diagonal."""
    fig = figures.figure(5.5, 5)
    ax = fig.add_subplot()
    name = "micro-average" if multiclass else "positive class"
    label = f"{name} (AUC {auc:.3f})" if auc is not None and not multiclass else name
    ax.plot(roc["fpr"], roc["tpr"], color="#0969da", linewidth=1.8, label=label)
    ax.plot([0, 1], [0, 1], linestyle="--", color="#8c959f", label="chance")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.set_title("ROC curve" + (" (micro-average over classes)" if multiclass else ""))
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    return figures.png(fig)


def residuals_png(y_true: np.ndarray, y_pred: np.ndarray) -> str:
    """Residuals against predictions (left) and their distribution (right)."""
    residual = y_true - y_pred
    fig = figures.figure(10, 4)
    left, right = fig.subplots(1, 2)
    shown = np.arange(len(residual))
    if len(shown) > _MAX_SCATTER:
        # A fixed seed: the same model and data draw the same picture.
        shown = np.random.default_rng(0).choice(len(residual), _MAX_SCATTER, replace=False)
    left.scatter(y_pred[shown], residual[shown], s=6, alpha=0.4, color="#0969da")
    left.axhline(0, color="#cf222e", linewidth=1)
    sampled = f" ({len(shown)} of {len(residual)} rows)" if len(shown) < len(residual) else ""
    left.set_title("Residuals vs prediction" + sampled)
    left.set_xlabel("predicted value")
    left.set_ylabel("residual (true − predicted)")
    left.grid(alpha=0.3)
    right.hist(residual, bins=min(50, max(5, int(math.sqrt(len(residual))))), color="#0969da")
    right.axvline(0, color="#cf222e", linewidth=1)
    right.set_title("Residual distribution")
    right.set_xlabel("residual (true − predicted)")
    right.set_ylabel("rows")
    return figures.png(fig)


# --- HTML -----------------------------------------------------------------------------------------


def _num(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _metrics_table(result: EvaluateResult, champion_label: str) -> str:
    champ = result.champion_metrics
    names = [m for m in TASK_METRICS[result.task] if m in result.metrics or (champ and m in champ)]
    head = "<th>metric</th><th>better</th><th>candidate</th>"
    if champ is not None:
        head += f"<th>{escape(champion_label)}</th>"
        # Stored metrics of an incompatible champion carry their own names (val_loss, ...).
        names += sorted(k for k in champ if k not in names)
    for name in result.baselines:
        label = baseline_label(name, result.task)
        head += f"<th>baseline: {escape(name)}<br><small>{escape(label)}</small></th>"
    rows = []
    for m in names:
        direction = HIGHER_IS_BETTER.get(m)
        better = "" if direction is None else ("higher" if direction else "lower")
        cls = ' class="gate-metric"' if m == result.gate_metric else ""
        cells = f"<td>{escape(m)}</td><td>{better}</td><td>{_num(result.metrics.get(m))}</td>"
        if champ is not None:
            cells += f"<td>{_num(champ.get(m))}</td>"
        cells += "".join(f"<td>{_num(b.get(m))}</td>" for b in result.baselines.values())
        rows.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _settings_table(auto: dict[str, Any]) -> str:
    """The training settings chosen from the data and those the user set."""
    rows = [
        f"<tr><td>{escape(k)}</td><td>{escape(_setting(v))}</td><td>{origin}</td></tr>"
        for origin, key in (("from the data", "chosen"), ("set by the user", "user_set"))
        for k, v in (auto.get(key) or {}).items()
    ]
    inputs = auto.get("inputs") or {}
    basis = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in inputs.items() if v is not None)
    return (
        "<table><thead><tr><th>setting</th><th>value</th><th>origin</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table>"
        f'<p class="note">Chosen from: {escape(basis)}.</p>'
    )


def _cost_table(record: dict[str, Any]) -> str:
    """The estimate made before launch beside what the run took, with the estimate's
    assumptions."""
    from trainer.base.cost import summary_lines

    est = record.get("estimate") or {}
    lines = summary_lines(record.get("estimate"), record.get("actual"))
    rows = "".join(f"<tr><td>{escape(line)}</td></tr>" for line in lines)
    notes = "; ".join(str(a) for a in est.get("assumptions") or [])
    note = f'<p class="note">Assumed: {escape(notes)}.</p>' if notes else ""
    return f"<table><tbody>{rows}</tbody></table>{note}"


def _setting(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    return "none" if value is None else str(value)


def _confusion_table(matrix: list[list[int]], labels: list[str]) -> str:
    head = "".join(f"<th>{escape(label)}</th>" for label in labels)
    rows = "".join(
        f"<tr><th>{escape(label)}</th>{''.join(f'<td>{v}</td>' for v in row)}</tr>"
        for label, row in zip(labels, matrix, strict=True)
    )
    return (
        "<table><thead><tr><th>true \\ predicted</th>"
        f"{head}</tr></thead><tbody>{rows}</tbody></table>"
    )


def render_report(
    result: EvaluateResult,
    *,
    model_uri: str,
    dataset_uri: str,
    split: str,
    champion_uri: str | None,
    champion_rescored: bool,
    history: list[dict[str, Any]] | None,
    y_true: np.ndarray | None = None,
    y_pred: np.ndarray | None = None,
    data: dict[str, Any] | None = None,
) -> str:
    """The report page: gate decision, metrics table, loss curves and the task's plots.

    Every piece of text is HTML-escaped and every picture is an embedded PNG, so the page opens
    anywhere (the KFP UI, a mail attachment) without fetching anything.

    Args:
        result: What evaluate decided.
        model_uri: The candidate model.
        dataset_uri: The dataset that was scored.
        split: The split that was scored.
        champion_uri: The champion model, if any.
        champion_rescored: Whether the champion's metrics come from the same split (else from
            its stored metrics).
        history: The training log's records, or None.
        y_true: Regression: the targets (for the residual plots).
        y_pred: Regression: the predictions.
        data: What preprocess decided about the columns (``decisions`` and ``warnings`` from
            ``schema.json``), for the data section.

    Returns:
        The HTML document.
    """
    import matplotlib

    # Labels and URIs are data: "$" must not switch matplotlib into math mode.
    with matplotlib.rc_context({"text.parse_math": False}):
        body = _body(
            result,
            split=split,
            champion_uri=champion_uri,
            champion_rescored=champion_rescored,
            history=history,
            y_true=y_true,
            y_pred=y_pred,
        )
    body = _data_section(data or {}) + body
    verdict = "PASS" if result.gate_passed else "FAIL"
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    facts = [
        ("model", model_uri),
        ("dataset", f"{dataset_uri} (split {split}, {result.num_rows} rows)"),
        ("champion", champion_uri or "none"),
        ("written", f"{created} by gpupipe {__version__}"),
    ]
    # A report is shared (KFP UI, mail): locations are shown without their credentials.
    facts_html = "".join(f"<dt>{escape(k)}</dt><dd>{escape(redact(v))}</dd>" for k, v in facts)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Evaluation: {verdict} ({escape(result.task)})</title>"
        f"<style>{figures.CSS}</style></head><body>"
        f"<h1>Model evaluation report</h1>"
        f'<p class="sub">{escape(result.task)} model, scored on the {escape(split)} split</p>'
        f'<div class="gate {"pass" if result.gate_passed else "fail"}" id="gate">'
        f"<strong>Gate: {verdict}</strong>{escape(redact(result.gate_reason))}</div>"
        f"<dl>{facts_html}</dl>"
        f"{body}</body></html>\n"
    )


_ACTIONS = {"dropped": "left out", "date": "date as numbers", "warning": "kept, with a warning"}


def _data_section(data: dict[str, Any]) -> str:
    """The data section: each column decision preprocess made, and its warnings."""
    decisions = [d for d in data.get("decisions", []) if isinstance(d, dict)]
    warnings = [w for w in data.get("warnings", []) if isinstance(w, str)]
    if not decisions and not warnings:
        return ""
    parts = ['<h2 id="data">Data</h2>']
    if decisions:
        rows = "".join(
            f"<tr><td>{escape(str(d.get('column')))}</td>"
            f"<td>{escape(_ACTIONS.get(str(d.get('action')), str(d.get('action'))))}</td>"
            f"<td>{escape(str(d.get('reason')))}</td><td>{escape(str(d.get('detail')))}</td></tr>"
            for d in decisions
        )
        parts.append(
            "<table><thead><tr><th>column</th><th>decision</th><th>why</th><th>evidence</th>"
            f"</tr></thead><tbody>{rows}</tbody></table>"
        )
    parts.extend(f'<p class="note">{escape(redact(w))}</p>' for w in warnings)
    return "".join(parts)


def _body(
    result: EvaluateResult,
    *,
    split: str,
    champion_uri: str | None,
    champion_rescored: bool,
    history: list[dict[str, Any]] | None,
    y_true: np.ndarray | None,
    y_pred: np.ndarray | None,
) -> str:
    parts = ["<h2>Metrics</h2>"]
    champion_label = "champion" + (
        f" ({split} split)" if champion_rescored else " (stored metrics)"
    )
    parts.append(_metrics_table(result, champion_label))
    if champion_uri is not None and not champion_rescored:
        parts.append(
            '<p class="note">The champion could not be re-scored on this split (its schema '
            "differs), so its column shows the metrics stored with it.</p>"
        )
    if result.baselines:
        parts.append(
            '<p class="note">Baselines are fitted on the training split and scored on the same '
            "rows as the candidate.</p>"
        )
    if result.auto_settings:
        parts.append("<h2>Training settings</h2>")
        parts.append(_settings_table(result.auto_settings))
    if result.cost:
        parts.append("<h2>Cost</h2>")
        parts.append(_cost_table(result.cost))

    parts.append("<h2>Training loss</h2>")
    loss_png = loss_curve_png(history) if history else None
    if loss_png is not None:
        parts.append(
            figures.img(loss_png, "training and validation loss against the optimizer step")
        )
    else:
        parts.append(
            '<p class="note">No training log (history.jsonl) with losses was found in the '
            "model directory, so there are no loss curves.</p>"
        )

    if result.confusion_matrix is not None and result.labels is not None:
        parts.append("<h2>Confusion matrix</h2>")
        cm_png = confusion_png(result.confusion_matrix, result.labels)
        parts.append(figures.img(cm_png, "confusion matrix"))
        if len(result.labels) <= _MAX_ANNOTATED_CLASSES:
            parts.append(_confusion_table(result.confusion_matrix, result.labels))
        parts.append("<h2>ROC curve</h2>")
        if result.roc is not None:
            multiclass = len(result.labels) > 2
            auc = result.metrics.get("roc_auc")
            parts.append(figures.img(roc_png(result.roc, auc, multiclass), "ROC curve"))
            if multiclass and auc is not None:
                parts.append(f'<p class="note">roc_auc (one-vs-rest macro) = {auc:.4f}</p>')
        else:
            parts.append(
                '<p class="note">The split holds a single class, so there is no ROC curve.</p>'
            )
    if y_true is not None and y_pred is not None:
        parts.append("<h2>Residuals</h2>")
        parts.append(figures.img(residuals_png(y_true, y_pred), "residuals against predictions"))
    return "".join(parts)
