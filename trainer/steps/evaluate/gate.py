"""The evaluate step's promotion gate: a threshold and the champion to beat, with a reason."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from trainer.base.errors import InputError
from trainer.steps.evaluate.metrics import HIGHER_IS_BETTER, is_number

__all__ = ["MIN_GATE_ROWS", "GateConfig", "decide_gate", "stored_metric"]

MIN_GATE_ROWS = 30
"""Fewest test rows the gate decides on. Below it one row moves accuracy by more than three
points and a 95% interval around an accuracy of 0.5 is wider than +-0.18 (1.96 * 0.5 /
sqrt(30)), so no comparison with a threshold, a baseline or a champion means anything: the gate
fails and nothing is registered."""

_WORST = {"accuracy": 0.0, "f1_macro": 0.0, "roc_auc": 0.0}
"""The worst possible value of bounded metrics: a model there never passes, whatever it ties."""

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
    baseline: Literal["trivial", "best"] = "trivial"
    """Which baseline the candidate is held to (scored on the same split): ``trivial``: it must
    not be worse than the trivial predictor (majority class, training mean); ``best``: it must
    beat the best baseline (trivial, linear, gradient boosting). (Pipeline parameter
    ``gate_baseline``.)"""

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
        if self.baseline not in ("trivial", "best"):
            raise InputError(
                "E_CONFIG",
                f"gate.baseline must be 'trivial' or 'best', got {self.baseline!r}",
                "gate.baseline",
            )
        if not (math.isfinite(self.min_improvement) and self.min_improvement >= 0):
            raise InputError(
                "E_CONFIG",
                f"gate.min_improvement must be >= 0, got {self.min_improvement!r}",
                "gate.min_improvement",
            )


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
    baselines: dict[str, tuple[str, float]] | None = None,
    baseline: str = "trivial",
    rows: int | None = None,
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
        baselines: Each baseline's ``(description, score)`` on the same split, by name
            (``trivial`` first); None or empty: no baseline comparison.
        baseline: ``trivial`` (the candidate must not be worse than the trivial predictor)
            or ``best`` (it must beat every baseline).
        rows: Rows of the scored split; fewer than :data:`MIN_GATE_ROWS` fail the gate.

    Returns:
        Whether the gate passes, and why, e.g.
        ``accuracy 0.86 >= threshold 0.8 and beats champion v3 (0.84)``.
    """
    higher = HIGHER_IS_BETTER[metric]
    if rows is not None and rows < MIN_GATE_ROWS:
        return False, (
            f"not gated: the test split has {rows} row{'s' if rows != 1 else ''}, fewer than "
            f"the {MIN_GATE_ROWS} a score needs to mean anything (one row moves accuracy by "
            f"{1 / max(rows, 1):.0%}); add rows or raise test_fraction"
        )
    if value is None:
        return False, f"{metric} is undefined on this split (one class only), so the gate fails"
    if _WORST.get(metric) == value:
        return False, f"{metric} {_fmt(value)} is the worst possible score, so the gate fails"
    passed = True
    if threshold is None:
        parts = [f"{metric} {_fmt(value)} (no threshold)"]
    else:
        ok = value >= threshold if higher else value <= threshold
        op = (">=" if ok else "<") if higher else ("<=" if ok else ">")
        parts = [f"{metric} {_fmt(value)} {op} threshold {_fmt(threshold)}"]
        passed = ok
    if baselines:
        ok, text = _baseline_part(metric, value, baselines, baseline)
        parts.append(text)
        passed = passed and ok
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


def _baseline_part(
    metric: str, value: float, baselines: dict[str, tuple[str, float]], rule: str
) -> tuple[bool, str]:
    """Whether ``value`` clears the baseline ``rule``, and the clause of the reason that says so.

    ``trivial``: not worse than the trivial predictor (a tie passes: on a very unbalanced split
    a useful model can match the majority class's accuracy). ``best``: strictly better than
    every baseline.
    """
    higher = HIGHER_IS_BETTER[metric]

    def gain(other: float) -> float:
        return value - other if higher else other - value

    if rule == "best":
        name, (label, best) = max(baselines.items(), key=lambda kv: -gain(kv[1][1]))
        shown = f"the best baseline, {name} ({label}, {metric} {_fmt(best)})"
        if gain(best) > 0:
            return True, f"beats {shown}"
        return False, f"does not beat {shown}"
    if "trivial" not in baselines:
        return True, "no trivial predictor to compare with"
    label, trivial = baselines["trivial"]
    # The label says what it predicts (the training mean, with its value), then its score:
    # "(training mean: 0)" read as a mean of 0 when it was an rmse of 0.
    shown = f"the trivial predictor ({label}, {metric} {_fmt(trivial)})"
    if gain(trivial) < -_TIE_TOLERANCE:
        return False, f"is worse than {shown}"
    return True, f"is no worse than {shown}"


def stored_metric(metrics: dict[str, Any], metric: str) -> tuple[float | None, str]:
    """The champion's stored score for ``metric`` and the key it came from."""
    for key in (metric, f"test_{metric}", f"val_{metric}"):
        value = metrics.get(key)
        if is_number(value) and math.isfinite(value):
            return float(value), key
    return None, metric
