"""One pipeline-parameter mapping: the train and tune components train what the user asked for.

Both components are called as KFP runs them (their Python function, local artifacts), and
both really train: the seed must reach the weights, and tune's trials must start from the
user's settings, with only the searched fields changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl
from safetensors.torch import load_file

from components.images import CPU_IMAGE, CUDA_IMAGE
from components.train import train as train_component
from pipelines.params import train_settings
from tests.helpers import write_dataset
from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.steps.train import TrainStepConfig

TINY = {"model.hidden_dim": 8, "train.log_every_steps": 1000}
"""A model small enough that a real training takes a second or two."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data"), rows=200)


def train_weights(dataset: Path, out: Path, **params: Any) -> dict[str, Any]:
    """Run the train component's function on the local launcher; the model's weights."""
    model = dsl.Model(uri=str(out / "model"))
    train_component.python_func(
        dataset=dsl.Dataset(uri=str(dataset)),
        model=model,
        metrics=dsl.Metrics(uri=str(out / "metrics")),
        epochs=1,
        batch_size=50,
        gpus_per_node=0,
        hyperparams_json=json.dumps(TINY),
        **params,
    )
    return load_file(str(Path(model.path) / "model.safetensors"))


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


# In make test-slow (16 s alone, 35 s beside CI's cluster): make test keeps its 15 minutes.
@pytest.mark.slow
def test_pipeline_seed_reaches_the_trained_weights(dataset: Path, tmp_path: Path) -> None:
    first = train_weights(dataset, tmp_path / "a", seed=1)
    again = train_weights(dataset, tmp_path / "b", seed=1)
    other = train_weights(dataset, tmp_path / "c", seed=2)

    assert same(first, again), "the same seed trained different weights"
    assert not same(first, other), "seeds 1 and 2 trained the same weights: seed is ignored"


WEIGHT_DECAY = {
    "name": "optim.weight_decay",
    "parameterType": "double",
    "feasibleSpace": {"min": "0.0", "max": "0.1"},
}


def test_tune_trials_start_from_the_users_settings(dataset: Path, tmp_path: Path) -> None:
    from components.tune import tune as tune_component

    space = {
        "parameters": [WEIGHT_DECAY],
        "objective": {"type": "minimize", "objectiveMetricName": "val_loss"},
        "algorithm": {"algorithmName": "random"},
        "maxTrialCount": 2,
        "parallelTrialCount": 1,
        "maxFailedTrialCount": 1,
    }
    work = tmp_path / "work"
    tune_component.python_func(
        dataset=dsl.Dataset(uri=str(dataset)),
        best_params=dsl.Artifact(uri=str(tmp_path / "best.json")),
        metrics=dsl.Metrics(uri=str(tmp_path / "metrics")),
        report=dsl.HTML(uri=str(tmp_path / "report.html")),
        space_json=json.dumps(space),
        trial_epochs=1,
        learning_rate=0.0123,
        batch_size=50,
        gpus_per_node=0,
        seed=7,
        hyperparams_json=json.dumps({**TINY, "optim.warmup_steps": 3}),
        train_config_json=json.dumps({"checkpoint_every_steps": 11, "nnodes": 2}),
        work_uri=str(work),
    )

    trials = sorted((work / "trials").glob("*/worker-config.json"))
    assert len(trials) == 2
    decays = set()
    for path in trials:
        cfg = json.loads(path.read_text())
        assert cfg["optim"]["lr"] == 0.0123  # learning_rate
        assert cfg["optim"]["warmup_steps"] == 3  # hyperparams_json
        assert cfg["model"]["hidden_dim"] == 8  # hyperparams_json
        assert cfg["checkpoint"]["every_steps"] == 11  # train_config_json
        assert cfg["train"]["seed"] == 7  # seed
        assert (cfg["train"]["epochs"], cfg["train"]["global_batch_size"]) == (1, 50)
        decays.add(cfg["optim"]["weight_decay"])  # the one searched field
    assert len(decays) == 2


@pytest.mark.parametrize(
    ("layers", "lr"),
    [
        ({}, 0.003),  # the pipeline's learning_rate default
        ({"train_config_json": '{"optim": {"lr": 0.2}}'}, 0.2),
        ({"train_config_json": '{"optim.lr": 0.2}', "hyperparams_json": '{"optim.lr": 0.3}'}, 0.3),
        (
            {"hyperparams_json": {"optim.lr": 0.3}, "tuned_hyperparams_json": '{"optim.lr": 0.4}'},
            0.4,
        ),
    ],
    ids=["parameter", "train-config", "hyperparams-over-config", "tuned-last"],
)
def test_overrides_apply_in_order(layers: dict[str, Any], lr: float) -> None:
    cfg = from_dict(TrainStepConfig, train_settings(layers))
    assert cfg.optim.lr == lr


@pytest.mark.parametrize(
    ("gpus", "nproc", "image"), [(0, 1, CPU_IMAGE), (1, 1, CUDA_IMAGE), (8, 8, CUDA_IMAGE)]
)
def test_processes_and_image_follow_the_gpus(gpus: int, nproc: int, image: str) -> None:
    settings = train_settings({"launcher": "pytorchjob", "gpus_per_node": gpus})
    cfg = from_dict(TrainStepConfig, settings)
    run = cfg.training_run(job_name="j", config_uri="s3://b/c.json")
    assert (run.gpus_per_node, run.procs_per_node, cfg.cluster.image) == (gpus, nproc, image)


def test_json_parameter_that_is_not_an_object_is_named() -> None:
    with pytest.raises(InputError) as info:
        train_settings({"hyperparams_json": "[1]"})
    assert (info.value.code, info.value.where) == ("E_CONFIG", "hyperparams_json")
