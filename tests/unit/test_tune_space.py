"""The search space: Katib's vocabulary parsed, and the webhook's checks (plus ours) made."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from trainer.base.errors import InputError
from trainer.base.typedconfig import apply_overrides, config_fields
from trainer.config import WorkerConfig
from trainer.steps.train import TrainStepConfig
from trainer.tune.space import Parameter, default_space, example_space, load_space
from trainer.tune.values import grid_points, sample_value, trial_overrides

FIELDS = config_fields(TrainStepConfig)


def space(**changes: Any) -> dict[str, Any]:
    """The example space with dotted ``changes`` (``parameters.0.feasibleSpace.min``) applied."""
    data = copy.deepcopy(example_space())
    for path, value in changes.items():
        node: Any = data
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if last.isdigit():
            node[int(last)] = value
        else:
            node[last] = value
    return data


def test_example_space_loads_and_maps_to_config_fields() -> None:
    s = load_space(example_space(), config_fields=FIELDS)
    assert [p.name for p in s.parameters] == [
        "optim.lr",
        "model.hidden_dim",
        "optim.weight_decay",
        "model.dropout",
    ]
    assert s.algorithm.algorithmName == "tpe"
    assert s.setting("n_startup_trials") == "4"
    assert s.setting("missing", "x") == "x"
    assert s.earlyStopping is not None and s.earlyStopping.algorithmName == "medianstop"
    assert (s.maxTrialCount, s.parallelTrialCount, s.maxFailedTrialCount) == (12, 2, 3)


def test_numbers_written_in_yaml_become_katib_strings() -> None:
    data = space(parameters__0__feasibleSpace={"min": 1e-4, "max": 0.03})
    s = load_space(data)
    assert (s.parameters[0].feasibleSpace.min, s.parameters[0].feasibleSpace.max) == (
        "0.0001",
        "0.03",
    )


def test_config_fields_walks_nested_and_optional_sections() -> None:
    assert {"optim.lr", "model.hidden_dim", "train.epochs", "train.early_stopping.patience"} <= (
        FIELDS
    )
    assert "optim" not in FIELDS
    assert "data.train_uri" in config_fields(WorkerConfig)


CAT = {"name": "model.activation", "parameterType": "categorical", "feasibleSpace": {}}


@pytest.mark.parametrize(
    ("data", "where", "words"),
    [
        (space(algorithm={"algorithmName": "annealing"}), "tune.algorithm.algorithmName", "one of"),
        (
            space(parameters__0__feasibleSpace={"min": "0.1", "max": "0.01"}),
            "tune.parameters[0].feasibleSpace.min",
            "must be <= feasibleSpace.max=0.01",
        ),
        (
            space(parameters__0__feasibleSpace={"min": "low", "max": "0.01"}),
            "tune.parameters[0].feasibleSpace.min",
            "must be a number",
        ),
        (
            space(parameters__1__feasibleSpace={"min": "32.5", "max": "256"}),
            "tune.parameters[1].feasibleSpace.min",
            "must be an integer",
        ),
        (
            space(parameters__1__feasibleSpace={"min": "32", "max": "256", "step": "0"}),
            "tune.parameters[1].feasibleSpace.step",
            "must be > 0",
        ),
        (
            space(parameters__0__feasibleSpace={"max": "0.01"}),
            "tune.parameters[0].feasibleSpace.min",
            "must be set",
        ),
        (
            space(parameters__0__feasibleSpace={"min": "0", "max": "1", "list": ["1"]}),
            "tune.parameters[0].feasibleSpace.list",
            "not allowed for parameterType double",
        ),
        (
            space(
                parameters__0__feasibleSpace={"min": "0", "max": "1", "distribution": "logUniform"}
            ),
            "tune.parameters[0].feasibleSpace.min",
            "must be > 0 for distribution logUniform",
        ),
        (space(parameters__3=CAT), "tune.parameters[3].feasibleSpace.list", "non-empty list"),
        (
            space(
                parameters__3={**CAT, "parameterType": "discrete", "feasibleSpace": {"list": ["a"]}}
            ),
            "tune.parameters[3].feasibleSpace.list[0]",
            "must be a number",
        ),
        (
            space(parameters__3={**CAT, "feasibleSpace": {"list": ["gelu"], "min": "1"}}),
            "tune.parameters[3].feasibleSpace.min",
            "not allowed for parameterType categorical",
        ),
        (space(parameters__3__name="optim.lr"), "tune.parameters[3].name", "repeats"),
        (
            space(parameters__3__name="optim.learning_rate"),
            "tune.parameters[3].name",
            "maps to no trainer config field",
        ),
        (
            space(algorithm={"algorithmName": "grid"}),
            "tune.parameters[0].feasibleSpace.step",
            "must be set for a double parameter with algorithm grid",
        ),
        (space(maxTrialCount=0), "tune.maxTrialCount", "must be > 0"),
        (space(parallelTrialCount=13), "tune.parallelTrialCount", "trial counts out of order"),
        (space(maxFailedTrialCount=13), "tune.maxFailedTrialCount", "trial counts out of order"),
        (
            space(objective={"type": "minimize", "objectiveMetricName": " "}),
            "tune.objective.objectiveMetricName",
            "must not be empty",
        ),
        (
            space(
                objective={"type": "minimize", "objectiveMetricName": "val_loss", "goal": 0.1},
                algorithm={
                    "algorithmName": "hyperband",
                    "algorithmSettings": [{"name": "resource_name", "value": "model.hidden_dim"}],
                },
            ),
            "tune.objective.goal",
            "cannot be combined with algorithm hyperband",
        ),
        (
            space(algorithm={"algorithmName": "hyperband"}),
            "tune.algorithm.algorithmSettings",
            "resource_name",
        ),
        (
            space(earlyStopping__algorithmSettings=[{"name": "min_trials", "value": "3"}]),
            "tune.earlyStopping.algorithmSettings[0].name",
            "is not a setting of medianstop",
        ),
        (
            space(earlyStopping__algorithmSettings=[{"name": "min_trials_required", "value": 0}]),
            "tune.earlyStopping.algorithmSettings[0].value",
            "must be > 0",
        ),
        (
            space(earlyStopping__algorithmSettings=[{"name": "start_step", "value": "two"}]),
            "tune.earlyStopping.algorithmSettings[0].value",
            "must be an integer",
        ),
        (
            space(
                algorithm={
                    "algorithmName": "tpe",
                    "algorithmSettings": [{"name": "n", "value": "1"}],
                }
            ),
            "tune.algorithm.algorithmSettings[0].name",
            "is not a setting of tpe",
        ),
        (space(surprise=1), "tune.surprise", "unknown config key"),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else None,
)
def test_bad_spaces_fail_with_one_line_naming_the_field(
    data: dict[str, Any], where: str, words: str
) -> None:
    with pytest.raises(InputError) as e:
        load_space(data, config_fields=FIELDS)
    assert e.value.where == where
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_grid_needs_enough_points_and_enumerates_them() -> None:
    data = {
        "parameters": [
            {
                "name": "optim.lr",
                "parameterType": "double",
                "feasibleSpace": {"min": "0.1", "max": "0.3", "step": "0.1"},
            },
            {
                "name": "model.activation",
                "parameterType": "categorical",
                "feasibleSpace": {"list": ["relu", "gelu"]},
            },
        ],
        "objective": {"type": "minimize", "objectiveMetricName": "val_loss"},
        "algorithm": {"algorithmName": "grid"},
        "maxTrialCount": 6,
        "parallelTrialCount": 1,
    }
    s = load_space(data, config_fields=FIELDS)
    points = grid_points(s)
    assert len(points) == 6
    assert {p["optim.lr"] for p in points} == {0.1, 0.2, 0.3}
    with pytest.raises(InputError, match="exceeds the 6 points of the grid"):
        load_space({**data, "maxTrialCount": 7})


@pytest.mark.parametrize(
    ("ptype", "space_", "raw", "expected"),
    [
        ("int", {"min": "32", "max": "256"}, "64.0", 64),
        ("int", {"min": "32", "max": "256"}, 63.6, 64),
        ("double", {"min": "0", "max": "1"}, "0.25", 0.25),
        ("discrete", {"list": ["32", "64"]}, 64.0, 64),
        ("discrete", {"list": ["0.5", "1.5"]}, "1.5", 1.5),
        ("categorical", {"list": ["relu", "gelu"]}, "gelu", "gelu"),
    ],
)
def test_sample_value_takes_the_fields_type(
    ptype: str, space_: dict[str, Any], raw: Any, expected: Any
) -> None:
    from trainer.tune.space import FeasibleSpace

    p = Parameter(name="x.y", parameterType=ptype, feasibleSpace=FeasibleSpace(**space_))  # type: ignore[arg-type]
    value = sample_value(p, raw)
    assert value == expected and type(value) is type(expected)


def test_sample_value_rejects_junk() -> None:
    from trainer.tune.space import FeasibleSpace

    p = Parameter(name="optim.lr", parameterType="double", feasibleSpace=FeasibleSpace())
    with pytest.raises(InputError, match=r"parameter optim\.lr must be a double value"):
        sample_value(p, "fast")


def test_trial_overrides_apply_like_the_workers_set() -> None:
    ov = trial_overrides({"optim.lr": 0.01, "model.hidden_dim": 64, "optim.fused": "true"})
    assert ov == {"optim.lr": 0.01, "model.hidden_dim": 64, "optim.fused": True}
    out = apply_overrides({"optim": {"lr": 1.0}}, ov)
    assert out["optim"] == {"lr": 0.01, "fused": True}
    with pytest.raises(InputError, match="dotted config field"):
        trial_overrides({"optim lr": 1})


@pytest.mark.parametrize("rows", [105, 7_000, 70_000, 10_000_000], ids=lambda r: f"{r}-rows")
def test_default_space_loads_at_every_table_size(rows: int) -> None:
    s = load_space(default_space(rows), config_fields=FIELDS)
    assert [p.name for p in s.parameters] == [
        "optim.lr",
        "model.hidden_dim",
        "optim.weight_decay",
        "model.dropout",
    ]


def test_default_space_scales_with_the_table() -> None:
    def width(rows: int | None) -> tuple[int, int]:
        fs = default_space(rows)["parameters"][1]["feasibleSpace"]
        return int(fs["min"]), int(fs["max"])

    def dropout(rows: int) -> float:
        return float(default_space(rows)["parameters"][3]["feasibleSpace"]["max"])

    assert width(105) == (8, 64)  # a 150-row table: narrow networks
    assert width(10_000_000) == (64, 512)
    assert dropout(105) > dropout(7_000) > dropout(10_000_000)
    trials = [default_space(n)["maxTrialCount"] for n in (105, 70_000, 10_000_000)]
    assert trials == sorted(trials, reverse=True)  # cheap trials: more of them
    assert default_space(None) == example_space()
    assert width(None) == (32, 256)
