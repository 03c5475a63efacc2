"""The committed component.yaml files work as a user would use them: loaded into a new pipeline."""

# No `from __future__ import annotations`: KFP reads the pipeline function's annotations as types.

from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import compiler, components, dsl
from kfp.dsl.types.type_utils import InconsistentTypeException

from trainer.base.version import __version__

REPO = Path(__file__).resolve().parents[2]
NAMES = ("preprocess", "tune", "train", "evaluate", "register", "notify")
STEP_COMPONENTS = ("preprocess", "tune", "train", "evaluate", "register")
"""Components whose body runs a ``trainer.steps`` function (notify only prints the status)."""


def _path(name: str) -> Path:
    return REPO / "components" / name / "component.yaml"


@pytest.fixture(scope="module")
def loaded() -> dict[str, Any]:
    return {name: components.load_component_from_file(str(_path(name))) for name in NAMES}


def _artifact(kind: str) -> str:
    return f"system.{kind}@0.0.1"


@pytest.mark.parametrize(
    ("name", "inputs", "outputs"),
    [
        (
            "preprocess",
            {
                "data_uri": "String",
                "target": "String",
                "task": "String",
                "seed": "Integer",
                "column_roles_json": "String",
                "csv_delimiter": "String",
                "csv_header": "Boolean",
                "csv_encoding": "String",
                "csv_null_values": "String",
                "config_json": "String",
            },
            {
                "dataset": _artifact("Dataset"),
                "stats": _artifact("Metrics"),
                "data_hash": "String",
                "task": "String",
            },
        ),
        (
            "train",
            {
                "dataset": _artifact("Dataset"),
                "epochs": "Integer",
                "gpus_per_node": "Integer",
                "nnodes": "Integer",
                "launcher": "String",
                "gpu_type": "String",
                "gpu_node_selector": "Dict",
                "object_store_secret": "String",
                "cuda_image": "String",
                "cpu_image": "String",
            },
            {"model": _artifact("Model"), "metrics": _artifact("Metrics")},
        ),
        (
            "evaluate",
            {"model": _artifact("Model"), "dataset": _artifact("Dataset")},
            {
                "metrics": _artifact("Metrics"),
                "baselines": _artifact("Metrics"),
                "classification": _artifact("ClassificationMetrics"),
                "report": _artifact("HTML"),
                "Output": "Boolean",
            },
        ),
        (
            "register",
            {
                "model": _artifact("Model"),
                "metrics": _artifact("Metrics"),
                "baselines": _artifact("Metrics"),  # optional: a user's pipeline may leave it
                "evaluation": _artifact("HTML"),
                "data_hash": "String",
                "gate_passed": "Boolean",
            },
            {"version": "String", "model_uri": "String", "champion": "Boolean"},
        ),
        ("notify", {"status": "PipelineTaskFinalStatus"}, {}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_loaded_component_keeps_its_interface(
    loaded: dict[str, Any], name: str, inputs: dict[str, str], outputs: dict[str, str]
) -> None:
    spec = loaded[name].component_spec
    assert spec.name == name
    got_inputs = {k: v.type for k, v in spec.inputs.items()}
    got_outputs = {k: v.type for k, v in (spec.outputs or {}).items()}
    assert {k: got_inputs.get(k) for k in inputs} == inputs
    assert got_outputs == outputs


@pytest.mark.parametrize(
    ("name", "image"),
    [
        ("preprocess", "trainer-cpu"),
        ("train", "trainer-cuda"),
        ("evaluate", "trainer-cpu"),
        ("register", "trainer-cpu"),
        ("notify", "trainer-cpu"),
    ],
    ids=str,
)
def test_loaded_component_keeps_its_image(loaded: dict[str, Any], name: str, image: str) -> None:
    ref = loaded[name].component_spec.implementation.container.image
    assert ref.endswith(f"/{image}:{__version__}"), ref


def _container_text(name: str) -> str:
    doc = yaml.safe_load(_path(name).read_text())
    (executor,) = doc["deploymentSpec"]["executors"].values()
    container = executor["container"]
    return "\n".join([*container["command"], *container.get("args", [])])


@pytest.mark.parametrize("name", NAMES, ids=str)
def test_component_installs_nothing_at_run_time(name: str) -> None:
    text = _container_text(name)
    for needle in ("pip install", "pip3 install", "uv pip", "packages_to_install", "PIP_"):
        assert needle not in text, f"{name} installs packages when it starts ({needle!r})"


@pytest.mark.parametrize("name", STEP_COMPONENTS, ids=str)
def test_component_is_a_thin_adapter_to_trainer_steps(name: str) -> None:
    text = _container_text(name)
    assert f"from trainer.steps.{name} import" in text
    assert "from trainer.entry import run_guarded" in text
    for heavy in ("import torch", "import sklearn", "import mlflow", "torch.nn"):
        assert heavy not in text, f"{name} does work itself ({heavy!r}) instead of trainer.steps"


def _user_pipeline(c: dict[str, Any]) -> Any:
    @dsl.pipeline(name="my-churn-pipeline")
    def my_pipeline(data_uri: str, target: str = "churned", epochs: int = 2) -> None:
        done = c["notify"](pipeline_name="my-churn-pipeline")
        with dsl.ExitHandler(done):
            prep = c["preprocess"](data_uri=data_uri, target=target)
            tr = c["train"](dataset=prep.outputs["dataset"], epochs=epochs)
            ev = c["evaluate"](model=tr.outputs["model"], dataset=prep.outputs["dataset"])
            with dsl.If(ev.outputs["Output"] == True):  # noqa: E712
                c["register"](
                    model=tr.outputs["model"],
                    metrics=ev.outputs["metrics"],
                    evaluation=ev.outputs["report"],
                    data_hash=prep.outputs["data_hash"],
                    gate_passed=True,
                    pipeline_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                )

    return my_pipeline


def _task(spec: dict[str, Any], name: str) -> dict[str, Any]:
    dags = [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]
    (task,) = [d["tasks"][name] for d in dags if name in d["tasks"]]
    return task


def test_user_pipeline_from_component_yaml_compiles(loaded: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "my-pipeline.yaml"
    compiler.Compiler().compile(_user_pipeline(loaded), str(out))
    spec = yaml.safe_load(out.read_text())

    executors = spec["deploymentSpec"]["executors"]
    images = {
        label.removeprefix("exec-"): e["container"]["image"] for label, e in executors.items()
    }
    used = set(NAMES) - {"tune"}  # the user pipeline below chains every step but tune
    assert set(images) == used
    assert images == {n: loaded[n].component_spec.implementation.container.image for n in used}

    train_in = _task(spec, "train")["inputs"]["artifacts"]["dataset"]["taskOutputArtifact"]
    assert train_in == {"producerTask": "preprocess", "outputArtifactKey": "dataset"}
    eval_in = _task(spec, "evaluate")["inputs"]["artifacts"]["model"]["taskOutputArtifact"]
    assert eval_in == {"producerTask": "train", "outputArtifactKey": "model"}
    notify = _task(spec, "notify")
    assert "taskFinalStatus" in notify["inputs"]["parameters"]["status"]


@pytest.mark.parametrize(
    ("wire", "message"),
    [
        (lambda c, prep, tr: c["train"](dataset=tr.outputs["model"]), "system.Model"),
        (
            lambda c, prep, tr: c["evaluate"](
                model=prep.outputs["dataset"], dataset=prep.outputs["dataset"]
            ),
            "system.Dataset",
        ),
    ],
    ids=["model-into-dataset", "dataset-into-model"],
)
def test_user_pipeline_with_mismatched_artifacts_fails_to_build(
    loaded: dict[str, Any], wire: Any, message: str
) -> None:
    with pytest.raises(InconsistentTypeException, match=message):

        @dsl.pipeline(name="miswired")
        def miswired(data_uri: str) -> None:
            prep = loaded["preprocess"](data_uri=data_uri, target="churned")
            tr = loaded["train"](dataset=prep.outputs["dataset"])
            wire(loaded, prep, tr)
