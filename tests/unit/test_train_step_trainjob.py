"""``launcher=trainjob`` through the one mapping: step settings, the launcher the step picks,
``gpupipe render trainjob`` (valid against the upstream CRD), the PyTorchJob's job spec."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.images import CPU_IMAGE, CUDA_IMAGE
from pipelines.params import check_parameters, train_settings
from pipelines.render import render_pytorchjob, render_trainjob
from tests.helpers import assert_valid_trainjob as assert_valid
from tests.helpers import needs_trainjob_crd as needs_crd
from trainer.base.errors import InputError
from trainer.base.typedconfig import from_dict
from trainer.launch.trainjob import TrainJobLauncher
from trainer.steps.train import TrainStepConfig
from trainer.steps.train.step import make_launcher

ROOT = Path(__file__).resolve().parents[2]
SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H200"}
PARAMS = {
    "defaults": {},
    "2x8-h200": {"nodes": 2, "gpus_per_node": 8, "gpu_node_selector": SELECTOR},
    "cpu-cluster": {"gpus_per_node": 0, "nodes": 2},
    "namespaced-runtime": {"trainer_runtime": "TrainingRuntime/torch-h200"},
    "no-patches": {"train_config_json": '{"cluster.runtime_patches": false}'},
    "deadline": {"train_config_json": '{"timeout_s": 3600}', "object_store_secret": "s3-creds"},
}


def render(**params: Any) -> dict[str, Any]:
    (doc,) = yaml.safe_load_all(render_trainjob(params))
    return dict(doc)


@needs_crd
@pytest.mark.parametrize("params", list(PARAMS.values()), ids=list(PARAMS))
def test_rendered_trainjob_is_complete_and_valid(params: dict[str, Any]) -> None:
    assert_valid(render(**params))


def test_the_trainjob_and_the_pytorchjob_carry_one_job_spec() -> None:
    params = {"nodes": 2, "gpus_per_node": 8, "train_config_json": '{"timeout_s": 3600}'}
    tj = render(**params)
    (pj,) = yaml.safe_load_all(render_pytorchjob(params))
    (master,) = pj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    trainer = tj["spec"]["trainer"]
    assert tj["metadata"]["name"] == pj["metadata"]["name"]
    assert (trainer["image"], trainer["command"]) == (master["image"], master["command"])
    assert trainer["env"] == master["env"]
    assert trainer["resourcesPerNode"] == master["resources"]
    assert trainer["numNodes"] == 2 and str(trainer["numProcPerNode"]) == pj["spec"]["nprocPerNode"]
    assert tj["spec"]["activeDeadlineSeconds"] == pj["spec"]["runPolicy"]["activeDeadlineSeconds"]
    assert trainer["image"] == CUDA_IMAGE
    assert render(gpus_per_node=0)["spec"]["trainer"]["image"] == CPU_IMAGE


def test_runtime_patches_can_be_left_to_the_runtime() -> None:
    assert render()["spec"]["runtimePatches"][0]["manager"] == "gpupipe.dev/launcher"
    assert "runtimePatches" not in render(**PARAMS["no-patches"])["spec"]


def test_the_runtime_parameter_selects_the_runtime() -> None:
    assert render()["spec"]["runtimeRef"]["name"] == "torch-distributed"
    ref = render(trainer_runtime="TrainingRuntime/torch-h200")["spec"]["runtimeRef"]
    assert (ref["kind"], ref["name"]) == ("TrainingRuntime", "torch-h200")


def test_a_bad_runtime_is_a_parameter_error() -> None:
    with pytest.raises(InputError) as info:
        check_parameters({"data_uri": "x", "launcher": "trainjob", "trainer_runtime": "Job/x"})
    assert (info.value.code, info.value.where) == ("E_PARAM", "trainer_runtime")


def test_launcher_trainjob_is_a_valid_pipeline_parameter() -> None:
    check_parameters({"data_uri": "x", "launcher": "trainjob"})
    with pytest.raises(InputError, match="local, pytorchjob, trainjob"):
        check_parameters({"data_uri": "x", "launcher": "jobset"})


def test_the_step_makes_a_trainjob_launcher_in_the_pods_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "team-a")
    settings = train_settings({"launcher": "trainjob", "trainer_runtime": "torch-x"})
    cfg = from_dict(TrainStepConfig, settings)
    assert cfg.cluster.runtime == "torch-x"

    launcher = make_launcher(cfg)

    assert isinstance(launcher, TrainJobLauncher)
    assert (launcher.namespace, launcher.cluster.runtime) == ("team-a", "torch-x")


def test_a_trainjob_step_needs_an_image() -> None:
    with pytest.raises(InputError, match="launcher 'trainjob'"):
        from_dict(TrainStepConfig, {"launcher": "trainjob"})


def test_gpupipe_render_trainjob_prints_the_job() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "render", "trainjob", "--param", "nodes=2"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    job = yaml.safe_load(out.stdout)
    assert (job["kind"], job["spec"]["trainer"]["numNodes"]) == ("TrainJob", 2)
