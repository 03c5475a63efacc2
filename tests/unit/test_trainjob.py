"""The TrainJob built from a JobSpec: valid against the upstream Trainer CRD (schema and CEL rules),
and the TrainJob launcher against a fake API server that plays Kubeflow Trainer and JobSet."""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.fakes.kube_api import FakeKubeApi, Scenario
from tests.helpers import (
    assert_valid_trainjob,
    cel_errors,
    needs_trainjob_crd,
    trainjob_schema_errors,
)
from trainer.base.errors import InputError
from trainer.launch.jobspec import (
    ClusterConfig,
    JobSpec,
    NcclConfig,
    OwnerRef,
    SchedulingConfig,
    SecretEnv,
    job_name,
)
from trainer.launch.kube import KubeApi, RetryPolicy
from trainer.launch.trainjob import (
    API_CALLS,
    MANAGER,
    LaunchCancelled,
    PodRef,
    RuntimeRef,
    TrainJobLauncher,
    build_trainjob,
    trainjob_state,
)

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
NCCL = NcclConfig(socket_ifname="^lo,docker", debug="INFO", ib_disable=True)
GPU_TOL = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
CREDS = [
    SecretEnv(env="AWS_ACCESS_KEY_ID", secret="object-store", key="accesskey"),
    SecretEnv(env="AWS_SECRET_ACCESS_KEY", secret="object-store", key="secretkey"),
]
needs_crd = needs_trainjob_crd
schema_errors = trainjob_schema_errors
assert_valid = assert_valid_trainjob


CASES: dict[str, tuple[dict[str, Any], bool]] = {
    "1-node-cpu": ({}, True),
    "1-node-cpu-no-patches": ({}, False),
    "1-node-8-gpus": (
        {"gpus_per_node": 8, "memory_limit": "256Gi", "tolerations": [GPU_TOL]},
        True,
    ),
    "1-node-8-gpus-no-patches": ({"gpus_per_node": 8, "tolerations": [GPU_TOL]}, False),
    "4x8-gpus": (
        {
            "nnodes": 4,
            "gpus_per_node": 8,
            "memory_limit": "1.5Ti",
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
            "image_pull_secrets": ["regcred"],
            "service_account": "trainer",
            "tolerations": [GPU_TOL],
            "active_deadline_s": 7200,
        },
        True,
    ),
    "4x8-gpus-no-patches": ({"nnodes": 4, "gpus_per_node": 8}, False),
    "owner-labels-nccl-secrets": (
        {
            "owner": OWNER,
            "labels": {"team": "vision"},
            "annotations": {"a.b/c": "d"},
            "nccl": NCCL,
            "secret_env": CREDS,
            "read_only_root_fs": False,
        },
        True,
    ),
}


def make(**overrides: Any) -> JobSpec:
    return JobSpec(**{**BASE, **overrides})


@pytest.fixture(params=list(CASES.values()), ids=list(CASES))
def trainjob(request: pytest.FixtureRequest) -> dict[str, Any]:
    overrides, patches = request.param
    return build_trainjob(make(**overrides), runtime_patches=patches)


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
    assert env["GPUPIPE_JOB"] == BASE["name"] and env["HOME"] == "/tmp"


def test_the_default_runtime_and_a_namespaced_one() -> None:
    ref = build_trainjob(make())["spec"]["runtimeRef"]
    assert ref == {
        "name": "torch-distributed",
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
    }
    mine = RuntimeRef.parse("TrainingRuntime/torch-h200")
    assert build_trainjob(make(), runtime=mine)["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"


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
        tolerations=[GPU_TOL],
        node_selector={"pool": "h200"},
        image_pull_secrets=["regcred"],
        service_account="trainer",
    )
    template = pod_patch(build_trainjob(spec))
    assert template["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert template["metadata"]["labels"]["gpupipe.dev/job"] == BASE["name"]
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
    job = build_trainjob(make(gpus_per_node=8, tolerations=[GPU_TOL]), runtime_patches=False)
    assert "runtimePatches" not in job["spec"]
    assert job["spec"]["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"


def test_owner_reference_and_labels_are_on_the_trainjob() -> None:
    job = build_trainjob(make(owner=OWNER))
    (ref,) = job["metadata"]["ownerReferences"]
    assert (ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == (OWNER.uid, False, False)
    assert job["metadata"]["labels"]["app.kubernetes.io/name"] == "gpupipe"


def test_the_longest_generated_name_fits_jobsets_pod_names_up_to_9_nodes() -> None:
    from trainer.launch.jobspec import MAX_JOB_NAME_LEN

    build_trainjob(make(name="a" * MAX_JOB_NAME_LEN, nnodes=9))


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"scheduling": SchedulingConfig(queue="q")}, "job.scheduling"),
        ({"name": "a" * 54, "nnodes": 11}, "job.name"),
        # JobSet's webhook refused this one on the cluster (TrainJobResourcesCreationFailed:
        # "pod names generated for this JobSet will exceed 63 characters"): 49 + "-node-0-1" + 6.
        ({"name": "a" * 49, "nnodes": 2}, "job.name"),
    ],
    ids=["gang-scheduling", "name-too-long-for-node-hostnames", "name-too-long-for-jobset-pods"],
)
def test_what_a_trainjob_cannot_carry_fails_naming_the_field(
    overrides: dict[str, Any], where: str
) -> None:
    with pytest.raises(InputError) as info:
        build_trainjob(make(**overrides))
    assert info.value.where == where


# --------------------------------------------------------------------------------------------
# The launcher against the fake Trainer
# --------------------------------------------------------------------------------------------

NS = "team-a"
JOB = job_name("run-0f3c9a", "train")
REF = f"{NS}/{JOB}"
JOB_PATH = rf"/trainjobs/{JOB}$"
LINES = [f"epoch {i} loss {1 / i:.4f}" for i in range(1, 7)]
POD = PodRef(name="train-launcher-abc12", namespace=NS, uid="3f0e6a52-9a0c-4c2e-8f4e-0c7f7b1d2a11")
CLUSTER = ClusterConfig(image="gpupipe:test")


@pytest.fixture
def fake() -> Iterator[FakeKubeApi]:
    with FakeKubeApi(Scenario(lines=list(LINES))) as server:
        yield server


@pytest.fixture
def waits() -> list[float]:
    return []


@pytest.fixture
def launcher(fake: FakeKubeApi, waits: list[float]) -> Callable[..., TrainJobLauncher]:
    cfg = client.Configuration(host=fake.url)
    cfg.retries = False
    api = KubeApi(
        client.ApiClient(cfg),
        retry=RetryPolicy(attempts=4, backoff_s=0.01, max_backoff_s=0.02),
        request_timeout_s=0.5,
        sleep=waits.append,
    )

    def make_launcher(**kwargs: Any) -> TrainJobLauncher:
        return TrainJobLauncher(
            **{"namespace": NS, "cluster": CLUSTER, "api": api, "poll_s": 0.05, **kwargs}
        )

    return make_launcher


def launch(launcher: TrainJobLauncher, timeout_s: int | None = 20) -> None:
    launcher.launch(
        job_name=JOB,
        config_uri="s3://bucket/work/worker-config.json",
        nproc_per_node=2,
        nnodes=2,
        timeout_s=timeout_s,
    )


def test_success_streams_node_0s_log_once_in_order(
    launcher: Callable[..., TrainJobLauncher],
    fake: FakeKubeApi,
    capsys: pytest.CaptureFixture[str],
) -> None:
    launch(launcher())

    # Node 1's pod carries the same JobSet labels: only node 0's lines (and each once) show.
    assert capsys.readouterr().out.splitlines() == LINES
    assert fake.created == [REF]
    job = fake.trainjob(JOB)
    assert job is not None and trainjob_state(job) == "Succeeded"
    assert job["spec"]["trainer"]["numNodes"] == 2
    (patch,) = job["spec"]["runtimePatches"]
    assert patch["manager"] == MANAGER and patch["time"]  # Trainer's defaulter stamps it
    assert fake.calls("DELETE") == []
    (post,) = fake.calls("POST", r"/trainjobs$")
    assert post.body["spec"]["runtimeRef"]["name"] == "torch-distributed"
    logs = fake.calls("GET", "/log$")
    assert logs and all(r.query["container"] == ["node"] for r in logs)


FAILED = Scenario(
    lines=[f"line-{c}" for c in "abcdefgh"],
    outcome="Failed",
    pod_events=[("Warning", "BackOff", "Back-off restarting failed container node")],
)


@pytest.mark.parametrize(
    ("on_exit", "job_left"),
    [("delete", None), ("keep", False), ("suspend", True)],
    ids=["delete", "keep", "suspend"],
)
def test_failure_names_conditions_events_and_last_lines_then_applies_on_exit(
    launcher: Callable[..., TrainJobLauncher],
    fake: FakeKubeApi,
    on_exit: str,
    job_left: bool | None,
) -> None:
    fake.scenario = FAILED

    with pytest.raises(RuntimeError) as info:
        launch(launcher(on_exit=on_exit, log_tail=3))

    message = str(info.value)
    assert f"TrainJob {REF} failed: FailedJobs: jobset failed" in message
    assert "conditions: Failed=True" in message
    assert "node 0 pod" in message and "exited with code 1" in message
    assert "Back-off restarting failed container node" in message
    assert f"job {JOB}-node-0 failed: BackoffLimitExceeded" in message
    assert "  line-f\n  line-g\n  line-h" in message
    assert "line-e" not in message
    job = fake.trainjob(JOB)
    if job_left is None:
        assert job is None
        assert "it was deleted (on_exit=delete)" in message
    else:
        assert job is not None
        assert bool(job["spec"].get("suspend")) is job_left
        assert fake.calls("DELETE") == []


def test_the_workers_bad_input_line_fails_the_step_as_bad_input(
    launcher: Callable[..., TrainJobLauncher], fake: FakeKubeApi
) -> None:
    fake.scenario = Scenario(
        lines=["loading config", "ERROR [train] E_CONFIG: must be > 0, got -1 (optim.lr)"],
        outcome="Failed",
    )

    with pytest.raises(InputError) as info:
        launch(launcher())

    assert (info.value.code, info.value.where) == ("E_CONFIG", "optim.lr")
    assert fake.trainjob(JOB) is None


def test_deadline_stops_the_job_and_raises_timeout(
    launcher: Callable[..., TrainJobLauncher], fake: FakeKubeApi
) -> None:
    fake.scenario = Scenario(lines=LINES, outcome=None)
    started = time.monotonic()

    with pytest.raises(TimeoutError, match=rf"TrainJob {REF} did not finish within 1 s .*Running"):
        launch(launcher(), timeout_s=1)

    assert time.monotonic() - started < 3
    assert fake.trainjob(JOB) is None
    (post,) = fake.calls("POST")
    assert post.body["spec"]["activeDeadlineSeconds"] == 1


def test_sigterm_deletes_the_job_and_fails_the_step(
    launcher: Callable[..., TrainJobLauncher], fake: FakeKubeApi
) -> None:
    fake.scenario = Scenario(lines=LINES, outcome=None)
    stray: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stray.append(signum))

    def cancel_once_streaming() -> None:
        end = time.monotonic() + 10
        while not fake.calls("GET", "/log$") and time.monotonic() < end:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        threading.Thread(target=cancel_once_streaming, daemon=True).start()
        with pytest.raises(LaunchCancelled, match=rf"{REF}: the step was cancelled .*deleted"):
            launch(launcher(), timeout_s=None)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stray == []
    assert fake.trainjob(JOB) is None


@pytest.mark.parametrize(
    ("scenario", "age_s", "fails"),
    [
        (Scenario(lines=LINES, line_every_s=0.1), 0.4, False),
        (Scenario(lines=LINES), 3600, False),
        (Scenario(lines=LINES, outcome="Failed"), 3600, True),
    ],
    ids=["running-waits-for-it", "succeeded-is-reported", "failed-is-reported"],
)
def test_a_retried_launcher_reattaches_to_its_trainjob(
    launcher: Callable[..., TrainJobLauncher],
    fake: FakeKubeApi,
    capsys: pytest.CaptureFixture[str],
    scenario: Scenario,
    age_s: float,
    fails: bool,
) -> None:
    fake.add_job(JOB, scenario=scenario, age_s=age_s, kind="TrainJob")

    if fails:
        with pytest.raises(RuntimeError, match=rf"(?s){REF} failed.*{re.escape(LINES[-1])}"):
            launch(launcher())
        assert fake.trainjob(JOB) is None
    else:
        launch(launcher())
        assert fake.calls("DELETE") == []
    assert fake.calls("POST") == []
    assert capsys.readouterr().out.splitlines() == LINES


def test_a_trainjob_created_between_get_and_create_is_adopted(
    launcher: Callable[..., TrainJobLauncher], fake: FakeKubeApi
) -> None:
    fake.add_job(JOB, kind="TrainJob")
    fake.fail("GET", JOB_PATH, 404)

    launch(launcher())

    assert len(fake.calls("POST")) == 1  # answered 409 AlreadyExists
    assert fake.created == []


def test_a_suspended_trainjob_is_resumed_and_owned_by_the_new_launcher_pod(
    launcher: Callable[..., TrainJobLauncher], fake: FakeKubeApi
) -> None:
    earlier = PodRef(name="old", namespace=NS, uid="0b1c2d3e-aaaa-bbbb-cccc-000000000001")
    fake.add_job(
        JOB, age_s=0.2, suspended=True, owners=[earlier.owner_reference()], kind="TrainJob"
    )
    job = fake.trainjob(JOB)
    assert job is not None and trainjob_state(job) == "Suspended"

    launch(launcher(own_pod=POD))

    job = fake.trainjob(JOB)
    assert job is not None and trainjob_state(job) == "Succeeded"
    assert job["spec"]["suspend"] is False
    assert [o["uid"] for o in job["metadata"]["ownerReferences"]] == [earlier.uid, POD.uid]
    (patch,) = fake.calls("PATCH")
    assert patch.body["spec"] == {"suspend": False}


@pytest.mark.parametrize(
    ("method", "path", "status", "times"),
    [
        ("POST", r"/trainjobs$", 429, 1),
        ("POST", r"/trainjobs$", 503, 3),
        ("GET", JOB_PATH, 500, 2),
        ("GET", r"/pods$", 500, 2),
        ("GET", r"/log$", 503, 3),
    ],
    ids=["create-429", "create-503", "get-500", "list-pods-500", "log-503"],
)
def test_transient_api_errors_are_retried(
    launcher: Callable[..., TrainJobLauncher],
    fake: FakeKubeApi,
    waits: list[float],
    capsys: pytest.CaptureFixture[str],
    method: str,
    path: str,
    status: int,
    times: int,
) -> None:
    fake.fail(method, path, status, times=times)

    launch(launcher())

    assert fake.created == [REF]
    assert len(waits) == times
    assert capsys.readouterr().out.splitlines() == LINES


def test_a_forbidden_create_names_the_missing_permission(
    launcher: Callable[..., TrainJobLauncher], fake: FakeKubeApi
) -> None:
    fake.fail("POST", r"/trainjobs$", 403, times=5, message="trainjobs is forbidden")

    with pytest.raises(RuntimeError) as info:
        launch(launcher())

    assert "needs RBAC verb 'create' on 'trainjobs' in API group 'trainer.kubeflow.org'" in str(
        info.value
    )
    assert len(fake.calls("POST")) == 1


def _rbac(method: str, path: str) -> tuple[str, str, str]:
    m = re.match(r"^/apis/([^/]+)/", path)
    group = m.group(1) if m else ""
    parts = path.split("/namespaces/", 1)[1].split("/")[1:]
    resource = "/".join(parts[::2])
    verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(method)
    return group, resource, verb or ("get" if len(parts) >= 2 else "list")


def test_api_calls_lists_exactly_the_calls_the_launcher_makes(
    launcher: Callable[..., TrainJobLauncher], fake: FakeKubeApi
) -> None:
    fake.scenario = FAILED
    with pytest.raises(RuntimeError):
        launch(launcher())  # create, get, list pods, log, events, delete
    fake.scenario = Scenario(lines=LINES)
    fake.add_job(JOB, age_s=0.2, kind="TrainJob")
    launch(launcher(own_pod=POD))  # adopt: patch the ownerReference

    assert {_rbac(r.method, r.path) for r in fake.requests} == set(API_CALLS)


def test_importing_the_launcher_does_not_import_kubernetes() -> None:
    code = "import sys, trainer.launch.trainjob; print('kubernetes' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"


@pytest.mark.parametrize("on_exit", ["keep", "suspend"])
def test_a_kept_or_suspended_trainjob_is_released_by_the_launcher_pod(
    launcher: Callable[..., TrainJobLauncher], fake: FakeKubeApi, on_exit: str
) -> None:
    # Seen on the cluster: KFP cancels by deleting the launcher pod, and the garbage collector
    # deleted the TrainJob the pod owned, suspended or not.
    fake.scenario = FAILED
    with pytest.raises(RuntimeError):
        launch(launcher(on_exit=on_exit, own_pod=POD))
    job = fake.trainjob(JOB)
    assert job is not None
    owners = job["metadata"].get("ownerReferences") or []
    assert all(o["uid"] != POD.uid for o in owners), owners
    assert bool(job["spec"].get("suspend")) is (on_exit == "suspend")
