"""From a search space to one trial's config: sampled values typed as their config fields, the
points of a grid, and the dotted overrides a trial applies to the base config.
"""

from __future__ import annotations

import itertools
import math
import re
from typing import Any

from trainer.base.typedconfig import parse_value
from trainer.tune.space import DOTTED_NAME, Parameter, SearchSpace, bad_value


def sample_value(p: Parameter, raw: Any) -> int | float | str:
    """``raw`` (a sampler's or Katib's value) as the type of ``p``'s config field.

    int: rounded to an integer; double: a float; discrete: an int when the list's value is
    integral, else a float; categorical: the string.

    Raises:
        InputError: ``raw`` is not a value of that type.
    """
    where = f"parameter {p.name}"
    try:
        if p.parameterType == "int":
            return round(float(raw))
        if p.parameterType == "double":
            return float(raw)
        if p.parameterType == "discrete":
            value = float(raw)
            # The list decides the type: ["32", "64"] gives ints (also for a sampled 64.0).
            texts = [t for t in p.feasibleSpace.list or [] if float(t) == value]
            text = texts[0] if texts else str(raw).strip()
            if value.is_integer() and re.fullmatch(r"[+-]?\d+", text):
                return int(value)
            return value
    except (TypeError, ValueError):
        raise bad_value(where, f"must be a {p.parameterType} value", raw) from None
    return str(raw)


def trial_overrides(assignment: dict[str, Any]) -> dict[str, Any]:
    """Dotted overrides for :func:`trainer.config.apply_overrides` from one trial's values.

    String values are parsed like ``--set key=value`` (JSON, else the string), so a
    categorical ``"true"`` becomes ``True`` here just as it does in a Katib trial's command.

    Raises:
        InputError: a key that is not a dotted config path.
    """
    out: dict[str, Any] = {}
    for key, value in assignment.items():
        if not isinstance(key, str) or not DOTTED_NAME.match(key):
            raise bad_value("trial parameter", "must be a dotted config field like optim.lr", key)
        out[key] = parse_value(value) if isinstance(value, str) else value
    return out


def grid_points(space: SearchSpace) -> list[dict[str, int | float | str]]:
    """Every point of a grid over ``space``, in order (for grid search)."""
    axes: list[list[int | float | str]] = []
    for p in space.parameters:
        fs = p.feasibleSpace
        if fs.list is not None:
            axes.append([sample_value(p, v) for v in fs.list])
            continue
        lo, hi = float(fs.min or 0), float(fs.max or 0)
        step = float(fs.step) if fs.step is not None else 1.0
        n = math.floor((hi - lo) / step + 1e-9) + 1
        # Rounded to 12 significant digits: 0.1 * 3 is a grid point 0.3, not 0.30000000000000004.
        axes.append([sample_value(p, float(f"{lo + k * step:.12g}")) for k in range(n)])
    names = [p.name for p in space.parameters]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes)]
