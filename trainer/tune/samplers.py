"""Katib algorithms and early stopping as Optuna samplers and pruners, and a trial's suggestions.

:data:`SAMPLERS` and :data:`PRUNERS` say which Optuna piece plays each Katib part;
:func:`make_sampler` and :func:`make_pruner` build them from a search space's
``algorithmSettings``, and :func:`suggest` draws one trial's assignment (a grid walks its
points in order; a Hyperband resource parameter is left to the pruner). Optuna is imported
lazily: the trainer package imports without it.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from trainer.base.errors import InputError
from trainer.tune.space import Parameter, SearchSpace
from trainer.tune.values import grid_points, sample_value

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

SAMPLERS: dict[str, str] = {
    "random": "RandomSampler",
    "grid": "GridSampler",
    "tpe": "TPESampler",
    "multivariate-tpe": "TPESampler(multivariate=True)",
    "cmaes": "CmaEsSampler",
    "bayesianoptimization": "GPSampler",
    "hyperband": "TPESampler (+ HyperbandPruner)",
}
"""Katib algorithm -> the Optuna sampler that plays its part."""
PRUNERS: dict[str | None, str] = {
    None: "NopPruner",
    "medianstop": "MedianPruner(n_startup_trials=min_trials_required, n_warmup_steps=start_step)",
    "hyperband": "HyperbandPruner(min_resource, max_resource, reduction_factor=eta)",
}
"""Katib early stopping (or the hyperband algorithm) -> the Optuna pruner."""


# --------------------------------------------------------------------------------------------
# Samplers, pruners, distributions
# --------------------------------------------------------------------------------------------


def _int_setting(space: SearchSpace, name: str, default: int | None) -> int | None:
    value = space.setting(name)
    return default if value is None else int(float(value))


def _float_setting(space: SearchSpace, name: str, default: float | None) -> float | None:
    value = space.setting(name)
    return default if value is None else float(value)


def make_sampler(space: SearchSpace, *, seed: int) -> optuna.samplers.BaseSampler:
    """The Optuna sampler of the space's algorithm (see :data:`SAMPLERS`).

    ``random_state`` in the algorithm settings overrides ``seed``.

    Raises:
        InputError: the algorithm needs a package that is not installed (cmaes).
    """
    import optuna

    algo = space.algorithm.algorithmName
    seed = _int_setting(space, "random_state", seed) or 0
    samplers = optuna.samplers
    if algo == "random":
        return samplers.RandomSampler(seed=seed)
    if algo == "grid":
        axes: dict[str, list[Any]] = {p.name: [] for p in space.parameters}
        for point in grid_points(space):
            for k, v in point.items():
                if v not in axes[k]:
                    axes[k].append(v)
        return samplers.GridSampler(axes, seed=seed)
    if algo in ("tpe", "multivariate-tpe", "hyperband"):
        kwargs: dict[str, Any] = {"seed": seed}
        if (n := _int_setting(space, "n_startup_trials", None)) is not None:
            kwargs["n_startup_trials"] = n
        if (n := _int_setting(space, "n_ei_candidates", None)) is not None:
            kwargs["n_ei_candidates"] = n
        if (w := _float_setting(space, "prior_weight", None)) is not None:
            kwargs["prior_weight"] = w
        if (g := _float_setting(space, "gamma", None)) is not None:
            share = g  # hyperopt's gamma: the share of trials that count as good

            def gamma(n: int) -> int:
                return min(math.ceil(share * n), 25)

            kwargs["gamma"] = gamma
        if algo == "multivariate-tpe":
            kwargs["multivariate"] = True
        return samplers.TPESampler(**kwargs)
    if algo == "cmaes":
        try:
            import cmaes  # noqa: F401  (optuna imports it lazily, at the first sample)
        except ImportError:
            raise InputError(
                "E_CONFIG",
                "algorithm cmaes needs the Python package 'cmaes' (pip install cmaes), "
                "which is not installed in this image",
                "tune.algorithm.algorithmName",
            ) from None
        return samplers.CmaEsSampler(
            seed=seed,
            sigma0=_float_setting(space, "sigma", None),
            restart_strategy=space.setting("restart_strategy"),
        )
    if algo == "bayesianoptimization":
        ignored = [
            s.name for s in space.algorithm.algorithmSettings if s.name not in ("random_state",)
        ]
        ignored = [n for n in ignored if n != "n_initial_points"]
        if ignored:
            log.info(
                "bayesianoptimization: settings %s have no Optuna GPSampler equivalent", ignored
            )
        return samplers.GPSampler(
            seed=seed, n_startup_trials=_int_setting(space, "n_initial_points", 10) or 10
        )
    raise AssertionError(f"unhandled algorithm {algo}")  # validate_space rejects others


def _resource(space: SearchSpace) -> Parameter | None:
    """Hyperband's resource parameter (fixed at its max; the pruner cuts trials short)."""
    if space.algorithm.algorithmName != "hyperband":
        return None
    name = space.setting("resource_name")
    return next((p for p in space.parameters if p.name == name), None)


def make_pruner(space: SearchSpace) -> optuna.pruners.BasePruner:
    """The Optuna pruner of the space's early stopping or Hyperband (see :data:`PRUNERS`)."""
    import optuna

    res = _resource(space)
    if res is not None:
        lo = max(1, math.floor(float(res.feasibleSpace.min or 1)))
        hi = max(
            lo, math.floor(float(_float_setting(space, "r_l", None) or res.feasibleSpace.max or lo))
        )
        eta = _float_setting(space, "eta", 3.0) or 3.0
        return optuna.pruners.HyperbandPruner(
            min_resource=lo, max_resource=hi, reduction_factor=max(2, round(eta))
        )
    if space.earlyStopping is not None:
        return optuna.pruners.MedianPruner(
            n_startup_trials=int(space.early_stopping_setting("min_trials_required", "3") or 3),
            n_warmup_steps=int(space.early_stopping_setting("start_step", "4") or 4),
        )
    return optuna.pruners.NopPruner()


def suggest(trial: optuna.trial.Trial, space: SearchSpace) -> dict[str, Any]:
    """Draw one assignment: dotted config field -> value typed for the config.

    Katib's ``normal``/``logNormal`` have no Optuna counterpart: they are drawn uniformly
    (log-uniformly) over ``min``..``max``. Grid search draws every parameter from its grid axis.
    """
    out: dict[str, Any] = {}
    res = _resource(space)
    grid = space.algorithm.algorithmName == "grid"
    axes = _grid_axes(space) if grid else {}
    for p in space.parameters:
        fs = p.feasibleSpace
        if res is not None and p.name == res.name:
            out[p.name] = sample_value(p, fs.max)
            continue
        if grid:
            raw: Any = trial.suggest_categorical(p.name, axes[p.name])
        elif p.parameterType in ("discrete", "categorical"):
            choices = [sample_value(p, v) for v in fs.list or []]
            raw = trial.suggest_categorical(p.name, choices)
        else:
            log_scale = fs.distribution in ("logUniform", "logNormal")
            lo, hi = float(fs.min or 0), float(fs.max or 0)
            step = float(fs.step) if fs.step is not None and not log_scale else None
            if p.parameterType == "int":
                raw = trial.suggest_int(
                    p.name, int(lo), int(hi), step=int(step or 1), log=log_scale
                )
            else:
                raw = trial.suggest_float(p.name, lo, hi, step=step, log=log_scale)
        out[p.name] = sample_value(p, raw)
    return out


def _grid_axes(space: SearchSpace) -> dict[str, list[Any]]:
    axes: dict[str, list[Any]] = {p.name: [] for p in space.parameters}
    for point in grid_points(space):
        for k, v in point.items():
            if v not in axes[k]:
                axes[k].append(v)
    return axes
