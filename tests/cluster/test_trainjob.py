"""The train step's TrainJob path (``launcher=trainjob``) on a real cluster: the launcher runs in a
pod under the ``pipeline-runner`` account and our Role, in a namespace that enforces restricted Pod
Security, and Kubeflow Trainer v2 with JobSet (both built from upstream, in the cluster, with their
webhooks: hack/cluster/addons/{jobset,trainer}.sh) runs a 2-node TrainJob on the
``torch-distributed`` ClusterTrainingRuntime (gloo on CPU) of the trainer's image that reads and
writes the in-cluster object store.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster import kube, launchers
from tests.cluster.kube import GPUPIPE_RUNTIME, JOB_TIMEOUT_S, Launch, launch

KIND = "trainjob"
NODE = "node"
"""Trainer's replicated job and container in torch-distributed."""
"""hack/cluster/addons/trainer/: torch-distributed with the PyTorchJob path's failure semantics
(exit codes 1-127 fail at once; a lost node restarts the JobSet and training resumes)."""


def train_config(image: str, runtime: str = GPUPIPE_RUNTIME, **over: Any) -> dict[str, Any]:
    """The train step's config for a 2-node CPU TrainJob of the demo table on ``runtime``."""
    cfg = kube.train_config(image, KIND, **over)
    cfg["cluster"]["runtime"] = runtime
    return cfg


def node_pods(namespace: str, job: str, index: int | None = None) -> list[dict[str, Any]]:
    """The TrainJob's pods (JobSet's label), of one node when ``index`` is given, oldest first."""
    pods = kube.job_pods(namespace, job, KIND)
    if index is not None:
        pods = [
            p
            for p in pods
            if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index")
            == str(index)
        ]
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])


def node_pod(namespace: str, job: str, index: int) -> str | None:
    """The name of node ``index``'s newest pod that is not being deleted."""
    pods = node_pods(namespace, job, index)
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live[-1]["metadata"]["name"] if live else None


def node0_steps(namespace: str, job: str) -> int:
    pod = node_pod(namespace, job, 0)
    return kube.pod_steps(namespace, pod, NODE) if pod else 0


def trainjob(namespace: str, job: str) -> dict[str, Any]:
    return kube.get_json("trainjob", "-n", namespace, job)


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


TRAINJOB = launchers.JobKind(
    kind=KIND, title="TrainJob", lead="node 0", lead_steps=node0_steps, config=train_config
)


@pytest.fixture(scope="module")
def reference(namespace: str, image: str, dataset: str) -> Launch:
    """A 2-node TrainJob on upstream's torch-distributed (what the launcher names by default) run
    to the end, uninterrupted and kept: test 1, the weights the node-loss test matches, and the
    objects the runtime-patch test reads."""
    cfg = train_config(image, runtime="torch-distributed")
    cfg["cluster"]["on_exit"] = "keep"
    return launchers.run_to_the_end(namespace, image, dataset, cfg)


def test_two_node_trainjob_trains_streams_node_0s_log_and_stores_the_model(
    reference: Launch,
) -> None:
    # Node 0's JSON log lines (loss per step) reached the launcher's own log.
    launchers.check_trained_and_stored(reference)
    job = trainjob(reference.namespace, reference.job)
    complete = conditions(job)["Complete"]
    assert (complete["status"], complete["reason"]) == ("True", "AllJobsCompleted"), job["status"]


def test_bad_input_fails_the_step_with_the_workers_line_and_the_trainjobs_conditions(
    namespace: str, image: str, dataset: str
) -> None:
    run, log = launchers.launch_on_bad_input(TRAINJOB, namespace, image, dataset)
    # The TrainJob's conditions are in the message.
    assert f"TrainJob {namespace}/{run.job} failed" in log, log[-3000:]
    assert "conditions: " in log and "Failed=True" in log, log[-3000:]
    failed = conditions(trainjob(namespace, run.job))["Failed"]
    assert failed["status"] == "True"
    launchers.check_failed_once_and_delete(TRAINJOB, run)


def test_a_deleted_node_pod_restarts_the_jobset_and_training_resumes_to_the_same_weights(
    namespace: str, image: str, dataset: str, reference: Launch
) -> None:
    run = launch(namespace, image, dataset, train_config(image))
    kube.wait_until(
        "the job to pass its first checkpoint",
        lambda: node0_steps(namespace, run.job) >= 12,
        timeout=JOB_TIMEOUT_S,
        interval=2,
    )
    node1 = node_pod(namespace, run.job, 1)
    assert node1 is not None
    launchers.force_delete_pod(namespace, node1)
    log = launchers.finished(run)
    # gpupipe's runtime: the lost pod failed its Job (backoffLimit 0), and JobSet restarted every
    # node together (its failurePolicy), which resumed from the last checkpoint.
    jobset = kube.get_json("jobset", "-n", namespace, run.job)
    assert jobset["status"]["restarts"] >= 1, jobset["status"]
    pods = node_pods(namespace, run.job)
    assert all(p["metadata"]["labels"]["jobset.sigs.k8s.io/restart-attempt"] != "0" for p in pods)
    # gpupipe's runtime mounts no service-account token into training pods (no kube-api-access
    # volume): training code and model plugins never need one.
    for pod in pods:
        assert pod["spec"].get("automountServiceAccountToken") is False, pod["spec"]
        assert not any(v["name"].startswith("kube-api-access") for v in pod["spec"]["volumes"])
    launchers.check_resumed_to_the_reference(run, log, reference)


def test_deadline_deletes_the_trainjob_and_names_the_deadline(
    namespace: str, image: str, dataset: str
) -> None:
    launchers.check_deadline_deletes_the_job(TRAINJOB, namespace, image, dataset)


@pytest.mark.parametrize("on_exit", ["delete", "suspend"])
def test_sigterm_to_the_launcher_deletes_or_suspends_the_trainjob(
    namespace: str, image: str, dataset: str, on_exit: str
) -> None:
    cfg = train_config(image, train__epochs=500)
    cfg["cluster"]["on_exit"] = on_exit
    run = launch(namespace, image, dataset, cfg)
    launchers.sigterm_while_training(TRAINJOB, run)
    if on_exit == "delete":
        TRAINJOB.wait_gone(run)
        return
    # Suspended: the TrainJob stays with spec.suspend and Trainer's Suspended condition, and
    # JobSet removes the pods.
    kube.wait_until(
        f"TrainJob {run.job} to be suspended with no pod left",
        lambda: (
            trainjob(namespace, run.job)["spec"].get("suspend") is True
            and conditions(trainjob(namespace, run.job)).get("Suspended", {}).get("status")
            == "True"
            and not node_pods(namespace, run.job)
        ),
        120,
        interval=2,
    )
    TRAINJOB.delete(namespace, run.job)


def test_a_restarted_launcher_adopts_its_trainjob(namespace: str, image: str, dataset: str) -> None:
    launchers.check_a_restarted_launcher_adopts_its_job(TRAINJOB, namespace, image, dataset)


def test_the_runtime_patch_reaches_the_pods_and_they_pass_restricted(
    namespace: str, reference: Launch
) -> None:
    launchers.check_restricted_is_enforced_and_admitted(namespace, reference)
    # Both nodes of the reference TrainJob were admitted with the runtime patch merged in.
    job = trainjob(namespace, reference.job)
    # Ours, stamped by the defaulter; not the only one where Kueue is installed: its webhook adds
    # its own (manager kueue.x-k8s.io/manager) to every TrainJob, queued or not.
    (patch,) = [
        p for p in job["spec"]["runtimePatches"] if p.get("manager") == "gpupipe.dev/launcher"
    ]
    assert patch["time"], job["spec"]["runtimePatches"]
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Pod", reference.pod)
    pods = node_pods(namespace, reference.job)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in volumes.values())
        (node,) = [c for c in spec["containers"] if c["name"] == NODE]
        sc = node["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"] for m in node["volumeMounts"]}
        assert {"/dev/shm", "/tmp"} <= mounts, mounts
        env = {e["name"]: e for e in node["env"]}
        assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == kube.STORE_SECRET
        assert {"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR"} <= env.keys()
        assert node["resources"]["limits"]["cpu"] == kube.JOB_POD_SETTINGS["cpu_limit"]
        assert pod["metadata"]["annotations"].get("sidecar.istio.io/inject") == "false"
    TRAINJOB.delete(namespace, reference.job)
