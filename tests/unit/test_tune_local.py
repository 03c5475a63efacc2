"""The local tune engine: Katib algorithms as Optuna samplers, real trials, pruning, resume."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

optuna = pytest.importorskip("optuna")

from tests.helpers import LR, MEDIAN, dist_session, write_dataset  # noqa: E402
from trainer.base.errors import InputError  # noqa: E402
from trainer.base.typedconfig import apply_overrides, from_dict  # noqa: E402
from trainer.config import WorkerConfig  # noqa: E402
from trainer.training.loop import train  # noqa: E402
from trainer.tune import local  # noqa: E402
from trainer.tune.local import (  # noqa: E402
    InProcessTrialRunner,
    SubprocessTrialRunner,
    TooManyFailedTrials,
    make_pruner,
    make_sampler,
    run_study,
)
from trainer.tune.space import load_space  # noqa: E402


def space(**over: Any) -> Any:
    data: dict[str, Any] = {
        "parameters": [LR],
        "objective": {"type": "minimize", "objectiveMetricName": "val_loss"},
        "algorithm": {"algorithmName": "random", "algorithmSettings": []},
        "maxTrialCount": 4,
        "parallelTrialCount": 1,
        "maxFailedTrialCount": 1,
    }
    data.update(over)
    return load_space(data)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("tune-data"))


def config_fn(data: Path, **train: Any):
    base = {
        "data": {"train_uri": str(data / "train.parquet"), "val_uri": str(data / "val.parquet")},
        # A plain MLP from random weights: lr 1e-5 learns nothing in 3 epochs, so the search
        # has something to find (the default linear start would already be good).
        "model": {"hidden_dim": 16, "linear": "none"},
        "optim": {"lr": 1e-5},
        "train": {"epochs": 3, "global_batch_size": 100, "log_every_steps": 1000, **train},
    }

    def make(number: int, assignment: dict[str, Any], trial_uri: str) -> WorkerConfig:
        over = {**assignment, "output.model_uri": f"{trial_uri}/model"}
        return from_dict(WorkerConfig, apply_overrides(base, over))

    return make


# ----------------------------------------------------------------------- samplers and pruners


CASES = [
    ("random", [LR], "RandomSampler", {}),
    ("grid", [{**LR, "feasibleSpace": {"min": "0.001", "max": "0.004", "step": "0.001"}}],
     "GridSampler", {}),
    ("tpe", [LR], "TPESampler", {}),
    ("multivariate-tpe", [LR], "TPESampler", {"_multivariate": True}),
    ("bayesianoptimization", [LR], "GPSampler", {}),
    ("hyperband", [LR, {"name": "train.epochs", "parameterType": "int",
                        "feasibleSpace": {"min": "1", "max": "9"}}], "TPESampler", {}),
]  # fmt: skip


@pytest.mark.parametrize(("algo", "params", "sampler", "attrs"), CASES, ids=[c[0] for c in CASES])
def test_algorithm_maps_to_sampler(algo: str, params: list, sampler: str, attrs: dict) -> None:
    settings = [{"name": "resource_name", "value": "train.epochs"}] if algo == "hyperband" else []
    s = space(parameters=params, algorithm={"algorithmName": algo, "algorithmSettings": settings})
    made = make_sampler(s, seed=1)
    assert type(made).__name__ == sampler
    for key, value in attrs.items():
        assert getattr(made, key) == value
    assert algo in local.SAMPLERS


@pytest.mark.parametrize(
    ("algo", "early", "pruner"),
    [("tpe", None, "NopPruner"), ("tpe", MEDIAN, "MedianPruner"),
     ("hyperband", None, "HyperbandPruner")],
    ids=["none", "medianstop", "hyperband"],
)  # fmt: skip
def test_early_stopping_maps_to_pruner(algo: str, early: Any, pruner: str) -> None:
    params = [LR]
    settings = []
    if algo == "hyperband":
        params = [LR, {"name": "train.epochs", "parameterType": "int",
                       "feasibleSpace": {"min": "1", "max": "9"}}]  # fmt: skip
        settings = [{"name": "resource_name", "value": "train.epochs"}]
    made = make_pruner(
        space(
            parameters=params,
            algorithm={"algorithmName": algo, "algorithmSettings": settings},
            earlyStopping=early,
        )
    )
    assert type(made).__name__ == pruner
    if pruner == "MedianPruner":
        assert (made._n_startup_trials, made._n_warmup_steps) == (2, 1)


CMAES_SPACE = {
    "parameters": [LR, {**LR, "name": "optim.weight_decay",
                        "feasibleSpace": {"min": "0.0", "max": "0.1"}}],
    "algorithm": {"algorithmName": "cmaes", "algorithmSettings": []},
}  # fmt: skip


def test_cmaes_maps_to_cmaes_sampler() -> None:
    assert type(make_sampler(space(**CMAES_SPACE), seed=0)).__name__ == "CmaEsSampler"


def test_cmaes_without_its_package_says_which(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cmaes", None)  # import cmaes -> ImportError
    with pytest.raises(InputError, match="needs the Python package 'cmaes'"):
        make_sampler(space(**CMAES_SPACE), seed=0)


# ----------------------------------------------------------------------------- real studies


def test_on_eval_stops_training_like_early_stopping(data: Path, tmp_path: Path) -> None:

    cfg = config_fn(data)(0, {"optim.lr": 0.01}, str(tmp_path))
    seen: list[tuple[int, dict[str, float]]] = []

    def on_eval(step: int, metrics: dict[str, float]) -> bool:
        seen.append((step, metrics))
        return True

    with dist_session() as ctx:
        result = train(cfg, ctx, on_eval=on_eval)
    assert len(seen) == 1 and "val_loss" in seen[0][1]
    assert result.stopped_early and result.epochs == 1.0


def test_study_beats_a_bad_learning_rate(data: Path, tmp_path: Path) -> None:
    make = config_fn(data)
    s = space(algorithm={"algorithmName": "tpe", "algorithmSettings": [
        {"name": "n_startup_trials", "value": "3"}]}, maxTrialCount=5)  # fmt: skip
    result = run_study(
        s, make, runner=InProcessTrialRunner(), work_uri=str(tmp_path), study_name="lr"
    )
    baseline = InProcessTrialRunner().run(
        make(0, {}, str(tmp_path / "base")),
        name="base",
        work_uri=str(tmp_path / "base"),
        nproc_per_node=1,
        on_eval=lambda step, m: False,
    )
    assert result.count("COMPLETE") == 5
    assert result.best_value is not None
    assert result.best_value < baseline.metrics["val_loss"] - 0.05
    assert result.best_params["optim.lr"] > 1e-4
    assert (tmp_path / "study.journal").is_file()
    assert (tmp_path / "trials" / "0" / "model" / "metrics.json").is_file()


def test_median_stopping_prunes_trials(data: Path, tmp_path: Path) -> None:
    s = space(earlyStopping=MEDIAN, maxTrialCount=8)
    result = run_study(
        s, config_fn(data), runner=InProcessTrialRunner(), work_uri=str(tmp_path),
        study_name="median", seed=3,
    )  # fmt: skip
    pruned = [t for t in result.trials if t.state == "PRUNED"]
    assert pruned, [(t.state, t.intermediate) for t in result.trials]
    assert all(t.epochs is not None and t.epochs < 3 for t in pruned)
    assert result.count("COMPLETE") + len(pruned) == 8


def test_retried_study_resumes_instead_of_starting_over(data: Path, tmp_path: Path) -> None:
    make, runner = config_fn(data, epochs=1), InProcessTrialRunner()
    first = run_study(space(maxTrialCount=3), make, runner=runner, work_uri=str(tmp_path),
                      study_name="resume")  # fmt: skip
    assert [t.number for t in first.trials] == [0, 1, 2]
    second = run_study(space(maxTrialCount=5), make, runner=runner, work_uri=str(tmp_path),
                       study_name="resume")  # fmt: skip
    assert [t.number for t in second.trials] == [0, 1, 2, 3, 4]
    assert [t.params for t in second.trials[:3]] == [t.params for t in first.trials]
    # The re-seeded sampler does not redraw the first attempt's points.
    assert second.trials[3].params != first.trials[0].params


def test_trial_left_running_by_a_killed_step_is_rerun_not_counted(
    data: Path, tmp_path: Path
) -> None:
    make, runner = config_fn(data, epochs=1), InProcessTrialRunner()
    run_study(space(maxTrialCount=1), make, runner=runner, work_uri=str(tmp_path),
              study_name="killed")  # fmt: skip
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    path = str(tmp_path / "study.journal")
    storage = JournalStorage(JournalFileBackend(path, JournalFileOpenLock(path + ".lock")))
    study = optuna.load_study(study_name="killed", storage=storage)
    study.enqueue_trial({"optim.lr": 0.02})
    study.ask()  # the killed attempt's trial: RUNNING forever
    result = run_study(space(maxTrialCount=2, maxFailedTrialCount=2), make, runner=runner,
                       work_uri=str(tmp_path), study_name="killed")  # fmt: skip
    states = [(t.state, t.interrupted) for t in result.trials]
    assert states == [("COMPLETE", False), ("FAIL", True), ("COMPLETE", False)]
    assert result.trials[2].params == {"optim.lr": 0.02}
    assert result.count("FAIL") == 0


def test_too_many_failed_trials_fail_the_search(data: Path, tmp_path: Path) -> None:
    bad = {"name": "model.activation", "parameterType": "categorical",
           "feasibleSpace": {"list": ["swish", "tanh"]}}  # fmt: skip
    s = space(parameters=[bad], maxTrialCount=4, maxFailedTrialCount=1)
    with pytest.raises(TooManyFailedTrials) as info:
        run_study(s, config_fn(data), runner=InProcessTrialRunner(), work_uri=str(tmp_path),
                  study_name="bad")  # fmt: skip
    text = str(info.value)
    # Katib's rule: the first failure reaches a budget of 1.
    assert "1 trials failed, reaching tune.maxFailedTrialCount=1" in text
    assert "model.activation must be one of" in text


# ----------------------------------------------------------------------- subprocess trials


@pytest.mark.integration
def test_subprocess_trial_reports_each_evaluation_and_is_pruned_by_sigterm(
    data: Path, tmp_path: Path
) -> None:
    make = config_fn(data, epochs=3)
    runner = SubprocessTrialRunner(echo=False)
    full: list[tuple[int, float]] = []
    outcome = runner.run(
        make(0, {"optim.lr": 0.01}, str(tmp_path / "a")),
        name="t-a",
        work_uri=str(tmp_path / "a"),
        nproc_per_node=1,
        on_eval=lambda step, m: full.append((step, m["val_loss"])) is not None,
    )
    assert [s for s, _ in full] == [6, 12, 18]  # 600 rows / batch 100 = 6 steps per epoch
    assert not outcome.stopped and outcome.epochs == 3.0
    assert outcome.metrics["val_loss"] == pytest.approx(full[-1][1], abs=1e-5)

    pruned = runner.run(
        make(1, {"optim.lr": 0.01, "train.epochs": 50}, str(tmp_path / "b")),
        name="t-b",
        work_uri=str(tmp_path / "b"),
        nproc_per_node=1,
        on_eval=lambda step, m: True,
    )
    assert pruned.stopped and pruned.epochs < 50
