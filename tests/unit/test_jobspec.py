"""The PyTorchJob built from a JobSpec: valid against the upstream CRD, and what users rely on."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from tests.helpers import DNS1035, assert_valid_job, needs_crd, schema_errors
from tests.unit.specs import BASE
from tests.unit.specs import job_spec as make
from trainer.base.errors import InputError
from trainer.launch import jobspec
from trainer.launch.jobspec import MAX_JOB_NAME_LEN, job_name, parse_quantity
from trainer.launch.pytorchjob import build_pytorchjob

# --------------------------------------------------------------------------------------------
# Jobs under test
# --------------------------------------------------------------------------------------------

GPU_TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
NCCL_ENV = {"NCCL_SOCKET_IFNAME": "^lo,docker", "NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1"}

CASES = {
    "1-node-cpu": {},
    "1-node-8-gpus": {
        "gpus_per_node": 8,
        "cpu_request": "8",
        "cpu_limit": "32",
        "memory_request": "64Gi",
        "memory_limit": "256Gi",
    },
    "4x8-gpus-gang": {
        "nnodes": 4,
        "gpus_per_node": 8,
        "cpu_request": "500m",
        "memory_limit": "1.5Ti",
        "gang_queue": "gpu-queue",
        "gang_priority_class": "high",
        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "image_pull_secrets": ["regcred"],
        "service_account": "trainer",
    },
    "deadline": {"nnodes": 2, "timeout_s": 7200},
    "labels-annotations": {
        "labels": {"team": "vision", "kueue.x-k8s.io/queue-name": "gpu"},
        "annotations": {"a.b/c": "d"},
    },
    "nccl-env": {"nnodes": 2, "gpus_per_node": 2, "env": NCCL_ENV},
    "object-store-secret": {"object_store_secret": "object-store"},
}


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
        ({"gpus_per_node": 8}, "8", {"nvidia.com/gpu": "8"}),
        ({"gpus_per_node": 1, "gpu_resource": "amd.com/gpu"}, "1", {"amd.com/gpu": "1"}),
    ],
    ids=["cpu", "8-gpus", "amd"],
)
def test_one_process_per_gpu_and_gpu_limits(
    overrides: dict[str, Any], nproc: str, limits: dict[str, str]
) -> None:
    job = build_pytorchjob(make(nnodes=2, **overrides))
    assert job["spec"]["nprocPerNode"] == nproc
    for rtype in ("Master", "Worker"):
        assert container(job, rtype)["resources"].get("limits", {}) == limits
        # What the worker checks torch finds (trainer.distributed.dist.check_gpus_found).
        held = env_of(container(job, rtype)).get("GPUPIPE_GPUS_PER_NODE")
        assert held == (nproc if limits else None)
        tolerations = job["spec"]["pytorchReplicaSpecs"][rtype]["template"]["spec"].get(
            "tolerations", []
        )
        assert tolerations == ([GPU_TOL] if limits else [])


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


def test_a_read_only_root_keeps_a_writable_tmp_and_home(job: dict[str, Any]) -> None:
    for t in templates(job):
        (c,) = t["spec"]["containers"]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}
        assert env_of(c)["HOME"] == "/tmp"


def test_object_store_credentials_come_from_a_secret() -> None:
    env = env_of(container(build_pytorchjob(make(object_store_secret="object-store"))))
    assert env["AWS_ACCESS_KEY_ID"] == {
        "secretKeyRef": {"name": "object-store", "key": "accesskey", "optional": False}
    }
    assert env["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["key"] == "secretkey"
    assert "AWS_ACCESS_KEY_ID" not in env_of(container(build_pytorchjob(make())))


def test_environment_names_the_job_and_carries_the_users_variables() -> None:
    job = build_pytorchjob(make(env={**NCCL_ENV, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}))
    env = env_of(container(job))
    assert env["GPUPIPE_JOB"] == BASE["job_name"]
    assert env["PYTHONUNBUFFERED"] == "1"
    assert {k: env[k] for k in NCCL_ENV} == NCCL_ENV
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"  # the user's env wins over the default
    assert env_of(container(build_pytorchjob(make())))["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    names = [e["name"] for e in container(job)["env"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD"])
def test_a_secret_in_the_jobs_plain_env_is_refused_in_the_step(name: str) -> None:
    # Issue 60, item 7: `gpupipe run --host` refuses it before submitting, but a run started
    # from the UI's form reached the step, and the pod spec carried it as a plain value.
    with pytest.raises(ValueError) as e:
        make(env={name: "hf_abc123"})
    message = str(e.value)
    assert "train.cluster.env" in message and "train.cluster.secret_env" in message
    assert "hf_abc123" not in message
    # Not a secret: a variable whose name only contains a word like it.
    make(env={"TOKENIZERS_PARALLELISM": "false"})


def test_secret_env_reaches_the_pod_through_secret_key_ref_only() -> None:
    job = build_pytorchjob(make(secret_env={"HF_TOKEN": "hf-account/token"}))
    (entry,) = [e for e in container(job)["env"] if e["name"] == "HF_TOKEN"]
    assert entry == {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-account", "key": "token", "optional": False}},
    }


@pytest.mark.parametrize(
    ("secret_env", "expected"),
    [
        ({"HF_TOKEN": "no-key"}, "must be <secret>/<key>"),
        ({"HF_TOKEN": "Bad_Name/token"}, "a secret name"),
        ({"HF_TOKEN": "acct/to ken"}, "must name a Secret key"),
        ({"MASTER_ADDR": "acct/key"}, "owned by gpupipe"),
        ({"AWS_ACCESS_KEY_ID": "acct/key"}, "owned by gpupipe"),
        ({"1X": "acct/key"}, "environment variable names"),
    ],
    ids=["no-key", "bad-secret", "bad-key", "reserved", "store", "bad-name"],
)
def test_a_bad_secret_env_names_the_field(secret_env: dict[str, str], expected: str) -> None:
    with pytest.raises(ValueError, match=r"train\.cluster\.secret_env") as e:
        make(secret_env=secret_env)
    assert expected in str(e.value)


def test_run_policy_fails_fast_on_bad_input_and_keeps_failed_pods() -> None:
    job = build_pytorchjob(make(nnodes=2))
    for r in job["spec"]["pytorchReplicaSpecs"].values():
        assert r["restartPolicy"] == "ExitCode"
    assert job["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 3,
        "ttlSecondsAfterFinished": 86400,
    }


def test_the_deadline_goes_to_the_run_policy_and_the_queue_to_kueues_labels() -> None:
    """gang_queue and gang_priority_class are Kueue's labels on the job, not on its pods (Kueue
    admits the job whole); no Volcano scheduling policy."""
    job = build_pytorchjob(
        make(nnodes=2, timeout_s=3600, gang_queue="q", gang_priority_class="high")
    )
    policy = job["spec"]["runPolicy"]
    assert policy["activeDeadlineSeconds"] == 3600
    assert "schedulingPolicy" not in policy
    labels = job["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "q"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        pod_labels = replica["template"]["metadata"]["labels"]
        assert not any(k.startswith("kueue.x-k8s.io/") for k in pod_labels)
    only_queue = build_pytorchjob(make(gang_queue="q2"))["metadata"]["labels"]
    assert only_queue["kueue.x-k8s.io/queue-name"] == "q2"
    assert "kueue.x-k8s.io/priority-class" not in only_queue
    assert not any(k.startswith("kueue.") for k in build_pytorchjob(make())["metadata"]["labels"])


def test_a_queue_given_twice_must_agree() -> None:
    labels = {"kueue.x-k8s.io/queue-name": "team-a"}
    assert build_pytorchjob(make(labels=labels, gang_queue="team-a"))  # the same: fine
    with pytest.raises(InputError, match=r"differs from the label kueue\.x-k8s\.io/queue-name"):
        make(labels=labels, gang_queue="team-b")


def test_labels_and_annotations_reach_the_job_and_its_pods() -> None:
    labels = {"kueue.x-k8s.io/queue-name": "gpu-team"}
    job = build_pytorchjob(make(labels=labels, annotations={"karpenter.sh/do-not-disrupt": "true"}))
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    assert job["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true"}
    for t in templates(job):
        assert t["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
        assert t["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    assert "annotations" not in build_pytorchjob(make())["metadata"]


def test_the_launcher_pod_owns_the_job_through_the_watch_loop_only() -> None:
    # The spec carries no owner: the watch loop adds the launcher pod's (see the launchers).
    assert "ownerReferences" not in build_pytorchjob(make())["metadata"]


def test_pod_placement_settings() -> None:
    job = build_pytorchjob(
        make(
            gpus_per_node=1,
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
    make(job_name=name, nnodes=1000)


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


def test_the_run_id_is_the_parameter_else_the_pods_label_else_local(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(jobspec.RUN_ID_ENV, raising=False)
    assert jobspec.run_id() == "local"
    monkeypatch.setenv(jobspec.RUN_ID_ENV, "4f3c2a1e-9b8d")
    assert jobspec.run_id() == "4f3c2a1e-9b8d"
    assert jobspec.run_id("given") == "given"
    monkeypatch.setenv(jobspec.RUN_ID_ENV, "")
    assert jobspec.run_id() == "local"


@pytest.mark.parametrize(("run_id", "task"), [("", "train"), ("run", "")], ids=["run", "task"])
def test_job_name_needs_run_and_task(run_id: str, task: str) -> None:
    with pytest.raises(InputError, match="must not be empty"):
        job_name(run_id, task)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------

BAD = {
    "name-not-dns": ({"job_name": "Train_Job"}, "job.name"),
    "name-digit-first": ({"job_name": "1job"}, "job.name"),
    "name-too-long-for-pods": ({"job_name": "a" * 60, "nnodes": 2}, "job.name"),
    "namespace": ({"namespace": "Team A"}, "job.namespace"),
    "no-image": ({"image": ""}, "train.cluster.image"),
    "image-spaces": ({"image": "my image"}, "train.cluster.image"),
    "nnodes-0": ({"nnodes": 0}, "job.nnodes"),
    "gpus-negative": ({"gpus_per_node": -1}, "job.gpus_per_node"),
    "deadline-0": ({"timeout_s": 0}, "job.active_deadline_s"),
    "gpu-resource": ({"gpu_resource": "gpu"}, "train.cluster.gpu_resource"),
    "cpu-quantity": ({"cpu_request": "lots"}, "train.cluster.cpu_request"),
    "memory-quantity": ({"memory_limit": "16GB"}, "train.cluster.memory_limit"),
    "shm-quantity": ({"shm_size": "-1Gi"}, "train.cluster.shm_size"),
    "cpu-request-over-limit": (
        {"cpu_request": "8", "cpu_limit": "4000m"},
        "train.cluster.cpu_request",
    ),
    "memory-request-over-limit": (
        {"memory_request": "2Gi", "memory_limit": "1Gi"},
        "train.cluster.memory_request",
    ),
    "shm-over-memory-limit": ({"memory_limit": "8Gi"}, "train.cluster.shm_size"),
    "node-selector-key": ({"node_selector": {"bad key": "x"}}, "train.cluster.node_selector"),
    "pull-secret": ({"image_pull_secrets": ["Reg_Cred"]}, "train.cluster.image_pull_secrets"),
    "object-store-secret": ({"object_store_secret": "S_S"}, "train.cluster.object_store_secret"),
    "service-account": ({"service_account": "Trainer!"}, "train.cluster.service_account"),
    "env-name": ({"env": {"1BAD": "x"}}, "train.cluster.env"),
    "env-pet": ({"env": {"PET_NNODES": "2"}}, "train.cluster.env"),
    "env-master-addr": ({"env": {"MASTER_ADDR": "x"}}, "train.cluster.env"),
    "env-job-id": ({"env": {"GPUPIPE_JOB": "other"}}, "train.cluster.env"),
    "env-gpus-held": ({"env": {"GPUPIPE_GPUS_PER_NODE": "0"}}, "train.cluster.env"),
    "env-value": ({"env": {"NCCL_IB_DISABLE": 1}}, "train.cluster.env[NCCL_IB_DISABLE]"),
    "env-and-secret": (
        {"env": {"AWS_ACCESS_KEY_ID": "x"}, "object_store_secret": "object-store"},
        "train.cluster.env",
    ),
    "label-reserved": ({"labels": {"gpupipe.dev/job": "x"}}, "train.cluster.labels"),
    "label-value": ({"labels": {"team": "a b"}}, "train.cluster.labels[team]"),
    "annotation-key": ({"annotations": {"a b": "x"}}, "train.cluster.annotations"),
    "annotation-value": ({"annotations": {"a": True}}, "train.cluster.annotations[a]"),
    "gang-queue-empty": ({"gang_queue": " "}, "train.cluster.gang_queue"),
    "gang-priority-class": (
        {"gang_priority_class": "High!"},
        "train.cluster.gang_priority_class",
    ),
    "runtime": ({"runtime": "Runtime/x"}, "train.cluster.runtime"),
}


@pytest.mark.parametrize(("overrides", "where"), list(BAD.values()), ids=list(BAD))
def test_bad_specs_fail_naming_the_field(overrides: dict[str, Any], where: str) -> None:
    with pytest.raises(InputError) as info:
        make(**overrides)
    assert info.value.where == where
    assert where in str(info.value)


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


@needs_crd
def test_one_worker_per_node_keeps_every_pod_of_the_job_off_each_others_node() -> None:
    from tests.helpers import assert_valid_trainjob
    from trainer.launch.trainjob import build_trainjob

    spec = make(nnodes=3, one_worker_per_node=True)
    want = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"gpupipe.dev/job": spec.name}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    job = build_pytorchjob(spec)
    assert_valid_job(job)
    for role in ("Master", "Worker"):
        pod = job["spec"]["pytorchReplicaSpecs"][role]["template"]
        assert pod["spec"]["affinity"] == want, role
        # The selector matches the job's own pods, and only them.
        assert pod["metadata"]["labels"]["gpupipe.dev/job"] == spec.name
    trainjob = build_trainjob(spec)
    assert_valid_trainjob(trainjob)
    (patch,) = trainjob["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    template = node["template"]["spec"]["template"]
    assert template["spec"]["affinity"] == want
    assert template["metadata"]["labels"]["gpupipe.dev/job"] == spec.name
    # Off by default: the scheduler may pack pods onto one node.
    plain = build_pytorchjob(make(nnodes=3))
    assert "affinity" not in plain["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
