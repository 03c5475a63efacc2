"""The one parser and check of pipeline parameters shared by local runs, cluster runs and render."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from pipelines.params import check_parameters, typed_parameters
from pipelines.render import render_experiment
from trainer.base.errors import InputError


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        (["epochs=3"], {"epochs": 3}),
        (["epochs=3.0"], {"epochs": 3}),
        (["learning_rate=1"], {"learning_rate": 1.0}),
        (["tune.enabled=true"], {"tune_enabled": True}),
        (["tune_enabled=no"], {"tune_enabled": False}),
        (['hyperparams_json={"optim.weight_decay": 0.1}'],
         {"hyperparams_json": '{"optim.weight_decay": 0.1}'}),
        (['gpu_node_selector={"pool": "h200"}'], {"gpu_node_selector": {"pool": "h200"}}),
        (["target=a=b"], {"target": "a=b"}),
    ],
    ids=["int", "int-as-float", "float-from-int", "alias", "bool-word", "json-string", "dict",
         "value-with-equals"],
)  # fmt: skip
def test_values_are_typed_by_the_pipeline_signature(
    pairs: list[str], expected: dict[str, Any]
) -> None:
    assert typed_parameters(pairs, require=False) == expected


@pytest.mark.parametrize(
    ("params", "where", "text"),
    [
        ({"epochs": -1}, "epochs", "epochs must be >= 0 (0: chosen from the data)"),
        ({"learning_rate": -0.1}, "learning_rate", "learning_rate must be > 0"),
        ({"gpus_per_node": -1}, "gpus_per_node", ">= 0"),
        ({"hyperparams_json": '{"optim.weight_decay": -1}'}, "hyperparams_json",
         "hyperparams_json: optim.weight_decay must be >= 0"),
        ({"hyperparams_json": "[1]"}, "hyperparams_json", "must be a JSON object"),
        ({"train_config_json": '{"checkpoint_every_steps": 0}'}, "train_config_json",
         "checkpoint_every_steps"),
        ({"tune_space_json": '{"objective": 1}'}, "tune_space_json", "tune_space_json: "),
        ({"gate_threshold": float("nan")}, "gate_threshold", ""),
        ({"registered_model_name": "a:b"}, "registered_model_name",
         "registered_model_name must not contain"),
        ({"registry_uri": "localhost:5000"}, "registry_uri", "must be a URI"),
        ({"launcher": "slurm"}, "launcher", "launcher must be one of local, pytorchjob"),
        ({"tune_engine": "ray"}, "tune_engine", "tune_engine must be one of"),
        ({"gate_baseline": "linear"}, "gate_baseline",
         "gate_baseline must be one of ['trivial', 'best'], got 'linear'"),
        ({"max_champion_bytes": 0}, "max_champion_bytes", "max_champion_bytes must be > 0"),
    ],
    ids=["epochs", "lr", "gpus", "hyperparams-value", "hyperparams-list", "train-config",
         "tune-space", "threshold-nan", "model-name", "registry-uri", "launcher", "tune-engine",
         "gate-baseline", "max-champion-bytes"],
)  # fmt: skip
def test_every_bad_value_is_named_by_its_parameter(
    params: dict[str, Any], where: str, text: str
) -> None:
    with pytest.raises(InputError) as e:
        check_parameters({"data_uri": "d.parquet", **params})
    assert e.value.code == "E_PARAM"
    assert e.value.where == where
    assert text in str(e.value)


def test_defaults_pass_and_are_filled_in() -> None:
    full = check_parameters({"data_uri": "d.parquet"})
    assert full["epochs"] == 0 and full["launcher"] == "local"  # 0: chosen from the data


def test_render_experiment_uses_tune_space_json() -> None:
    space = {
        "parameters": [
            {"name": "optim.weight_decay", "parameterType": "double",
             "feasibleSpace": {"min": "0.0", "max": "0.3"}},
        ],
        "objective": {"type": "minimize", "objectiveMetricName": "val_loss"},
        "algorithm": {"algorithmName": "random", "algorithmSettings": []},
        "maxTrialCount": 4, "parallelTrialCount": 2, "maxFailedTrialCount": 1,
    }  # fmt: skip
    exp = yaml.safe_load(render_experiment({"tune_space_json": json.dumps(space)}))
    assert [p["name"] for p in exp["spec"]["parameters"]] == ["optim-weight-decay"]
    assert exp["spec"]["maxTrialCount"] == 4
    builtin = yaml.safe_load(render_experiment({}))
    assert len(builtin["spec"]["parameters"]) > 1
