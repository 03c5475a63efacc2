"""The TrainJob built from a JobSpec: valid against the upstream Trainer CRD (schema and CEL rules)
and the same job as the PyTorchJob. The launcher is tested with the PyTorchJob one, against a fake
Trainer and JobSet, in ``test_job_launchers.py``."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import (
    assert_valid_trainjob,
    cel_errors,
    needs_trainjob_crd,
    trainjob_schema_errors,
)
from tests.unit.specs import BASE
from tests.unit.specs import job_spec as make
from trainer.base.errors import InputError
from trainer.launch.trainjob import MANAGER, RuntimeRef, build_trainjob

# --------------------------------------------------------------------------------------------
# Jobs under test
# --------------------------------------------------------------------------------------------

GPU_TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
needs_crd = needs_trainjob_crd
schema_errors = trainjob_schema_errors
assert_valid = assert_valid_trainjob


CASES: dict[str, dict[str, Any]] = {
    "1-node-cpu": {},
    "1-node-cpu-no-patches": {"runtime_patches": False},
    "1-node-8-gpus": {"gpus_per_node": 8, "memory_limit": "256Gi"},
    "1-node-8-gpus-no-patches": {"gpus_per_node": 8, "runtime_patches": False},
    "4x8-gpus": {
        "nnodes": 4,
        "gpus_per_node": 8,
        "memory_limit": "1.5Ti",
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "image_pull_secrets": ["regcred"],
        "service_account": "trainer",
        "timeout_s": 7200,
    },
    "4x8-gpus-no-patches": {"nnodes": 4, "gpus_per_node": 8, "runtime_patches": False},
    "labels-env-secrets": {
        "labels": {"team": "vision", "kueue.x-k8s.io/queue-name": "gpu"},
        "annotations": {"a.b/c": "d"},
        "env": {"NCCL_SOCKET_IFNAME": "^lo,docker", "NCCL_DEBUG": "INFO"},
        "object_store_secret": "object-store",
    },
}


@pytest.fixture(params=list(CASES.values()), ids=list(CASES))
def trainjob(request: pytest.FixtureRequest) -> dict[str, Any]:
    return build_trainjob(make(**request.param))


def pod_patch(job: dict[str, Any]) -> dict[str, Any]:
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == MANAGER
    (rjob,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert rjob["name"] == "node"
    return dict(rjob["template"]["spec"]["template"])


@needs_crd
def test_every_generated_trainjob_validates_against_the_crd(trainjob: dict[str, Any]) -> None:
    assert_valid(trainjob)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def breakage(job: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = job
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value

    return breakage


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def breakage(job: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = job
        for key in parents:
            node = node[key]
        del node[last]

    return breakage


BREAKAGES = {
    "nproc-string": (_set("spec.trainer.numProcPerNode", "8"), "is not of type 'integer'"),
    "unknown-trainer-field": (
        _set("spec.trainer.nprocPerNode", 8),
        "'nprocPerNode' was unexpected",
    ),
    "no-runtime-ref": (_drop("spec.runtimeRef"), "'runtimeRef' is a required property"),
    "bad-quantity": (
        _set("spec.trainer.resourcesPerNode.limits.memory", "16 GB"),
        "limits/memory: '16 GB' does not match",
    ),
    "deadline-0": (_set("spec.activeDeadlineSeconds", 0), "0 is less than the minimum of 1"),
    "name-not-dns-1035": (_set("metadata.name", "1-job"), "RFC 1035 DNS label"),
    "name-too-long": (_set("metadata.name", "a" * 64), "no more than 63 characters"),
    "managed-by-other": (_set("spec.managedBy", "me"), "ManagedBy must be"),
    "patch-of-pod-resources": (
        lambda j: pod_patch(j)["spec"].__setitem__("resources", {}),
        "'resources' was unexpected",
    ),
    "patch-container-env-field-typo": (
        lambda j: pod_patch(j)["spec"]["containers"][0].__setitem__("ports", []),
        "'ports' was unexpected",
    ),
    "patch-of-unknown-container": (
        lambda j: pod_patch(j)["spec"]["containers"][0].__setitem__("name", "trainer"),
        "runtime has no container node/trainer",
    ),
    "reserved-torchrun-env": (
        lambda j: j["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "2"}),
        "reserved torchrun variable PET_NNODES",
    ),
}


@needs_crd
@pytest.mark.parametrize(("breakage", "expected"), list(BREAKAGES.values()), ids=list(BREAKAGES))
def test_the_validator_rejects_a_broken_trainjob(breakage: Any, expected: str) -> None:
    good = build_trainjob(make(gpus_per_node=1, memory_limit="16Gi"))
    assert_valid(good)
    broken = copy.deepcopy(good)
    breakage(broken)
    errors = schema_errors(broken)
    assert any(expected in e for e in errors), f"expected {expected!r} among {errors}"


@needs_crd
def test_an_unknown_cel_rule_is_not_passed_silently() -> None:
    schema = {"x-kubernetes-validations": [{"rule": "self.x > 1", "message": "m"}]}
    assert cel_errors({"x": 2}, schema) == ["/: unknown CEL rule 'self.x > 1': add it to CEL_RULES"]


# --------------------------------------------------------------------------------------------
# Content: the same job as the PyTorchJob, in the TrainJob's terms
# --------------------------------------------------------------------------------------------


def test_the_trainer_runs_the_same_command_counts_and_resources() -> None:
    spec = make(nnodes=4, gpus_per_node=8, cpu_request="8", memory_limit="64Gi")
    t = build_trainjob(spec)["spec"]["trainer"]
    assert t["image"] == BASE["image"]
    assert t["command"] == [
        "python", "-m", "trainer.launch", "-m", "trainer.worker", "--config", BASE["config_uri"]
    ]  # fmt: skip
    assert (t["numNodes"], t["numProcPerNode"]) == (4, 8)
    assert t["resourcesPerNode"] == {
        "requests": {"cpu": "8"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "8"},
    }
    env = {e["name"]: e.get("value") for e in t["env"]}
    assert env["GPUPIPE_JOB"] == BASE["job_name"] and env["HOME"] == "/tmp"


def test_the_default_runtime_and_a_namespaced_one() -> None:
    ref = build_trainjob(make())["spec"]["runtimeRef"]
    assert ref == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    mine = build_trainjob(make(runtime="TrainingRuntime/torch-h200"))["spec"]["runtimeRef"]
    assert (mine["name"], mine["kind"]) == ("torch-h200", "TrainingRuntime")


@pytest.mark.parametrize(
    "text", ["Job/torch", "", "TrainingRuntime/", "Torch_Distributed"], ids=str
)
def test_a_bad_runtime_names_the_setting(text: str) -> None:
    with pytest.raises(InputError) as info:
        RuntimeRef.parse(text)
    assert info.value.where == "train.cluster.runtime"


def test_runtime_patches_carry_what_the_trainjob_api_has_no_field_for() -> None:
    spec = make(
        gpus_per_node=8,
        node_selector={"pool": "h200"},
        image_pull_secrets=["regcred"],
        service_account="trainer",
    )
    template = pod_patch(build_trainjob(spec))
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert template["metadata"]["labels"]["gpupipe.dev/job"] == BASE["job_name"]
    pod = template["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes["tmp"]["emptyDir"] == {}
    (node,) = pod["containers"]
    assert {m["mountPath"] for m in node["volumeMounts"]} == {"/dev/shm", "/tmp"}
    assert node["securityContext"]["allowPrivilegeEscalation"] is False
    assert node["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["tolerations"] == [GPU_TOL]
    assert pod["nodeSelector"] == {"pool": "h200"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "trainer"


def test_without_patches_only_trainjob_fields_are_sent() -> None:
    job = build_trainjob(make(gpus_per_node=8, runtime_patches=False))
    assert "runtimePatches" not in job["spec"]
    assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"


def test_labels_and_annotations_are_on_the_trainjob_and_its_pods() -> None:
    labels = {"kueue.x-k8s.io/queue-name": "gpu-team"}
    job = build_trainjob(make(labels=labels, annotations={"karpenter.sh/do-not-disrupt": "true"}))
    assert job["metadata"]["labels"]["app.kubernetes.io/name"] == "gpupipe"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    assert job["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    template = pod_patch(job)
    assert template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    assert template["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert "ownerReferences" not in job["metadata"]  # the watch loop adds the launcher pod


def test_the_longest_generated_name_fits_jobsets_pod_names_up_to_9_nodes() -> None:
    from trainer.launch.jobspec import MAX_JOB_NAME_LEN

    build_trainjob(make(job_name="a" * MAX_JOB_NAME_LEN, nnodes=9))


def test_kueues_queue_is_the_trainjobs_label_not_its_pods() -> None:
    """gang_queue works with launcher=trainjob too: Kueue's TrainJob integration admits it."""
    job = build_trainjob(make(gang_queue="q", gang_priority_class="high"))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    assert "kueue.x-k8s.io" not in str(job["spec"])


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"job_name": "a" * 54, "nnodes": 11}, "job.name"),
        # JobSet's webhook refused this one on the cluster (TrainJobResourcesCreationFailed:
        # "pod names generated for this JobSet will exceed 63 characters"): 49 + "-node-0-1" + 6.
        ({"job_name": "a" * 49, "nnodes": 2}, "job.name"),
    ],
    ids=[
        "name-too-long-for-node-hostnames",
        "name-too-long-for-jobset-pods",
    ],
)
def test_what_a_trainjob_cannot_carry_fails_naming_the_field(
    overrides: dict[str, Any], where: str
) -> None:
    with pytest.raises(InputError) as info:
        build_trainjob(make(**overrides))
    assert info.value.where == where
