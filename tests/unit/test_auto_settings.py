"""Settings from the data: batch, epochs, warmup and early stopping fit the table; the user wins."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.params import train_settings
from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.config import EarlyStoppingConfig, OptimConfig, TrainConfig
from trainer.steps.train import TrainStepConfig
from trainer.steps.train import auto_settings as auto
from trainer.steps.train.auto_settings import AutoSettingsConfig, choose_settings

MLP_PARAMS = 19_000  # the default MLP on a table of ~20 features


def choose(n_train: int, *, n_val: int | None = None, world_size: int = 1, **kw: Any):
    train = kw.pop("train", TrainConfig())
    optim = kw.pop("optim", OptimConfig())
    return choose_settings(
        train,
        optim,
        n_train=n_train,
        n_val=n_train // 5 if n_val is None else n_val,
        n_params=kw.pop("n_params", MLP_PARAMS),
        world_size=world_size,
        **kw,
    )


@pytest.mark.parametrize("rows", [8, 105, 124, 398, 7_000, 70_000], ids=lambda r: f"{r}-rows")
def test_a_small_table_gets_full_batches_and_enough_steps(rows: int) -> None:
    s = choose(rows)
    batch, epochs = s.train.global_batch_size, s.train.epochs
    steps = epochs * (rows // batch)
    assert batch <= rows  # no "fewer samples than one global batch"
    assert batch & (batch - 1) == 0  # a power of two
    assert rows // batch >= min(auto.BATCHES_PER_EPOCH // 2, rows // auto.MIN_BATCH, rows)
    assert steps >= min(auto.MIN_STEPS, auto.MAX_EPOCHS * (rows // batch))
    assert s.optim.warmup_steps == round(auto.WARMUP_FRACTION * steps)
    assert s.train.early_stopping == EarlyStoppingConfig(
        metric="val_loss", mode="min", patience=s.chosen["train.early_stopping"]["patience"]
    )
    assert set(s.chosen) >= {"train.global_batch_size", "train.epochs", "optim.warmup_steps"}
    assert s.user_set == {}


def test_the_150_row_table_trains_hundreds_of_steps_in_small_batches() -> None:
    s = choose(105)  # iris: 150 rows, 70% for training
    assert s.train.global_batch_size == auto.MIN_BATCH
    assert s.train.epochs * (105 // auto.MIN_BATCH) >= 500
    assert s.train.eval_every_steps is None  # evaluate once an epoch: epochs are short


def test_ten_million_rows_get_large_batches_few_epochs_and_regular_evaluations() -> None:
    s = choose(10_000_000)
    assert s.train.global_batch_size == auto.MAX_BATCH
    assert s.train.epochs == auto.MIN_EPOCHS
    total = s.train.epochs * (10_000_000 // auto.MAX_BATCH)
    # an epoch is 9,765 steps: evaluating only at epoch ends would give early stopping 3 looks
    assert s.train.eval_every_steps == total // auto.EVALS_PER_RUN
    assert s.optim.warmup_steps == auto.MAX_WARMUP
    assert s.inputs == {"train_rows": 10_000_000, "val_rows": 2_000_000, "parameters": 19_000,
                        "processes": 1}  # fmt: skip


def test_a_large_model_on_a_large_table_gets_fewer_epochs() -> None:
    small = choose(10_000_000, n_params=MLP_PARAMS)
    big = choose(10_000_000, n_params=1_000_000)
    assert big.train.epochs < small.train.epochs
    assert big.train.epochs >= 1


def test_no_validation_rows_means_no_early_stopping() -> None:
    assert choose(1000, n_val=0).train.early_stopping is None


@pytest.mark.parametrize("world_size", [2, 3, 8])
def test_the_chosen_batch_divides_by_the_processes(world_size: int) -> None:
    assert choose(5_000, world_size=world_size).train.global_batch_size % world_size == 0


def test_what_the_user_sets_wins_even_at_the_default_value() -> None:
    train = TrainConfig(epochs=10, global_batch_size=100, early_stopping=None)
    fixed = ["train.epochs", "train.early_stopping"]
    s = choose(124, train=train, optim=OptimConfig(warmup_steps=7), fixed=fixed)
    assert s.train.epochs == 10  # the default value, but listed as set: kept
    assert s.train.global_batch_size == 100  # differs from the default: kept
    assert s.train.early_stopping is None  # switched off by the user: stays off
    assert s.optim.warmup_steps == 7
    assert set(s.user_set) == {
        "train.epochs",
        "train.global_batch_size",
        "train.early_stopping",
        "optim.warmup_steps",
    }
    assert "train.epochs" not in s.chosen


def test_switched_off_keeps_the_config_as_it_is(tmp_path) -> None:
    cfg = from_dict(TrainStepConfig, {"auto": {"enabled": False}})
    assert cfg.auto.enabled is False
    assert cfg.train.global_batch_size == TrainConfig().global_batch_size


@pytest.mark.parametrize(
    ("kwargs", "fixed"),
    [
        ({}, []),
        ({"epochs": 10}, ["train.epochs"]),
        ({"batch_size": 64, "epochs": 3}, ["train.epochs", "train.global_batch_size"]),
        ({"hyperparams_json": {"train.early_stopping": None}}, ["train.early_stopping"]),
        ({"train_config_json": {"optim": {"warmup_steps": 0}}}, ["optim.warmup_steps"]),
        ({"hyperparams_json": {"optim.lr": 0.01}}, []),
    ],
    ids=["nothing", "epochs", "batch-and-epochs", "early-stopping-off", "warmup", "lr-only"],
)
def test_step_settings_record_what_the_user_set(kwargs: dict[str, Any], fixed: list[str]) -> None:
    settings = train_settings(kwargs)
    cfg = from_dict(TrainStepConfig, settings)
    assert cfg.auto.fixed == fixed


def test_an_unknown_fixed_field_is_refused_naming_it() -> None:
    with pytest.raises(InputError, match=r"auto.fixed may only list .*got 'optim.lr'"):
        AutoSettingsConfig(fixed=["optim.lr"])


def test_summary_names_the_choices_and_the_rows() -> None:
    line = choose(124, fixed=["train.epochs"]).summary()
    assert line.startswith("settings from the data (124 training rows): ")
    assert "train.global_batch_size=16" in line
    assert "set by the user: train.epochs=10" in line


def test_a_tune_trials_searched_value_wins_even_at_the_default(tmp_path) -> None:
    from tests.helpers import tune_config, write_dataset
    from trainer.steps.tune import trial_worker_config

    data = write_dataset(tmp_path / "ds", rows=600)
    cfg = tune_config(train={}, trial_epochs=None)
    default_batch = TrainConfig().global_batch_size
    searched, _ = trial_worker_config(
        cfg, {"train.global_batch_size": default_batch}, dataset_uri=str(data),
        trial_uri=str(tmp_path / "t"),
    )  # fmt: skip
    plain, _ = trial_worker_config(cfg, {}, dataset_uri=str(data), trial_uri=str(tmp_path / "u"))
    assert searched.train.global_batch_size == default_batch
    assert plain.train.global_batch_size == auto.auto_batch(600, 1) == 32
    assert plain.train.early_stopping is not None  # trials stop early like the training does


@pytest.mark.parametrize("min_steps", [1000, 6000], ids=["1000-steps", "6000-steps"])
def test_min_steps_sets_how_long_a_small_table_trains(min_steps: int) -> None:
    s = choose(6_131, min_steps=min_steps)  # sf_temps: 256 rows a batch, 23 steps an epoch
    assert s.train.global_batch_size == 256
    assert min_steps <= s.train.epochs * (6_131 // 256) < min_steps + 6_131 // 256


def test_min_steps_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"auto\.min_steps must be > 0, got 0"):
        AutoSettingsConfig(min_steps=0)
