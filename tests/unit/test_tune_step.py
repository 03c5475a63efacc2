"""The tune step and component: best parameters, metrics and a report with pictures."""

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("optuna")

from tests.helpers import LR, tune_config, write_dataset
from trainer.base.errors import InputError
from trainer.steps.tune import tune


def test_tune_step_writes_best_params_metrics_and_report(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data")
    out = tmp_path / "out"
    result = tune(
        tune_config(),
        dataset_uri=str(data),
        work_uri=str(out / "work"),
        output_uri=str(out / "best.json"),
        report_uri=str(out / "report.html"),
        metrics_uri=str(out / "metrics.json"),
    )
    best = json.loads((out / "best.json").read_text())
    assert set(best) == {"optim.lr"} and best == result.best_params
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["best_val_loss"] == pytest.approx(result.best_value)
    total = metrics["trials_completed"] + metrics["trials_pruned"] + metrics["trials_failed"]
    assert total == 5
    html = (out / "report.html").read_text()
    assert len(re.findall(r'<img src="data:image/png;base64,[A-Za-z0-9+/=]+"', html)) == 2
    assert "Optimisation history" in html and "Parameter importances" in html
    assert "<script" not in html and "http" not in html.split("<body>")[1].split("work area")[0]
    # The trials ran the train step's worker config: schema columns, trial epochs.
    cfg = json.loads((out / "work" / "trials" / "0" / "model" / "model.json").read_text())
    assert cfg["extra"]["train"]["config"]["train"]["epochs"] == 2


def test_report_escapes_text(tmp_path: Path) -> None:
    from trainer.steps.tune import TuneStepResult, render_tune_report

    result = TuneStepResult(
        engine="local", objective_metric="val_<b>", direction="minimize",
        best_params={"model.name": "<script>x</script>"}, best_value=0.5,
        trials_completed=1, trials_pruned=0, trials_failed=0, stopped_reason="a & b",
    )  # fmt: skip
    html = render_tune_report(result, None, dataset_uri="d", work_uri="w")
    assert "<script>x" not in html and "&lt;script&gt;x" in html and "a &amp; b" in html


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"space": {**tune_config().space, "parameters": [{**LR, "name": "optim.learning_rate"}]}},
         "tune.space.parameters[0].name maps to no trainer config field"),
        ({"space": {**tune_config().space, "parameters": [{**LR, "name": "data.train_uri"}]}},
         "maps to no trainer config field"),
        ({"train": {"optim": {"lr": -1}}}, "optim.lr must be > 0"),
        ({"trial_epochs": 0}, "tune.trial_epochs must be > 0"),
    ],
    ids=["unknown-field", "not-tunable", "bad-base", "trial-epochs"],
)  # fmt: skip
def test_bad_config_fails_before_any_trial(over: dict, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        tune_config(**over)


def test_study_name_is_stable_when_trial_counts_change() -> None:
    a = tune_config()
    b = tune_config(space={**a.space, "maxTrialCount": 9})
    c = tune_config(space={**a.space, "algorithm": {"algorithmName": "random"}})
    assert a.study_name() == b.study_name() != c.study_name()


def test_katib_engine_needs_an_image(tmp_path: Path) -> None:
    data = write_dataset(tmp_path / "data", rows=40)
    with pytest.raises(InputError, match=r"tune\.train\.cluster\.image"):
        tune(
            tune_config(engine="katib"),
            dataset_uri=str(data),
            work_uri="s3://bucket/work",
            output_uri=str(tmp_path / "b.json"),
            report_uri=str(tmp_path / "r.html"),
        )


def refused_with_katib(
    tmp_path: Path, space: dict, capsys: pytest.CaptureFixture[str]
) -> list[str]:
    """``python -m trainer tune`` with engine katib and ``space``: it must exit 2 with one line
    on stderr and write nothing; returns that line (in a list)."""
    from trainer.__main__ import main

    data = write_dataset(tmp_path / "data", rows=40)
    cfg = {"engine": "katib", "space": space, "train": {"cluster": {"image": "img:1"}}}
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    argv = ["tune", "--config", str(tmp_path / "cfg.json"), "--dataset", str(data)]
    argv += ["--work", "s3://bucket/work", "--output", str(out / "b.json")]
    argv += ["--report", str(out / "r.html")]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not out.exists()  # nothing written
    return err


@pytest.mark.parametrize("algorithm", ["bayesianoptimization", "hyperband"])
def test_katib_engine_refuses_an_algorithm_no_cluster_service_serves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], algorithm: str
) -> None:
    space = {**tune_config().space, "algorithm": {"algorithmName": algorithm}}
    if algorithm == "hyperband":
        space["parameters"] = [
            *space["parameters"],
            {
                "name": "train.epochs",
                "parameterType": "int",
                "feasibleSpace": {"min": "1", "max": "9"},
            },
        ]
        space["algorithm"]["algorithmSettings"] = [
            {"name": "resource_name", "value": "train.epochs"},
            {"name": "eta", "value": "3"},
        ]
        space |= {"parallelTrialCount": 9, "maxTrialCount": 9}
    err = refused_with_katib(tmp_path, space, capsys)
    assert err[0].startswith("ERROR [tune] E_CONFIG: algorithm ")
    assert f"{algorithm!r} has no Katib suggestion service on a cluster" in err[0]
    assert "random, tpe, cmaes, grid, multivariate-tpe" in err[0]


@pytest.mark.parametrize("distribution", ["normal", "logNormal"])
def test_katib_engine_refuses_a_distribution_its_service_cannot_sample(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], distribution: str
) -> None:
    space = copy.deepcopy(tune_config().space)
    space["parameters"][-1]["feasibleSpace"]["distribution"] = distribution
    err = refused_with_katib(tmp_path, space, capsys)
    name = space["parameters"][-1]["name"]
    assert err[0].startswith(f"ERROR [tune] E_CONFIG: parameter {name!r}: distribution ")
    assert f"{distribution!r} has no sampler in Katib's suggestion service" in err[0]
    assert "use uniform or logUniform with engine 'katib'" in err[0]
    assert f"parameters[{len(space['parameters']) - 1}].feasibleSpace.distribution" in err[0]


def test_component_compiles_with_typed_outputs(tmp_path: Path) -> None:
    import yaml
    from kfp import compiler

    from components.tune import tune as component

    path = tmp_path / "tune.yaml"
    compiler.Compiler().compile(component, str(path))
    spec = yaml.safe_load(path.read_text())
    outputs = spec["root"]["outputDefinitions"]
    assert outputs["parameters"] == {
        "best_hyperparams": {"parameterType": "STRUCT"},
        "best_hyperparams_json": {"parameterType": "STRING"},
        "train_gpu_limit": {"parameterType": "STRING"},
    }
    kinds = {k: v["artifactType"]["schemaTitle"] for k, v in outputs["artifacts"].items()}
    assert kinds == {
        "best_params": "system.Artifact",
        "metrics": "system.Metrics",
        "report": "system.HTML",
    }


def test_disabled_search_writes_empty_parameters_and_says_so(tmp_path: Path) -> None:
    from trainer.steps.tune import tune_disabled

    out, report = tmp_path / "best.json", tmp_path / "report.html"
    tune_disabled(output_uri=str(out), report_uri=str(report))
    assert json.loads(out.read_text()) == {}
    assert "search disabled (tune_enabled=false)" in report.read_text()


def test_disabled_search_refuses_a_users_file(tmp_path: Path) -> None:
    from trainer.base.errors import InputError
    from trainer.steps.tune import tune_disabled

    mine = tmp_path / "notes.txt"
    mine.write_text("keep me")
    with pytest.raises(InputError, match="not written by gpupipe") as e:
        tune_disabled(output_uri=str(mine), report_uri=str(tmp_path / "report.html"))
    assert e.value.code == "E_OUTPUT"
    assert mine.read_text() == "keep me"


@pytest.mark.parametrize(("gpus", "limit"), [(0, ""), (1, "1"), (8, "8")])
def test_the_component_passes_the_train_pods_gpu_limit_on_as_text(
    tmp_path: Path, gpus: int, limit: str
) -> None:
    # KFP 2.17's driver reads an accelerator count from a channel only as a string: the train
    # step's limit is this text (empty: no GPU limit at all).
    from kfp.dsl import HTML, Artifact, Dataset, Metrics

    from components.tune import tune as component

    def art(kind: type, name: str) -> Any:
        return kind(name=name, uri=str(tmp_path / name), metadata={})

    out = component.python_func(
        dataset=art(Dataset, "dataset"),
        best_params=art(Artifact, "best"),
        metrics=art(Metrics, "metrics"),
        report=art(HTML, "report"),
        enabled=False,
        gpus_per_node=gpus,
    )
    assert out.train_gpu_limit == limit
    assert out.best_hyperparams_json == "{}"
