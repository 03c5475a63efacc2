"""GPU nodes without GPUs (issue 64, hack/cluster/addons/gpu.sh): the GPU node reports the devices
of our device plugin (hack/cluster/gomod/fake-gpu) as allocatable ``nvidia.com/gpu``, carries a
cloud GPU node's labels and taint, and the scheduler and the kubelet treat a GPU pod for real: one
with the pipeline's toleration lands there and sees ``NVIDIA_VISIBLE_DEVICES`` naming a device
it holds; one asking more GPUs than the node has waits with the scheduler's ``Insufficient
nvidia.com/gpu``; one without the toleration is never placed there.

Skipped, saying so, where the cluster was brought up without the ``gpu`` add-on.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import kube
from tests.cluster.conftest import delete_namespace, namespace_doc
from trainer.launch.jobspec import GPU_TOLERATION

RESOURCE = "nvidia.com/gpu"
SETTINGS = kube.STATE / "addons" / "gpu" / "settings"


@pytest.fixture(scope="module")
def gpu() -> dict[str, Any]:
    """The GPU node as gpu.sh's install recorded it: its name, device count and product."""
    kube.need_addon("gpu")
    recorded = dict(line.split("=", 1) for line in SETTINGS.read_text().splitlines() if "=" in line)
    k = int(recorded["node"])
    name = kube.node_name(k)
    return {"name": name, "count": int(recorded["gpus"]), "product": recorded["product"]}


@pytest.fixture(scope="module")
def ns(gpu: dict[str, Any]) -> Iterator[str]:
    name = kube.unique("gpupipe-gpu")
    kube.apply(namespace_doc(name, {"pod-security.kubernetes.io/enforce": "restricted"}))
    yield name
    delete_namespace(name)


def _device_ids(node: str, count: int) -> list[str]:
    """The IDs the plugin advertises (fake-gpu's deviceID: sha256 of the node and the index)."""
    ids = []
    for i in range(count):
        h = hashlib.sha256(f"gpupipe-fake-gpu/{node}/{i}".encode()).hexdigest()[:32]
        ids.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return ids


def _pod(
    name: str,
    ns: str,
    *,
    gpus: int = 0,
    tolerate: bool = True,
    selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A restricted busybox pod that prints its GPU variables, asking ``gpus`` GPUs, with the
    pipeline's GPU toleration (``tolerate``) and node selector ``selector``."""
    limits: dict[str, str] = {"cpu": "50m", "memory": "32Mi"}
    if gpus:
        limits[RESOURCE] = str(gpus)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": kube.RESTRICTED_POD,
        "containers": [
            {
                "name": "main",
                "image": kube.BUSYBOX_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": [
                    "sh",
                    "-c",
                    'env | grep -E "^(NVIDIA_VISIBLE_DEVICES|GPUPIPE_FAKE_GPU)=" | sort; true',
                ],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": limits},
                "securityContext": kube.RESTRICTED_CONTAINER,
            }
        ],
    }
    if tolerate:
        spec["tolerations"] = [dict(GPU_TOLERATION)]
    if selector:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def _unschedulable(ns: str, name: str) -> str | None:
    """The scheduler's message on the pod while it is Pending and unschedulable, else None."""
    pod = kube.get_json("pod", "-n", ns, name)
    assert not pod["spec"].get("nodeName"), f"{ns}/{name} was placed on {pod['spec']['nodeName']}"
    for c in pod["status"].get("conditions", []):
        if (
            c["type"] == "PodScheduled"
            and c["status"] == "False"
            and c["reason"] == "Unschedulable"
        ):
            return str(c.get("message", ""))
    return None


def _tolerates(toleration: dict[str, str], taint: dict[str, str]) -> bool:
    """Kubernetes' rule for one toleration and one taint (its ToleratesTaint)."""
    if toleration.get("effect") and toleration["effect"] != taint["effect"]:
        return False
    if toleration.get("key") and toleration["key"] != taint["key"]:
        return False
    if toleration.get("operator", "Equal") == "Exists":
        return True
    return toleration.get("value", "") == taint.get("value", "")


def test_the_gpu_node_reports_its_devices_and_is_labelled_and_tainted_as_clouds_do(
    gpu: dict[str, Any],
) -> None:
    nodes = {n["metadata"]["name"]: n for n in kube.get_json("nodes")["items"]}
    node = nodes[gpu["name"]]
    assert node["status"]["allocatable"].get(RESOURCE) == str(gpu["count"]), node["status"]
    assert node["status"]["capacity"].get(RESOURCE) == str(gpu["count"]), node["status"]
    labels = node["metadata"]["labels"]
    assert labels.get("nvidia.com/gpu.present") == "true", labels
    assert labels.get("nvidia.com/gpu.product") == gpu["product"], labels
    assert labels.get("nvidia.com/gpu.count") == str(gpu["count"]), labels
    taints = [t for t in node["spec"].get("taints", []) if t["key"] == RESOURCE]
    assert taints == [{"key": RESOURCE, "value": "present", "effect": "NoSchedule"}], taints
    # The pipeline's GPU pods tolerate it (trainer/launch/jobspec.py GPU_TOLERATION).
    assert _tolerates(GPU_TOLERATION, taints[0]), (GPU_TOLERATION, taints[0])
    # No other node has GPUs.
    others = {
        name: n["status"]["allocatable"].get(RESOURCE, "0")
        for name, n in nodes.items()
        if name != gpu["name"]
    }
    assert set(others.values()) <= {"0"}, others


def test_a_pod_asking_one_gpu_with_the_toleration_lands_there_and_sees_its_device(
    gpu: dict[str, Any], ns: str
) -> None:
    # The node selector as the pipeline's gpu_node_selector would name the product.
    selector = {"nvidia.com/gpu.product": gpu["product"]}
    kube.apply(_pod("one-gpu", ns, gpus=1, selector=selector))
    done = kube.wait_pod_done(ns, "one-gpu", timeout=180)
    log = kube.logs(ns, "one-gpu")
    assert done["exitCode"] == 0, log
    pod = kube.get_json("pod", "-n", ns, "one-gpu")
    assert pod["spec"]["nodeName"] == gpu["name"], pod["spec"]
    env = dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
    assert env.get("GPUPIPE_FAKE_GPU") == "1", log
    assert env.get("NVIDIA_VISIBLE_DEVICES") in _device_ids(gpu["name"], gpu["count"]), log
    kube.kubectl("delete", "pod", "-n", ns, "one-gpu", "--wait=false", check=False)


def test_a_pod_asking_more_gpus_than_the_node_has_waits_with_the_schedulers_reason(
    gpu: dict[str, Any], ns: str
) -> None:
    kube.apply(_pod("too-many", ns, gpus=gpu["count"] + 1))
    message = kube.wait_until(
        "the scheduler's reason on too-many", lambda: _unschedulable(ns, "too-many"), 60
    )
    assert f"Insufficient {RESOURCE}" in message, message
    kube.kubectl("delete", "pod", "-n", ns, "too-many", "--wait=false", check=False)


@pytest.mark.parametrize(
    ("name", "gpus", "pinned"),
    [("gpu-no-toleration", 1, False), ("cpu-pinned-no-toleration", 0, True)],
    ids=["asking-a-gpu", "pinned-to-the-gpu-node"],
)
def test_a_pod_without_the_toleration_is_never_placed_on_the_gpu_node(
    gpu: dict[str, Any], ns: str, name: str, gpus: int, pinned: bool
) -> None:
    """Asking a GPU (only the GPU node has them) or pinned to the GPU node by its hostname: the
    taint keeps it off, and the scheduler says so (Kubernetes 1.34 says "untolerated taint(s)"
    without naming the taint: the GPU node's only taint must be nvidia.com/gpu's)."""
    taints = kube.get_json("node", gpu["name"])["spec"].get("taints", [])
    assert [t["key"] for t in taints] == [RESOURCE], taints
    selector = {"kubernetes.io/hostname": gpu["name"]} if pinned else None
    kube.apply(_pod(name, ns, gpus=gpus, tolerate=False, selector=selector))
    message = kube.wait_until(
        f"the scheduler's reason on {name}", lambda: _unschedulable(ns, name), 60
    )
    assert "untolerated taint" in message, message
    kube.kubectl("delete", "pod", "-n", ns, name, "--wait=false", check=False)


def _gpu_job_config(image: str, kind: str, gpu: dict[str, Any], **env: str) -> dict[str, Any]:
    """The 2-node job with one GPU a worker, on the GPU nodes' product (the pipeline's
    gpu_node_selector), the job's env ``env`` (job_env)."""
    cfg = kube.train_config(
        image,
        kind,
        gpus_per_node=1,
        train__epochs=2,
        cluster__node_selector={"nvidia.com/gpu.product": gpu["product"]},
    )
    cfg["cluster"]["env"] = dict(env)
    if kind == "trainjob":
        cfg["cluster"]["runtime"] = kube.GPUPIPE_RUNTIME
    return cfg


@pytest.mark.ci_allowance(600)
# ids without "pytorchjob": .ci/run's stage 1 (-k pytorchjob) runs before the gpu add-on is in.
@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"], ids=["operator-job", "trainer-job"])
def test_gpu_workers_land_on_the_gpu_node_and_hold_a_device_each(
    gpu: dict[str, Any], namespace: str, image: str, dataset: str, kind: str
) -> None:
    """Issue 64 item 2: a PyTorchJob's and a TrainJob's GPU workers (gpus_per_node=1, the GPU
    node's product as node selector) are scheduled onto the GPU node, one device each, while the
    launcher (no GPU, no toleration) is not. The devices are the plugin's, with no CUDA: the job
    says so with GPUPIPE_ALLOW_NO_CUDA=1 (job_env) and trains on the CPU."""
    run = kube.launch(
        namespace, image, dataset, _gpu_job_config(image, kind, gpu, GPUPIPE_ALLOW_NO_CUDA="1")
    )
    placed: dict[str, tuple[str, str]] = {}

    def done() -> bool:
        for pod in kube.job_pods(namespace, run.job, kind):
            node = pod["spec"].get("nodeName")
            (main,) = [c for c in pod["spec"]["containers"] if c["name"] == run.container]
            if node:
                placed[pod["metadata"]["name"]] = (node, main["resources"]["limits"].get(RESOURCE))
        return kube.pod_phase(namespace, run.pod) in ("Succeeded", "Failed")

    kube.wait_until("the GPU job's launcher to finish", done, kube.JOB_TIMEOUT_S, interval=2)
    log = run.log()
    assert run.done()["exitCode"] == 0, log[-3000:]
    assert len(placed) >= 2 and set(placed.values()) == {(gpu["name"], "1")}, placed
    launcher = kube.get_json("pod", "-n", namespace, run.pod)
    assert launcher["spec"]["nodeName"] != gpu["name"], launcher["spec"]["nodeName"]
    assert "holds 1 GPU(s) but torch finds no CUDA device: training on the CPU" in log, log[-3000:]


@pytest.mark.ci_allowance(600)
def test_a_gpu_worker_that_finds_no_cuda_fails_the_step_in_one_line(
    gpu: dict[str, Any], namespace: str, image: str, dataset: str
) -> None:
    """The same job without the setting: each worker holds a device and torch finds no CUDA, so
    it refuses to train on the CPU: the step ends with the worker's E_NO_CUDA line, exit 2 (no
    retry: the same node would give the same answer), and the job is deleted."""
    cfg = _gpu_job_config(image, "pytorchjob", gpu)
    run = kube.launch(namespace, image, dataset, cfg)
    done = run.done()
    log = run.log()
    assert done["exitCode"] == 2, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith("ERROR [train] E_NO_CUDA: this pod holds 1 GPU(s)"), last
    assert "NVIDIA_VISIBLE_DEVICES=GPU-" in last, last
    kube.wait_until(f"job {run.job} to be deleted", lambda: kube.job_gone(namespace, run.job), 180)
