"""``gpupipe render pytorchjob``: a complete, valid PyTorchJob that reflects the pipeline params."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from components.images import CPU_IMAGE, CUDA_IMAGE
from pipelines.params import pipeline_parameters
from pipelines.render import render_pytorchjob
from tests.helpers import assert_valid_job, needs_crd
from trainer.base.errors import InputError


def render(**params: Any) -> dict[str, Any]:
    docs = list(yaml.safe_load_all(render_pytorchjob(params)))
    assert len(docs) == 1, "kubectl apply -f - expects one object here"
    return docs[0]


def pod(job: dict[str, Any], rtype: str = "Master") -> dict[str, Any]:
    return job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]


def env_of(job: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod(job)["containers"][0]["env"]}


SELECTOR = {"nvidia.com/gpu.product": "NVIDIA-H200"}
PARAMS = {
    "defaults": {},
    "2x8-h200": {"nodes": 2, "gpus_per_node": 8, "gpu_node_selector": SELECTOR},
    "cpu-cluster": {"gpus_per_node": 0, "nodes": 2},
    "selector-as-json": {"gpu_node_selector": '{"pool": "a100"}'},
    "overrides": {"train_config_json": '{"timeout_s": 3600}', "object_store_secret": "s3-creds"},
}


@needs_crd
@pytest.mark.parametrize("params", list(PARAMS.values()), ids=list(PARAMS))
def test_rendered_job_is_complete_and_valid(params: dict[str, Any]) -> None:
    job = render(**params)
    assert_valid_job(job)
    assert job["metadata"]["name"] and job["metadata"]["namespace"]


def test_defaults_match_the_pipelines_defaults() -> None:
    job = render()
    defaults = pipeline_parameters()
    assert "Worker" not in job["spec"]["pytorchReplicaSpecs"]  # nodes=1
    assert job["spec"]["nprocPerNode"] == str(defaults["gpus_per_node"])
    limits = pod(job)["containers"][0]["resources"]["limits"]
    assert limits[defaults["gpu_type"]] == str(defaults["gpus_per_node"])
    assert "nodeSelector" not in pod(job)
    secret = env_of(job)["AWS_ACCESS_KEY_ID"]["secretKeyRef"]["name"]
    assert secret == defaults["object_store_secret"]
    assert pod(job)["containers"][0]["image"] == CUDA_IMAGE


def test_params_show_up_in_the_job() -> None:
    job = render(nodes=2, gpus_per_node=8, gpu_node_selector=SELECTOR)
    assert job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 1
    assert job["spec"]["nprocPerNode"] == "8"
    for rtype in ("Master", "Worker"):
        p = pod(job, rtype)
        assert p["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert p["nodeSelector"] == SELECTOR
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in p[
            "tolerations"
        ]
        (dshm,) = [v for v in p["volumes"] if v["name"] == "dshm"]
        assert dshm["emptyDir"]["medium"] == "Memory"


def test_gpu_type_and_secret_and_timeout() -> None:
    job = render(
        gpu_type="amd.com/gpu",
        object_store_secret="s3-creds",
        train_config_json='{"timeout_s": 3600}',
    )
    assert "amd.com/gpu" in pod(job)["containers"][0]["resources"]["limits"]
    assert env_of(job)["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["name"] == "s3-creds"
    assert job["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600


def test_a_cpu_cluster_gets_the_cpu_image_and_no_gpus() -> None:
    job = render(gpus_per_node=0, nodes=2)
    p = pod(job, "Worker")
    assert p["containers"][0]["image"] == CPU_IMAGE
    assert "nvidia.com/gpu" not in p["containers"][0]["resources"]["limits"]
    assert "tolerations" not in p
    assert job["spec"]["nprocPerNode"] == "1"


def test_unknown_param_lists_the_valid_ones() -> None:
    with pytest.raises(InputError) as info:
        render_pytorchjob({"gpus": 8})
    message = str(info.value)
    assert "gpus" in message
    assert "gpus_per_node" in message and "nodes" in message


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"nodes": "two"}, "nodes"),
        ({"gpu_node_selector": "[1, 2]"}, "gpu_node_selector"),
        ({"gpus_per_node": 8, "train_config_json": '{"nproc_per_node": 4}'}, "train_config_json"),
        ({"gpu_node_selector": {"bad key": "x"}}, "gpu_node_selector"),
    ],
    ids=["nodes-not-int", "selector-not-mapping", "procs-are-the-gpus", "selector-key"],
)
def test_bad_values_fail_naming_the_param(params: dict[str, Any], where: str) -> None:
    with pytest.raises(InputError) as info:
        render_pytorchjob(params)
    assert info.value.where == where
