"""The PyTorchJob built from a JobSpec: valid against the upstream CRD, and what users rely on."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from tests.helpers import DNS1035, assert_valid_job, needs_crd, schema_errors
from trainer.base.errors import InputError
from trainer.launch.jobspec import (
    MAX_JOB_NAME_LEN,
    JobSpec,
    NcclConfig,
    OwnerRef,
    SchedulingConfig,
    SecretEnv,
    job_name,
    parse_quantity,
)
from trainer.launch.pytorchjob import build_pytorchjob

# --------------------------------------------------------------------------------------------
# Jobs under test
# --------------------------------------------------------------------------------------------

BASE = {
    "name": "gpupipe-train-abc123",
    "namespace": "team-a",
    "image": "ghcr.io/gpupipe/trainer-cuda:0.1.0",
    "config_uri": "s3://bucket/runs/r1/worker-config.json",
}
OWNER = OwnerRef(name="train-pod-xyz", uid="0b5c3a9e-3f7d-4b8e-9a51-2f0c3c1d9e77")
NCCL = NcclConfig(
    socket_ifname="^lo,docker", debug="INFO", ib_disable=True, heartbeat_timeout_s=900
)
GPU_TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
CREDS = [
    SecretEnv(env="AWS_ACCESS_KEY_ID", secret="object-store", key="accesskey"),
    SecretEnv(env="AWS_SECRET_ACCESS_KEY", secret="object-store", key="secretkey"),
]

CASES = {
    "1-node-cpu": {},
    "1-node-8-gpus": {
        "gpus_per_node": 8,
        "cpu_request": "8",
        "cpu_limit": "32",
        "memory_request": "64Gi",
        "memory_limit": "256Gi",
        "tolerations": [GPU_TOL],
    },
    "4x8-gpus-gang": {
        "nnodes": 4,
        "gpus_per_node": 8,
        "cpu_request": "500m",
        "memory_limit": "1.5Ti",
        "scheduling": SchedulingConfig(queue="gpu-queue", priority_class="high", min_available=4),
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "image_pull_secrets": ["regcred"],
        "service_account": "trainer",
        "tolerations": [GPU_TOL],
    },
    "exit-code": {"nnodes": 2, "restart_policy": "ExitCode"},
    "on-failure": {
        "nnodes": 2,
        "restart_policy": "OnFailure",
        "clean_pod_policy": "All",
        "active_deadline_s": 7200,
        "ttl_s": None,
        "backoff_limit": 0,
    },
    "owner-ref": {"owner": OWNER, "labels": {"team": "vision"}, "annotations": {"a.b/c": "d"}},
    "nccl": {"nnodes": 2, "gpus_per_node": 2, "nccl": NCCL, "env": {"NCCL_P2P_DISABLE": "1"}},
    "secret-env": {"secret_env": CREDS, "read_only_root_fs": False},
}


def make(**overrides: Any) -> JobSpec:
    return JobSpec(**{**BASE, **overrides})


@pytest.fixture(params=list(CASES.values()), ids=list(CASES))
def job(request: pytest.FixtureRequest) -> dict[str, Any]:
    return build_pytorchjob(make(**request.param))


def templates(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]


def container(job: dict[str, Any], rtype: str = "Master") -> dict[str, Any]:
    (c,) = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------


@needs_crd
def test_every_generated_job_validates_against_the_crd(job: dict[str, Any]) -> None:
    assert_valid_job(job)


def _int_nproc(job: dict[str, Any]) -> None:
    job["spec"]["nprocPerNode"] = 8


def _string_replicas(job: dict[str, Any]) -> None:
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "1"


def _typo_in_container(job: dict[str, Any]) -> None:
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0][
        "commmand"
    ] = ["python"]


def _bad_quantity(job: dict[str, Any]) -> None:
    container(job)["resources"]["limits"]["memory"] = "16 GB"


def _no_replica_specs(job: dict[str, Any]) -> None:
    del job["spec"]["pytorchReplicaSpecs"]


def _two_masters(job: dict[str, Any]) -> None:
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 2


def _renamed_container(job: dict[str, Any]) -> None:
    container(job)["name"] = "trainer"


BREAKAGES = {
    "nprocPerNode-int": (_int_nproc, "spec/nprocPerNode: 8 is not of type 'string'"),
    "replicas-string": (_string_replicas, "replicas: '1' is not of type 'integer'"),
    "unknown-container-field": (_typo_in_container, "'commmand' was unexpected"),
    "bad-quantity": (_bad_quantity, "limits/memory: '16 GB' does not match"),
    "no-replica-specs": (_no_replica_specs, "'pytorchReplicaSpecs' is a required property"),
    "two-masters": (_two_masters, "Master replicas must be 1"),
    "container-not-pytorch": (_renamed_container, "Master has no container named pytorch"),
}


@needs_crd
@pytest.mark.parametrize(("breakage", "expected"), list(BREAKAGES.values()), ids=list(BREAKAGES))
def test_the_validator_rejects_a_broken_job(breakage: Any, expected: str) -> None:
    good = build_pytorchjob(make(gpus_per_node=1, memory_limit="16Gi"))
    assert_valid_job(good)
    broken = copy.deepcopy(good)
    breakage(broken)
    errors = schema_errors(broken)
    assert any(expected in e for e in errors), f"expected {expected!r} among {errors}"


# --------------------------------------------------------------------------------------------
# Content
# --------------------------------------------------------------------------------------------


def test_every_replica_runs_torchrun_on_the_operators_pet_variables(job: dict[str, Any]) -> None:
    for t in templates(job):
        (c,) = t["spec"]["containers"]
        assert c["name"] == "pytorch"
        assert c["command"] == [
            "python",
            "-m",
            "trainer.launch",
            "-m",
            "trainer.worker",
            "--config",
            BASE["config_uri"],
        ]
        # Counts come from PET_* (spec.nprocPerNode, replicas), never from flags that could
        # disagree with them.
        assert not any(a.startswith(("--nnodes", "--nproc", "--node_rank")) for a in c["command"])
        assert c["ports"] == [
            {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"}
        ]
    assert isinstance(job["spec"]["nprocPerNode"], str)


@pytest.mark.parametrize(
    ("nnodes", "workers"), [(1, None), (2, 1), (4, 3)], ids=["1-node", "2-nodes", "4-nodes"]
)
def test_one_master_and_nnodes_minus_one_workers(nnodes: int, workers: int | None) -> None:
    replicas = build_pytorchjob(make(nnodes=nnodes))["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1
    assert (replicas.get("Worker") or {}).get("replicas") == workers


@pytest.mark.parametrize(
    ("overrides", "nproc", "limits"),
    [
        ({}, "1", {}),
        ({"nproc_per_node": 4}, "4", {}),
        ({"gpus_per_node": 8}, "8", {"nvidia.com/gpu": "8"}),
        ({"gpus_per_node": 8, "nproc_per_node": 8}, "8", {"nvidia.com/gpu": "8"}),
        ({"gpus_per_node": 1, "gpu_resource": "amd.com/gpu"}, "1", {"amd.com/gpu": "1"}),
    ],
    ids=["cpu", "cpu-4-procs", "8-gpus", "8-gpus-explicit", "amd"],
)
def test_one_process_per_gpu_and_gpu_limits(
    overrides: dict[str, Any], nproc: str, limits: dict[str, str]
) -> None:
    job = build_pytorchjob(make(nnodes=2, **overrides))
    assert job["spec"]["nprocPerNode"] == nproc
    for rtype in ("Master", "Worker"):
        assert container(job, rtype)["resources"].get("limits", {}) == limits


def test_cpu_and_memory_requests_and_limits() -> None:
    job = build_pytorchjob(
        make(cpu_request="4", cpu_limit="16", memory_request="16Gi", memory_limit="64Gi")
    )
    assert container(job)["resources"] == {
        "requests": {"cpu": "4", "memory": "16Gi"},
        "limits": {"cpu": "16", "memory": "64Gi"},
    }


def test_dev_shm_is_a_memory_backed_emptydir(job: dict[str, Any]) -> None:
    for t in templates(job):
        volumes = {v["name"]: v for v in t["spec"]["volumes"]}
        (mount,) = [
            m for m in t["spec"]["containers"][0]["volumeMounts"] if m["mountPath"] == "/dev/shm"
        ]
        assert volumes[mount["name"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}


def test_shm_size_is_configurable() -> None:
    job = build_pytorchjob(make(shm_size="64Gi"))
    (dshm,) = [v for v in templates(job)[0]["spec"]["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["sizeLimit"] == "64Gi"


def test_pods_get_no_istio_sidecar_and_gpupipe_labels(job: dict[str, Any]) -> None:
    name = job["metadata"]["name"]
    assert job["metadata"]["labels"]["app.kubernetes.io/name"] == "gpupipe"
    assert job["metadata"]["labels"]["gpupipe.dev/job"] == name
    for t in templates(job):
        assert t["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        assert t["metadata"]["labels"]["app.kubernetes.io/name"] == "gpupipe"
        assert t["metadata"]["labels"]["gpupipe.dev/job"] == name


def test_pods_meet_the_restricted_pod_security_standard(job: dict[str, Any]) -> None:
    for t in templates(job):
        pod = t["spec"]["securityContext"]
        assert pod["runAsNonRoot"] is True
        assert pod["runAsUser"] != 0
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
        c = t["spec"]["containers"][0]["securityContext"]
        assert c["allowPrivilegeEscalation"] is False
        assert c["capabilities"] == {"drop": ["ALL"]}
        assert t["spec"]["automountServiceAccountToken"] is False


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only-root", "writable-root"])
def test_a_read_only_root_keeps_a_writable_tmp_and_home(read_only: bool) -> None:
    job = build_pytorchjob(make(read_only_root_fs=read_only))
    c = container(job)
    assert c["securityContext"]["readOnlyRootFilesystem"] is read_only
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert ("/tmp" in mounts) is read_only
    assert (env_of(c).get("HOME") == "/tmp") is read_only


def test_object_store_credentials_come_from_a_secret() -> None:
    c = container(build_pytorchjob(make(secret_env=CREDS)))
    env = env_of(c)
    assert env["AWS_ACCESS_KEY_ID"] == {
        "secretKeyRef": {"name": "object-store", "key": "accesskey", "optional": False}
    }
    assert env["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["key"] == "secretkey"


def test_environment_names_the_job_and_carries_nccl_settings() -> None:
    job = build_pytorchjob(make(nccl=NCCL, env={"NCCL_DEBUG": "WARN", "FOO": "bar"}))
    env = env_of(container(job))
    assert env["GPUPIPE_JOB"] == BASE["name"]
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    assert env["NCCL_IB_DISABLE"] == "1"
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "900"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["NCCL_DEBUG"] == "WARN"  # the user's env wins over the typed default
    assert env["FOO"] == "bar"
    names = [e["name"] for e in container(job)["env"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    ("nccl", "expected"),
    [
        (NcclConfig(), {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}),
        (
            NcclConfig(async_error_handling=False, ib_disable=False, debug="WARN"),
            {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "WARN"},
        ),
    ],
    ids=["defaults", "explicit-off"],
)
def test_nccl_fields_map_to_environment_variables(
    nccl: NcclConfig, expected: dict[str, str]
) -> None:
    assert nccl.env() == expected


def test_run_policy_and_restart_policy() -> None:
    job = build_pytorchjob(
        make(
            nnodes=2,
            restart_policy="OnFailure",
            clean_pod_policy="All",
            backoff_limit=5,
            active_deadline_s=3600,
            ttl_s=600,
            scheduling=SchedulingConfig(queue="q", priority_class="high", min_available=2),
        )
    )
    assert job["spec"]["runPolicy"] == {
        "cleanPodPolicy": "All",
        "backoffLimit": 5,
        "activeDeadlineSeconds": 3600,
        "ttlSecondsAfterFinished": 600,
        "schedulingPolicy": {"queue": "q", "priorityClass": "high", "minAvailable": 2},
    }
    for r in job["spec"]["pytorchReplicaSpecs"].values():
        assert r["restartPolicy"] == "OnFailure"


def test_defaults_fail_fast_on_bad_input_and_keep_failed_pods() -> None:
    job = build_pytorchjob(make())
    assert job["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "ExitCode"
    assert job["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 3,
        "ttlSecondsAfterFinished": 86400,
    }


def test_owner_reference_points_at_the_launcher_pod() -> None:
    job = build_pytorchjob(make(owner=OWNER))
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": OWNER.name,
            "uid": OWNER.uid,
            "controller": False,
            "blockOwnerDeletion": False,
        }
    ]
    assert "ownerReferences" not in build_pytorchjob(make())["metadata"]


def test_pod_placement_settings() -> None:
    job = build_pytorchjob(
        make(
            tolerations=[GPU_TOL],
            node_selector={"pool": "h200"},
            image_pull_secrets=["regcred"],
            service_account="trainer",
        )
    )
    pod = templates(job)[0]["spec"]
    assert pod["tolerations"] == [GPU_TOL]
    assert pod["nodeSelector"] == {"pool": "h200"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["serviceAccountName"] == "trainer"


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------

RUN_IDS = {
    "uuid": ("4f3c2a1e-9b8d-4c7e-a6f5-1234567890ab", "train"),
    "uppercase-underscores": ("RUN_ID_With_CAPS", "Train_Step"),
    "digit-first": ("1234-run", "2-train"),
    "symbols-only": ("!!!", "***"),
    "very-long": ("r" * 300, "a-very-long-task-name-" * 10),
}


@pytest.mark.parametrize(("run_id", "task"), list(RUN_IDS.values()), ids=list(RUN_IDS))
def test_job_name_is_a_short_dns_label_the_operator_accepts(run_id: str, task: str) -> None:
    name = job_name(run_id, task)
    assert DNS1035.match(name), name
    assert len(name) <= MAX_JOB_NAME_LEN
    # Room for the operator's pod and service names, even with many workers.
    JobSpec(**{**BASE, "name": name, "nnodes": 1000})


def test_job_name_is_stable_and_distinct() -> None:
    run = "4f3c2a1e-9b8d-4c7e-a6f5-1234567890ab"
    assert job_name(run, "train") == job_name(run, "train")
    names = {
        job_name(run, "train"),
        job_name(run, "tune"),
        job_name("4f3c2a1e-0000-4c7e-a6f5-1234567890ab", "train"),  # same first 8 characters
        job_name("x" * 300 + "1", "train"),
        job_name("x" * 300 + "2", "train"),
    }
    assert len(names) == 5


def test_job_name_is_readable() -> None:
    assert job_name("4f3c2a1e-9b8d", "train").startswith("gpupipe-train-4f3c2a1e-")


@pytest.mark.parametrize(("run_id", "task"), [("", "train"), ("run", "")], ids=["run", "task"])
def test_job_name_needs_run_and_task(run_id: str, task: str) -> None:
    with pytest.raises(InputError, match="must not be empty"):
        job_name(run_id, task)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

BAD = {
    "name-not-dns": ({"name": "Train_Job"}, "job.name"),
    "name-digit-first": ({"name": "1job"}, "job.name"),
    "name-too-long-for-pods": ({"name": "a" * 60, "nnodes": 2}, "job.name"),
    "namespace": ({"namespace": "Team A"}, "job.namespace"),
    "image-spaces": ({"image": "my image"}, "job.image"),
    "nnodes-0": ({"nnodes": 0}, "job.nnodes"),
    "gpus-negative": ({"gpus_per_node": -1}, "job.gpus_per_node"),
    "nproc-0": ({"nproc_per_node": 0}, "job.nproc_per_node"),
    "nproc-not-gpus": ({"gpus_per_node": 8, "nproc_per_node": 4}, "job.nproc_per_node"),
    "gpu-resource": ({"gpu_resource": "gpu"}, "job.gpu_resource"),
    "cpu-quantity": ({"cpu_request": "lots"}, "job.cpu_request"),
    "memory-quantity": ({"memory_limit": "16GB"}, "job.memory_limit"),
    "shm-quantity": ({"shm_size": "-1Gi"}, "job.shm_size"),
    "cpu-request-over-limit": ({"cpu_request": "8", "cpu_limit": "4000m"}, "job.cpu_request"),
    "memory-request-over-limit": (
        {"memory_request": "2Gi", "memory_limit": "1Gi"},
        "job.memory_request",
    ),
    "shm-over-memory-limit": ({"memory_limit": "8Gi"}, "job.shm_size"),
    "min-available-over-nnodes": (
        {"nnodes": 4, "scheduling": SchedulingConfig(min_available=5)},
        "job.scheduling.min_available",
    ),
    "restart-always": ({"restart_policy": "Always"}, "job.restart_policy"),
    "clean-pod-policy": ({"clean_pod_policy": "Sometimes"}, "job.clean_pod_policy"),
    "backoff-negative": ({"backoff_limit": -1}, "job.backoff_limit"),
    "deadline-0": ({"active_deadline_s": 0}, "job.active_deadline_s"),
    "toleration-typo": (
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "efect": "NoSchedule"}]},
        "job.tolerations[0]",
    ),
    "toleration-effect": (
        {"tolerations": [{"key": "k", "operator": "Exists", "effect": "Never"}]},
        "job.tolerations[0].effect",
    ),
    "node-selector-key": ({"node_selector": {"bad key": "x"}}, "job.node_selector"),
    "pull-secret": ({"image_pull_secrets": ["Reg_Cred"]}, "job.image_pull_secrets"),
    "service-account": ({"service_account": "Trainer!"}, "job.service_account"),
    "env-pet": ({"env": {"PET_NNODES": "2"}}, "job.env"),
    "env-master-addr": ({"env": {"MASTER_ADDR": "x"}}, "job.env"),
    "env-job-id": ({"env": {"GPUPIPE_JOB": "other"}}, "job.env"),
    "env-twice": (
        {"env": {"AWS_ACCESS_KEY_ID": "x"}, "secret_env": CREDS},
        "job.secret_env",
    ),
    "label-reserved": ({"labels": {"gpupipe.dev/job": "x"}}, "job.labels"),
    "label-value": ({"labels": {"team": "a b"}}, "job.labels[team]"),
    "port": ({"port": 0}, "job.port"),
}


@pytest.mark.parametrize(("overrides", "where"), list(BAD.values()), ids=list(BAD))
def test_bad_specs_fail_naming_the_field(overrides: dict[str, Any], where: str) -> None:
    with pytest.raises(InputError) as info:
        make(**overrides)
    assert info.value.where == where
    assert where in str(info.value)


@pytest.mark.parametrize(
    ("build", "where"),
    [
        (lambda: NcclConfig(debug="LOUD"), "job.nccl.debug"),  # type: ignore[arg-type]
        (lambda: NcclConfig(socket_ifname="eth0 eth1"), "job.nccl.socket_ifname"),
        (lambda: NcclConfig(heartbeat_timeout_s=0), "job.nccl.heartbeat_timeout_s"),
        (lambda: SchedulingConfig(min_available=0), "job.scheduling.min_available"),
        (lambda: SchedulingConfig(priority_class="High!"), "job.scheduling.priority_class"),
        (lambda: SecretEnv(env="1BAD", secret="s", key="k"), "job.secret_env.env"),
        (lambda: SecretEnv(env="OK", secret="S_S", key="k"), "job.secret_env.secret"),
        (lambda: SecretEnv(env="OK", secret="s", key="a/b"), "job.secret_env.key"),
        (lambda: OwnerRef(name="pod", uid="x"), "job.owner.uid"),
    ],
    ids=[
        "nccl-debug",
        "nccl-ifname",
        "nccl-heartbeat",
        "min-available-0",
        "priority-class",
        "secret-env-name",
        "secret-name",
        "secret-key",
        "owner-uid",
    ],
)
def test_bad_sub_configs_fail_naming_the_field(build: Any, where: str) -> None:
    with pytest.raises(InputError) as info:
        build()
    assert info.value.where == where


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("500m", Decimal("0.5")),
        ("4", Decimal(4)),
        ("1.5", Decimal("1.5")),
        ("16Gi", Decimal(16 * 2**30)),
        ("1.5Ti", Decimal("1.5") * 2**40),
        ("64M", Decimal(64 * 10**6)),
        ("1e3", Decimal(1000)),
        ("2E", Decimal(2 * 10**18)),
        (".5k", Decimal(500)),
    ],
    ids=["milli", "int", "decimal", "gibi", "tebi-fraction", "mega", "exponent", "exa", "dot"],
)
def test_quantities_parse_like_kubernetes(text: str, value: Decimal) -> None:
    assert parse_quantity(text, "q") == value


@pytest.mark.parametrize("text", ["", "16GB", "1 Gi", "-1", "Gi", "1.2.3", "0x10"])
def test_invalid_quantities_are_rejected(text: str) -> None:
    with pytest.raises(InputError, match="Kubernetes quantity"):
        parse_quantity(text, "job.memory_limit")
