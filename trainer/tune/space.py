"""A hyperparameter search space in Katib's own terms, parsed and checked before anything runs.

A space is written once, with Katib's Experiment vocabulary and camelCase keys (``parameters``
with ``parameterType`` and ``feasibleSpace``, ``objective``, ``algorithm``, ``earlyStopping`` and
the trial counts), and read by both engines: the Katib Experiment builder and the local Optuna
study. A Katib cluster checks Experiments in its validating webhook and its suggestion services,
not by schema, so :func:`validate_space` makes the same checks here, with one-line errors that
name the field (``tune.parameters[1].feasibleSpace.min``) and the value.

Parameter names are dotted paths of trainer config fields (``optim.lr``, ``model.hidden_dim``);
feasible-space values are strings, as in Katib (numbers written in YAML are accepted and turned
into strings on load).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from trainer.base.errors import InputError
from trainer.base.typedconfig import coerce

ParameterType = Literal["double", "int", "discrete", "categorical"]
Distribution = Literal["uniform", "logUniform", "normal", "logNormal"]
AlgorithmName = Literal[
    "random", "grid", "tpe", "multivariate-tpe", "cmaes", "bayesianoptimization", "hyperband"
]
CLUSTER_ALGORITHMS = ("random", "tpe", "cmaes", "grid", "multivariate-tpe")
GOPTUNA_ALGORITHMS = ("random", "tpe", "cmaes")
"""Those served by Katib's goptuna service, which samples every double uniformly (it ignores
``distribution``: found on Katib v0.19, pkg/suggestion/v1beta1/goptuna/converter.go)."""
"""The algorithms a Katib Experiment of the tune step can use: those whose suggestion service the
test cluster builds (hack/cluster/addons/katib.sh: goptuna serves random, tpe and cmaes;
Katib's optuna service grid and multivariate-tpe). bayesianoptimization and hyperband run only on
the local engine."""
_Strings = list[str]  # an alias: inside FeasibleSpace the name ``list`` is the field


def failure_budget_spent(failed: int, max_failed: int) -> bool:
    """Katib's rule, which both engines follow: a search fails as soon as its failed trials
    *reach* ``maxFailedTrialCount`` (``failed >= max``, once one has failed: 0 and 1 both fail
    it at the first failure). Found on the real Katib v0.19; its docs say "max failed"."""
    return failed > 0 and failed >= max_failed


ALGORITHM_SETTINGS: dict[str, dict[str, str]] = {
    "random": {"random_state": "int"},
    "grid": {},
    "tpe": {
        "n_startup_trials": "int>0",
        "n_ei_candidates": "int>0",
        "random_state": "int",
        "gamma": "float>0",
        "prior_weight": "float>0",
    },
    "multivariate-tpe": {
        "n_startup_trials": "int>0",
        "n_ei_candidates": "int>0",
        "random_state": "int",
    },
    "cmaes": {"random_state": "int", "sigma": "float>0", "restart_strategy": "str"},
    "bayesianoptimization": {
        "base_estimator": "str",
        "n_initial_points": "int>0",
        "acq_func": "str",
        "acq_optimizer": "str",
        "random_state": "int",
    },
    "hyperband": {"resource_name": "str", "eta": "float>1", "r_l": "float>0"},
}
"""Settings each algorithm's Katib suggestion service accepts, with the rule its value obeys."""

EARLY_STOPPING_SETTINGS: dict[str, str] = {"min_trials_required": "int>0", "start_step": "int>0"}
"""Settings of Katib's ``medianstop``: trials that must finish before any is stopped (default
3), and reported evaluations a trial makes before it can be stopped (default 4)."""

DOTTED_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
"""A dotted config path (``optim.lr``): what a parameter's name must be."""


@dataclass(kw_only=True, slots=True)
class FeasibleSpace:
    """Where a parameter's values come from: a range (double, int) or a list (discrete,
    categorical). Values are strings, as in Katib's Experiment."""

    min: str | None = None
    """Lower bound (double, int), inclusive."""
    max: str | None = None
    """Upper bound (double, int), inclusive."""
    step: str | None = None
    """Grid spacing; needed by ``grid`` for doubles, optional elsewhere."""
    list: _Strings | None = None
    """The values (discrete: numbers; categorical: any strings)."""
    distribution: Distribution | None = None
    """How values are drawn from the range; ``None``: uniform."""


@dataclass(kw_only=True, slots=True)
class Parameter:
    """One searched trainer config field."""

    name: str
    """The trainer config field, dotted: ``optim.lr``, ``model.hidden_dim``."""
    parameterType: ParameterType
    """``double``/``int`` over ``min``..``max``; ``discrete``/``categorical`` over ``list``."""
    feasibleSpace: FeasibleSpace
    """The values the parameter may take."""


@dataclass(kw_only=True, slots=True)
class Objective:
    """What the search optimises: a metric the trainer reports at each evaluation."""

    type: Literal["maximize", "minimize"]
    """Whether larger or smaller is better."""
    objectiveMetricName: str
    """The metric, as the worker reports it (``val_loss``, ``val_accuracy``, ``val_rmse``)."""
    goal: float | None = None
    """Stop the search once a trial reaches this value."""
    additionalMetricNames: list[str] = field(default_factory=list)
    """Further metrics recorded per trial (not optimised)."""


@dataclass(kw_only=True, slots=True)
class Setting:
    """A named algorithm or early-stopping setting; values are strings, as in Katib."""

    name: str
    value: str


@dataclass(kw_only=True, slots=True)
class Algorithm:
    """The search strategy and its settings (see :data:`ALGORITHM_SETTINGS`)."""

    algorithmName: AlgorithmName
    algorithmSettings: list[Setting] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class EarlyStopping:
    """Stop unpromising trials early: Katib's median stopping rule."""

    algorithmName: Literal["medianstop"]
    algorithmSettings: list[Setting] = field(default_factory=list)
    """``min_trials_required`` and ``start_step`` (see :data:`EARLY_STOPPING_SETTINGS`)."""


@dataclass(kw_only=True, slots=True)
class SearchSpace:
    """A whole search: what to vary, what to optimise, how, and with what budget."""

    parameters: list[Parameter]
    """The searched config fields (at least one, distinct names)."""
    objective: Objective
    algorithm: Algorithm
    earlyStopping: EarlyStopping | None = None
    """Median stopping of unpromising trials; ``None``: every trial runs to its end."""
    maxTrialCount: int = 12
    """Trials in all (successful or not)."""
    parallelTrialCount: int = 2
    """Trials running at the same time."""
    maxFailedTrialCount: int = 3
    """The search fails once this many trials have failed."""

    def setting(self, name: str, default: str | None = None) -> str | None:
        """The algorithm setting ``name``, or ``default`` when it is not set."""
        for s in self.algorithm.algorithmSettings:
            if s.name == name:
                return s.value
        return default

    def early_stopping_setting(self, name: str, default: str | None = None) -> str | None:
        """The early-stopping setting ``name``, or ``default`` (also when early stopping is off)."""
        for s in self.earlyStopping.algorithmSettings if self.earlyStopping else []:
            if s.name == name:
                return s.value
        return default


# --------------------------------------------------------------------------------------------
# Loading and checking
# --------------------------------------------------------------------------------------------


def _stringify(data: dict[str, Any]) -> dict[str, Any]:
    """A copy with numbers in feasible spaces and settings turned into Katib's strings."""

    def text(v: Any) -> Any:
        if isinstance(v, int | float) and not isinstance(v, bool):
            return str(v)
        return v

    out = dict(data)
    params = out.get("parameters")
    if isinstance(params, list):
        out["parameters"] = [dict(p) if isinstance(p, dict) else p for p in params]
        for p in out["parameters"]:
            fs = p.get("feasibleSpace") if isinstance(p, dict) else None
            if isinstance(fs, dict):
                fs = p["feasibleSpace"] = {k: text(v) for k, v in fs.items()}
                if isinstance(fs.get("list"), list):
                    fs["list"] = [text(v) for v in fs["list"]]
    for section in ("algorithm", "earlyStopping"):
        sec = out.get(section)
        if isinstance(sec, dict) and isinstance(sec.get("algorithmSettings"), list):
            out[section] = dict(sec)
            out[section]["algorithmSettings"] = [
                {k: text(v) for k, v in s.items()} if isinstance(s, dict) else s
                for s in sec["algorithmSettings"]
            ]
    return out


def load_space(
    data: dict[str, Any], *, config_fields: set[str] | None = None, where: str = "tune"
) -> SearchSpace:
    """Parse and check a search space from plain data (YAML or JSON).

    Args:
        data: the space in Katib's vocabulary; unknown keys are rejected.
        config_fields: valid dotted config paths; when given, every parameter must name one.
        where: prefix of the dotted paths in error messages.

    Raises:
        InputError: one line naming the field (``tune.parameters[0].feasibleSpace.min``) and value.
    """
    if not isinstance(data, dict):
        raise InputError("E_CONFIG", f"{where} must be a mapping, got {data!r}", where)
    space: SearchSpace = coerce(_stringify(data), SearchSpace, where)
    validate_space(space, config_fields=config_fields, where=where)
    return space


def bad_value(where: str, rule: str, value: Any) -> InputError:
    """The one-line error for a bad value at ``where`` (a dotted path into the space)."""
    return InputError("E_CONFIG", f"{where} {rule}, got {value!r}", where)


def _number(text: str | None, where: str, *, integral: bool = False) -> float:
    """``text`` as a number; an integer when ``integral``."""
    if text is None:
        raise bad_value(where, "must be set", text)
    try:
        value = float(text)
    except ValueError:
        raise bad_value(
            where, "must be an integer" if integral else "must be a number", text
        ) from None
    if not math.isfinite(value):
        raise bad_value(where, "must be finite", text)
    if integral:
        try:
            int(text)
        except ValueError:
            raise bad_value(where, "must be an integer", text) from None
    return value


def _check_setting(rule: str, value: str, where: str) -> None:
    kind, _, bound = rule.partition(">")
    if kind == "str":
        if not value:
            raise bad_value(where, "must not be empty", value)
        return
    number = _number(value, where, integral=kind == "int")
    if bound and not number > float(bound):
        raise bad_value(where, f"must be > {bound}", value)


def _check_settings(settings: list[Setting], known: dict[str, str], owner: str, where: str) -> None:
    seen: set[str] = set()
    for i, s in enumerate(settings):
        at = f"{where}[{i}]"
        if s.name not in known:
            names = ", ".join(sorted(known)) or "none"
            raise bad_value(f"{at}.name", f"is not a setting of {owner} (known: {names})", s.name)
        if s.name in seen:
            raise bad_value(f"{at}.name", "is set twice", s.name)
        seen.add(s.name)
        _check_setting(known[s.name], s.value, f"{at}.value")


def _check_parameter(p: Parameter, at: str, algorithm: str) -> None:
    fs = p.feasibleSpace
    fat = f"{at}.feasibleSpace"
    if not p.name or not DOTTED_NAME.match(p.name):
        raise bad_value(f"{at}.name", "must be a dotted config field like optim.lr", p.name)
    if p.parameterType in ("double", "int"):
        integral = p.parameterType == "int"
        if fs.list is not None:
            rule = f"is not allowed for parameterType {p.parameterType}"
            raise bad_value(f"{fat}.list", rule, fs.list)
        lo = _number(fs.min, f"{fat}.min", integral=integral)
        hi = _number(fs.max, f"{fat}.max", integral=integral)
        if lo > hi:
            raise bad_value(f"{fat}.min", f"must be <= feasibleSpace.max={fs.max}", fs.min)
        if fs.step is not None:
            step = _number(fs.step, f"{fat}.step", integral=integral)
            if step <= 0:
                raise bad_value(f"{fat}.step", "must be > 0", fs.step)
        elif algorithm == "grid" and p.parameterType == "double":
            rule = "must be set for a double parameter with algorithm grid"
            raise bad_value(f"{fat}.step", rule, None)
        if fs.distribution in ("logUniform", "logNormal") and lo <= 0:
            raise bad_value(f"{fat}.min", f"must be > 0 for distribution {fs.distribution}", fs.min)
        return
    for key in ("min", "max", "step", "distribution"):
        if getattr(fs, key) is not None:
            raise bad_value(
                f"{fat}.{key}",
                f"is not allowed for parameterType {p.parameterType} (use list)",
                getattr(fs, key),
            )
    if not fs.list:
        raise bad_value(f"{fat}.list", f"must be a non-empty list for {p.parameterType}", fs.list)
    for j, v in enumerate(fs.list):
        if p.parameterType == "discrete":
            _number(v, f"{fat}.list[{j}]")
        if fs.list.index(v) != j:
            raise bad_value(f"{fat}.list[{j}]", "repeats an earlier value", v)


def grid_size(space: SearchSpace) -> int:
    """How many points a grid over ``space`` has (ranges cut by ``step``, 1 by default for int)."""
    total = 1
    for p in space.parameters:
        fs = p.feasibleSpace
        if fs.list is not None:
            total *= len(fs.list)
            continue
        lo, hi = float(fs.min or 0), float(fs.max or 0)
        step = float(fs.step) if fs.step is not None else 1.0
        total *= math.floor((hi - lo) / step + 1e-9) + 1
    return total


def validate_space(
    space: SearchSpace, *, config_fields: set[str] | None = None, where: str = "tune"
) -> None:
    """Check what Katib's webhook and suggestion services check, and that parameters map to
    config fields.

    Args:
        space: a parsed space.
        config_fields: valid dotted config paths (see
            :func:`trainer.base.typedconfig.config_fields`); ``None`` skips that check.
        where: prefix of the dotted paths in error messages.

    Raises:
        InputError: the first problem, one line naming the field and the value.
    """
    algo = space.algorithm.algorithmName
    if not space.parameters:
        raise bad_value(f"{where}.parameters", "must list at least one parameter", space.parameters)
    names: set[str] = set()
    for i, p in enumerate(space.parameters):
        at = f"{where}.parameters[{i}]"
        _check_parameter(p, at, algo)
        if p.name in names:
            raise bad_value(f"{at}.name", "repeats an earlier parameter", p.name)
        names.add(p.name)
        if config_fields is not None and p.name not in config_fields:
            close = sorted(f for f in config_fields if f.split(".")[-1] == p.name.split(".")[-1])
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise bad_value(f"{at}.name", f"maps to no trainer config field{hint}", p.name)

    obj = space.objective
    if not obj.objectiveMetricName.strip():
        raise bad_value(f"{where}.objective.objectiveMetricName", "must not be empty", "")
    for j, m in enumerate(obj.additionalMetricNames):
        if not m.strip() or m == obj.objectiveMetricName or obj.additionalMetricNames.index(m) != j:
            raise bad_value(
                f"{where}.objective.additionalMetricNames[{j}]",
                "must be non-empty, distinct and not the objective metric",
                m,
            )
    if obj.goal is not None and not math.isfinite(obj.goal):
        raise bad_value(f"{where}.objective.goal", "must be finite", obj.goal)
    if obj.goal is not None and algo == "hyperband":
        # Hyperband plans its brackets (trials and their budgets) up front; ending the search
        # at a goal would cut brackets short and leave the plan meaningless.
        rule = "cannot be combined with algorithm hyperband"
        raise bad_value(f"{where}.objective.goal", rule, obj.goal)

    at = f"{where}.algorithm.algorithmSettings"
    _check_settings(space.algorithm.algorithmSettings, ALGORITHM_SETTINGS[algo], algo, at)
    if algo == "hyperband":
        resource = space.setting("resource_name")
        if resource is None:
            raise bad_value(at, "must set resource_name (the parameter hyperband budgets)", None)
        res = next((p for p in space.parameters if p.name == resource), None)
        if res is None or res.parameterType not in ("int", "double"):
            raise bad_value(at, "resource_name must name an int or double parameter", resource)
    if algo == "cmaes":
        if len(space.parameters) < 2:
            raise bad_value(
                f"{where}.parameters", "cmaes needs at least two parameters", len(space.parameters)
            )
        for i, p in enumerate(space.parameters):
            if p.parameterType == "categorical":
                raise bad_value(
                    f"{where}.parameters[{i}].parameterType",
                    "cmaes supports double, int and discrete parameters only",
                    p.parameterType,
                )

    if space.earlyStopping is not None:
        _check_settings(
            space.earlyStopping.algorithmSettings,
            EARLY_STOPPING_SETTINGS,
            space.earlyStopping.algorithmName,
            f"{where}.earlyStopping.algorithmSettings",
        )

    counts = {
        "maxTrialCount": space.maxTrialCount,
        "parallelTrialCount": space.parallelTrialCount,
        "maxFailedTrialCount": space.maxFailedTrialCount,
    }
    for key, value in counts.items():
        if value <= 0:
            raise bad_value(f"{where}.{key}", "must be > 0", value)
    if space.parallelTrialCount > space.maxTrialCount:
        raise bad_value(
            f"{where}.parallelTrialCount",
            f"trial counts out of order: must be <= maxTrialCount={space.maxTrialCount}",
            space.parallelTrialCount,
        )
    if space.maxFailedTrialCount > space.maxTrialCount:
        raise bad_value(
            f"{where}.maxFailedTrialCount",
            f"trial counts out of order: must be <= maxTrialCount={space.maxTrialCount}",
            space.maxFailedTrialCount,
        )
    if algo == "grid" and space.maxTrialCount > (size := grid_size(space)):
        raise bad_value(
            f"{where}.maxTrialCount",
            f"exceeds the {size} points of the grid",
            space.maxTrialCount,
        )


def example_space() -> dict[str, Any]:
    """A good default space for the tabular MLP when the table size is unknown: learning rate,
    width, weight decay, dropout; TPE with median stopping, minimising the validation loss."""
    return default_space(None)


def default_space(train_rows: int | None) -> dict[str, Any]:
    """The default space for the tabular MLP, scaled with the training rows.

    Trials get the train step's settings from the data (batch, epochs, early stopping); the
    space scales the same way: small tables search narrower networks, more regularisation and
    more (cheap) trials; large ones wider networks, less dropout and fewer (costly) trials.
    Widths span ``[w / 8, w]`` with ``w = clamp(pow2(4 * sqrt(rows)), 64, 512)``; ``None``
    (size unknown) gives 32..256.
    """
    n = train_rows if train_rows is not None else 4096
    top = min(max(1 << max(math.floor(math.log2(4 * math.sqrt(max(n, 1)))), 0), 64), 512)
    small, large = train_rows is not None and n < 10_000, n >= 1_000_000
    reg = "0.3" if n < 1000 else "0.1"

    def num(name: str, kind: str, lo: str, hi: str, **more: str) -> dict[str, Any]:
        return {
            "name": name,
            "parameterType": kind,
            "feasibleSpace": {"min": lo, "max": hi, **more},
        }

    return {
        "parameters": [
            num("optim.lr", "double", "0.0001", "0.03", distribution="logUniform"),
            num("model.hidden_dim", "int", str(top // 8), str(top), step=str(top // 8)),
            num("optim.weight_decay", "double", "0.0", reg),
            num("model.dropout", "double", "0.0", "0.5" if n < 1000 else "0.1" if large else "0.3"),
        ],
        "objective": {"type": "minimize", "objectiveMetricName": "val_loss"},
        "algorithm": {
            "algorithmName": "tpe",
            "algorithmSettings": [{"name": "n_startup_trials", "value": "4"}],
        },
        "earlyStopping": {
            "algorithmName": "medianstop",
            "algorithmSettings": [
                {"name": "min_trials_required", "value": "3"},
                {"name": "start_step", "value": "2"},
            ],
        },
        "maxTrialCount": 20 if small else 8 if large else 12,
        "parallelTrialCount": 2,
        "maxFailedTrialCount": 3,
    }
