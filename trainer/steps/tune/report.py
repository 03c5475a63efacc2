"""What the tune step found (:class:`TuneStepResult`) and its HTML report.

The report is self-contained: the optimisation history and the parameter importances are
embedded PNGs (:mod:`trainer.steps.figures`), the trials a table, and every piece of text is
HTML-escaped. A Katib search shows its outcome only (its trials live in Katib's UI).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from trainer.base.version import __version__

if TYPE_CHECKING:
    from trainer.tune.journal import TrialRecord
    from trainer.tune.local import StudyResult


@dataclass
class TuneStepResult:
    """What the search found, in the shape the component outputs."""

    engine: str
    objective_metric: str
    direction: str
    best_params: dict[str, Any]
    """Dotted config field -> value: the train step's ``hyperparams_json``."""
    best_value: float | None
    trials_completed: int
    trials_pruned: int
    trials_failed: int
    stopped_reason: str = ""
    study: str = ""
    """The local study's name or the Katib Experiment's ``namespace/name``."""

    def metrics(self) -> dict[str, float]:
        """The numbers for a KFP Metrics artifact."""
        out = {
            "trials_completed": float(self.trials_completed),
            "trials_pruned": float(self.trials_pruned),
            "trials_failed": float(self.trials_failed),
        }
        if self.best_value is not None:
            out[f"best_{self.objective_metric}"] = self.best_value
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "objective_metric": self.objective_metric,
            "direction": self.direction,
            "best_params": dict(self.best_params),
            "best_value": self.best_value,
            "trials_completed": self.trials_completed,
            "trials_pruned": self.trials_pruned,
            "trials_failed": self.trials_failed,
            "stopped_reason": self.stopped_reason,
            "study": self.study,
        }


_CSS_EXTRA = """
td.err{text-align:left;max-width:28rem;word-break:break-word;color:#cf222e}
tr.best{font-weight:bold;background:#fff8c5}
.state-PRUNED{color:#59636e}.state-FAIL{color:#cf222e}
"""


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    return str(value)


def history_png(trials: list[TrialRecord], *, metric: str, maximize: bool) -> str | None:
    """Objective per trial (completed: dots; pruned: their last report, crosses) and the
    best-so-far line, as base64 PNG; None when no trial reported anything."""
    from trainer.steps.figures import figure, png

    done = [(t.number, t.value) for t in trials if t.state == "COMPLETE" and t.value is not None]
    pruned = [
        (t.number, t.intermediate[-1][1]) for t in trials if t.state == "PRUNED" and t.intermediate
    ]
    if not done and not pruned:
        return None
    fig = figure(7.5, 4.0)
    ax = fig.add_subplot()
    if done:
        ax.scatter(*zip(*done, strict=True), label="completed trial", color="#0969da", zorder=3)
        best: list[tuple[int, float]] = []
        current: float | None = None
        for n, v in sorted(done):
            if current is None or (v > current if maximize else v < current):
                current = v
            best.append((n, current))
        xs, ys = zip(*best, strict=True)
        ax.step(xs, ys, where="post", color="#cf222e", label="best so far")
    if pruned:
        ax.scatter(
            *zip(*pruned, strict=True),
            marker="x",
            color="#8c959f",
            label="pruned (last report)",
            zorder=2,
        )
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title("Optimisation history")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return png(fig)


def importance_png(importances: dict[str, float]) -> str | None:
    """Parameter importances as a horizontal bar chart (base64 PNG)."""
    from trainer.steps.figures import figure, png

    if not importances:
        return None
    items = sorted(importances.items(), key=lambda kv: kv[1])
    fig = figure(7.5, 0.5 * len(items) + 1.4)
    ax = fig.add_subplot()
    ax.barh([k for k, _ in items], [v for _, v in items], color="#1a7f37")
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize="small")
    ax.set_xlabel("importance (fANOVA, completed trials)")
    ax.set_xlim(0, max(1.0, max(v for _, v in items) * 1.15))
    ax.set_title("Parameter importances")
    return png(fig)


def _trials_table(study: StudyResult) -> str:
    names = sorted({k for t in study.trials for k in t.params})
    head = "".join(
        f"<th>{escape(h)}</th>"
        for h in ["trial", "state", study.objective_metric, "epochs", *names, "error"]
    )
    rows = []
    for t in study.trials:
        state = t.state + (" (interrupted, re-run)" if t.interrupted else "")
        cls = ' class="best"' if t.number == study.best_trial else ""
        value = (
            t.value if t.value is not None else (t.intermediate[-1][1] if t.intermediate else None)
        )
        cells = [
            str(t.number),
            f'<span class="state-{escape(t.state)}">{escape(state)}</span>',
            "–" if value is None else escape(_fmt(value)) + ("" if t.value is not None else "*"),
            "–" if t.epochs is None else escape(_fmt(float(t.epochs))),
            *(escape(_fmt(t.params[n])) if n in t.params else "–" for n in names),
        ]
        row = "".join(f"<td>{c}</td>" for c in cells)
        row += f'<td class="err">{escape(t.error or "")}</td>'
        rows.append(f"<tr{cls}>{row}</tr>")
    return (
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        '<p class="note">* a pruned trial\'s last reported value.</p>'
    )


def render_tune_report(
    result: TuneStepResult,
    study: StudyResult | None,
    *,
    dataset_uri: str,
    work_uri: str,
) -> str:
    """The report page: best parameters, history and importance pictures, the trials.

    Self-contained (pictures are embedded PNGs) and every piece of text is HTML-escaped.
    """
    import matplotlib

    from trainer.steps.figures import CSS, img

    maximize = result.direction == "maximize"
    parts = ["<h2>Best parameters</h2>"]
    rows = "".join(
        f"<tr><td>{escape(k)}</td><td>{escape(_fmt(v))}</td></tr>"
        for k, v in sorted(result.best_params.items())
    )
    parts.append(
        f"<table><thead><tr><th>field</th><th>value</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    with matplotlib.rc_context({"text.parse_math": False}):
        if study is not None:
            parts.append("<h2>Optimisation history</h2>")
            png = history_png(study.trials, metric=result.objective_metric, maximize=maximize)
            parts.append(
                img(png, f"{result.objective_metric} per trial, with the best so far")
                if png
                else '<p class="note">No trial reported the objective.</p>'
            )
            parts.append("<h2>Parameter importances</h2>")
            imp = importance_png(study.importances or {})
            parts.append(
                img(imp, "parameter importances")
                if imp
                else '<p class="note">Too few completed trials to estimate importances.</p>'
            )
            parts.append("<h2>Trials</h2>")
            parts.append(_trials_table(study))
        else:
            parts.append(
                '<p class="note">Trials ran as a Katib Experiment: see its trials in the Katib '
                "UI; this page shows the outcome only.</p>"
            )
    created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    best = "none" if result.best_value is None else _fmt(result.best_value)
    facts = [
        ("engine", result.engine),
        ("study", result.study),
        ("objective", f"{result.direction} {result.objective_metric}"),
        ("best", best),
        (
            "trials",
            f"{result.trials_completed} completed, {result.trials_pruned} pruned, "
            f"{result.trials_failed} failed",
        ),
        ("ended because", result.stopped_reason),
        ("dataset", dataset_uri),
        ("work area", work_uri),
        ("written", f"{created} by gpupipe {__version__}"),
    ]
    facts_html = "".join(f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in facts)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>Tune: best {escape(result.objective_metric)} {escape(best)}</title>"
        f"<style>{CSS}{_CSS_EXTRA}</style></head><body>"
        "<h1>Hyperparameter search report</h1>"
        f'<p class="sub">{escape(result.direction)} {escape(result.objective_metric)}</p>'
        f"<dl>{facts_html}</dl>"
        f"{''.join(parts)}</body></html>\n"
    )


def disabled_report() -> str:
    """The report page of a step whose search was switched off."""
    from trainer.steps.figures import CSS

    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8"><title>tune: disabled</title>'
        f"<style>{CSS}</style></head><body><h1>Hyperparameter search report</h1>"
        '<p class="note">Hyperparameter search disabled (tune_enabled=false): no trials ran '
        "and the train step uses its own settings.</p></body></html>\n"
    )
