"""The cluster job's settings as pipeline parameters: each one from ``--param`` through the train
step's mapping to the PyTorchJob and the TrainJob it makes (``gpupipe render``, the same path as
the train component), and each bad value refused before any step, naming the parameter."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from pipelines.params import check_parameters, typed_parameters
from pipelines.render import render_experiment, render_pytorchjob, render_trainjob
from tests.helpers import assert_valid_job, assert_valid_trainjob, needs_crd, needs_trainjob_crd
from trainer.base.errors import InputError

KUEUE = {"kueue.x-k8s.io/queue-name": "gpu-team"}
NO_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}
NCCL = {"NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO"}
ALL = {
    "nodes": 2,
    "gpus_per_node": 8,
    "image_pull_secrets": ["regcred", "mirror-creds"],
    "job_labels": KUEUE,
    "job_annotations": NO_DISRUPT,
    "job_env": NCCL,
}


def pytorchjob(**params: Any) -> dict[str, Any]:
    return dict(yaml.safe_load(render_pytorchjob(params)))


def trainjob(**params: Any) -> dict[str, Any]:
    return dict(yaml.safe_load(render_trainjob(params)))


def pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates: every PyTorchJob replica's, or the TrainJob's runtime patch."""
    if job["kind"] == "PyTorchJob":
        return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return [node["template"]["spec"]["template"]]


def envs(job: dict[str, Any]) -> list[dict[str, Any]]:
    if job["kind"] == "PyTorchJob":
        containers = [c for t in pods(job) for c in t["spec"]["containers"]]
    else:
        containers = [job["spec"]["trainer"]]
    return [{e["name"]: e.get("value") for e in c["env"]} for c in containers]


@pytest.fixture(params=["pytorchjob", "trainjob"])
def render(request: pytest.FixtureRequest) -> Any:
    return pytorchjob if request.param == "pytorchjob" else trainjob


def test_the_defaults_add_nothing(render: Any) -> None:
    job = render()
    assert "annotations" not in job["metadata"]
    assert set(job["metadata"]["labels"]) == {"app.kubernetes.io/name", "gpupipe.dev/job"}
    for pod in pods(job):
        assert "imagePullSecrets" not in pod["spec"]
    if job["kind"] == "PyTorchJob":
        assert "schedulingPolicy" not in job["spec"]["runPolicy"]


def test_image_pull_secrets_reach_every_pod(render: Any) -> None:
    for pod in pods(render(**ALL)):
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-creds"}]


def test_job_labels_reach_the_job_and_its_pods(render: Any) -> None:
    job = render(**ALL)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    for pod in pods(job):
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"


def test_job_annotations_reach_the_job_and_its_pods(render: Any) -> None:
    job = render(**ALL)
    assert job["metadata"]["annotations"] == NO_DISRUPT
    for pod in pods(job):
        assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
        assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"


def test_job_env_reaches_every_training_container(render: Any) -> None:
    for env in envs(render(**ALL)):
        assert {k: env[k] for k in NCCL} == NCCL
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"


def test_gang_scheduling_is_kueues_queue_on_the_job() -> None:
    job = pytorchjob(nodes=4, gang_queue="gpu-team", gang_priority_class="high-priority")
    assert "schedulingPolicy" not in job["spec"]["runPolicy"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high-priority"


def test_katib_trials_get_the_same_job_settings() -> None:
    experiment = yaml.safe_load(render_experiment({**ALL, "gang_queue": "gpu-team"}))
    trial = experiment["spec"]["trialTemplate"]["trialSpec"]
    assert trial["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    assert "schedulingPolicy" not in trial["spec"]["runPolicy"]
    assert pods(trial)[0]["spec"]["imagePullSecrets"][0] == {"name": "regcred"}


@needs_crd
def test_a_pytorchjob_with_every_setting_is_valid() -> None:
    assert_valid_job(pytorchjob(**ALL, gang_queue="gpu-team", gang_priority_class="high"))


@needs_trainjob_crd
def test_a_trainjob_with_every_setting_is_valid() -> None:
    assert_valid_trainjob(trainjob(**ALL))


def test_the_parameters_parse_from_the_command_line() -> None:
    pairs = [
        'image_pull_secrets=["regcred"]',
        'job_labels={"kueue.x-k8s.io/queue-name": "gpu-team"}',
        "gang_queue=research",
    ]
    assert typed_parameters(pairs, require=False) == {
        "image_pull_secrets": ["regcred"],
        "job_labels": KUEUE,
        "gang_queue": "research",
    }


BAD = {
    "pull-secret-name": ({"image_pull_secrets": ["Reg_Cred"]}, "image_pull_secrets"),
    "pull-secrets-not-a-list": ({"image_pull_secrets": '"regcred"'}, "image_pull_secrets"),
    "label-key": ({"job_labels": {"bad key": "x"}}, "job_labels"),
    "label-value": ({"job_labels": {"team": "a b"}}, "job_labels"),
    "label-gpupipe-owns": ({"job_labels": {"gpupipe.dev/job": "x"}}, "job_labels"),
    "label-not-a-string": ({"job_labels": {"team": 7}}, "job_labels"),
    "annotation-key": ({"job_annotations": {"bad key": "x"}}, "job_annotations"),
    "annotation-not-a-string": ({"job_annotations": {"a": True}}, "job_annotations"),
    "env-name": ({"job_env": {"1BAD": "x"}}, "job_env"),
    "env-reserved": ({"job_env": {"MASTER_ADDR": "x"}}, "job_env"),
    "env-object-store": ({"job_env": {"AWS_ACCESS_KEY_ID": "x"}}, "job_env"),
    "env-not-a-string": ({"job_env": {"NCCL_IB_DISABLE": 1}}, "job_env"),
    "gang-queue-blank": ({"gang_queue": " "}, "gang_queue"),
    "gang-priority-class": ({"gang_priority_class": "High!"}, "gang_priority_class"),
    "gang-queue-not-a-name": ({"gang_queue": "Team A"}, "gang_queue"),
    "gang-queue-and-its-label-differ": (
        {"gang_queue": "q", "job_labels": {"kueue.x-k8s.io/queue-name": "other"}},
        "gang_queue",
    ),
}


@pytest.mark.parametrize(
    "launcher", ["local", "pytorchjob"], ids=["launcher-local", "launcher-pytorchjob"]
)
@pytest.mark.parametrize(("given", "param"), list(BAD.values()), ids=list(BAD))
def test_a_bad_value_fails_before_any_step_naming_the_parameter(
    given: dict[str, Any], param: str, launcher: str
) -> None:
    with pytest.raises(InputError) as info:
        check_parameters({"data_uri": "d.parquet", "launcher": launcher, **given})
    assert (info.value.code, info.value.where) == ("E_PARAM", param)
    assert param in str(info.value) and "\n" not in str(info.value)
