"""A node lost mid-training (issue 63 item 5): a 2-node PyTorchJob, one worker per node, trains
with a checkpoint every 5 steps; node 2 loses its power (hack/cluster-node.sh stop: its link
down, its kubelet, containerd and every container killed). The node goes NotReady, its pod is
evicted (30 s tolerations on a multi-node test cluster), and:

- the node comes back: its kubelet confirms the evicted pod's end, the Training Operator creates
  the replacement, which lands on the node again (one worker per node), training resumes from the
  last checkpoint and ends with the uninterrupted run's weights, bit for bit;
- a third node takes its place (three nodes only): the lost node is marked out-of-service (the
  non-graceful node shutdown of Kubernetes, what a platform's node remediation does), its pod is
  deleted, the replacement lands on the spare node, and the weights are the same.

Each stage's time since the loss is printed (NotReady, evicted, replaced, resumed): what a node
failure costs, in test time. Skipped on a one-node cluster (make cluster-up NODES=2, or 3).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import kube, launchers
from tests.cluster.kube import JOB_TIMEOUT_S, Launch, launch

LOST = f"{kube.NODE_NAME}-2"
NODE_SCRIPT = kube.ROOT / "hack" / "cluster-node.sh"


def _node_names() -> list[str]:
    return sorted(n["metadata"]["name"] for n in kube.get_json("nodes")["items"])


def _ready(name: str) -> str:
    node = kube.get_json("node", name)
    return next(
        (c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"), "Unknown"
    )


@pytest.fixture(scope="module", autouse=True)
def _two_nodes() -> None:
    names = _node_names()
    if len(names) < 2:
        pytest.skip(f"the test cluster has one node ({names[0]}): make cluster-up NODES=2")


@pytest.fixture
def node_back() -> Iterator[None]:
    """Whatever the test did to node 2, it is powered and Ready again afterwards."""
    yield
    subprocess.run([str(NODE_SCRIPT), "start", "2"], check=False, timeout=300)
    kube.kubectl("taint", "node", LOST, "node.kubernetes.io/out-of-service-", check=False)


def _node(cmd: str) -> None:
    subprocess.run([str(NODE_SCRIPT), cmd, "2"], check=True, timeout=300)


@pytest.fixture(scope="module")
def reference(namespace: str, image: str, dataset: str) -> Launch:
    """The same job, uninterrupted, wherever its workers land (placement does not change the
    weights: tests/cluster/test_nodes.py)."""
    return launchers.run_to_the_end(
        namespace, image, dataset, kube.train_config(image, "pytorchjob")
    )


def _pods(run: Launch) -> list[dict[str, Any]]:
    return kube.job_pods(run.namespace, run.job)


def _on_lost_node(run: Launch) -> dict[str, Any] | None:
    return next((p for p in _pods(run) if p["spec"].get("nodeName") == LOST), None)


def _lead_steps(run: Launch) -> int:
    return kube.pod_steps(run.namespace, f"{run.job}-master-0", "pytorch")


def _lose_node_mid_training(run: Launch) -> tuple[str, float, dict[str, float]]:
    """Wait for the job to pass a checkpoint with a pod on node 2, then stop node 2; wait for
    NotReady and the eviction. The lost pod's uid, the time of the loss, the stages."""
    kube.wait_until(
        "the job to pass its first checkpoints with a pod on node 2",
        lambda: _on_lost_node(run) is not None and _lead_steps(run) >= 12,
        timeout=JOB_TIMEOUT_S,
        interval=2,
    )
    lost = _on_lost_node(run)
    assert lost is not None
    assert '"event": "done"' not in kube.logs(run.namespace, f"{run.job}-master-0", "pytorch")
    t0 = time.monotonic()
    _node("stop")
    stages: dict[str, float] = {}
    kube.wait_until(f"{LOST} to be NotReady", lambda: _ready(LOST) != "True", 180, interval=1)
    stages["NotReady"] = time.monotonic() - t0
    print(f"node loss: {stages}", flush=True)
    name = lost["metadata"]["name"]

    def evicted() -> bool:
        pod = kube.get_json("pod", "-n", run.namespace, name)
        return bool(pod["metadata"].get("deletionTimestamp"))

    kube.wait_until(f"pod {name} to be evicted", evicted, 180, interval=1)
    stages["evicted"] = time.monotonic() - t0
    print(f"node loss: {stages}", flush=True)
    return f"{name}/{lost['metadata']['uid']}", t0, stages


def _launch(namespace: str, image: str, dataset: str, **over: Any) -> Launch:
    """The job, one worker per node, on nodes 1 and 2 (any further node cordoned until both
    workers are placed: the spare must be free for the replacement); its launcher (the train
    step's pod) on node 1, which this test keeps: a lost step pod is KFP's retry
    (tests/cluster/test_kfp.py), not this test's."""
    spares = [n for n in _node_names() if n not in (kube.NODE_NAME, LOST)]
    for node in spares:
        kube.kubectl("cordon", node)
    try:
        cfg = kube.train_config(image, "pytorchjob", cluster__one_worker_per_node=True, **over)
        run = launch(namespace, image, dataset, cfg, node=kube.NODE_NAME)
        kube.wait_until(
            "both workers placed on nodes 1 and 2",
            lambda: len([p for p in _pods(run) if p["spec"].get("nodeName")]) >= 2,
            JOB_TIMEOUT_S,
            interval=1,
        )
    finally:
        for node in spares:
            kube.kubectl("uncordon", node)
    return run


def _replaced_and_finished(
    run: Launch, lost_uid: str, t0: float, stages: dict[str, float]
) -> tuple[set[str], str]:
    """Wait for a replacement pod (a new uid) on a node, then for the launcher. The nodes the
    job's pods are on, and the launcher's log."""

    name, uid = lost_uid.split("/")

    def replaced() -> bool:
        return any(
            p["metadata"]["name"] == name
            and p["metadata"]["uid"] != uid
            and p["spec"].get("nodeName")
            for p in _pods(run)
        )

    kube.wait_until("the lost pod's replacement to be placed", replaced, JOB_TIMEOUT_S, interval=1)
    stages["replaced"] = time.monotonic() - t0
    print(f"node loss: {stages}", flush=True)
    nodes = {p["spec"]["nodeName"] for p in _pods(run) if p["spec"].get("nodeName")}
    log = launchers.finished(run)
    stages["finished"] = time.monotonic() - t0
    print(f"node loss, seconds after the power went: {stages}")
    return nodes, log


@pytest.mark.timeout(1800)
@pytest.mark.ci_allowance(1200)
def test_a_lost_node_back_takes_its_replica_again_and_the_job_resumes_to_the_same_weights(
    namespace: str, image: str, dataset: str, reference: Launch, node_back: None
) -> None:
    run = _launch(namespace, image, dataset)
    lost_uid, t0, stages = _lose_node_mid_training(run)
    _node("start")
    stages["node back"] = time.monotonic() - t0
    _, log = _replaced_and_finished(run, lost_uid, t0, stages)
    launchers.check_resumed_to_the_reference(run, log, reference)


@pytest.mark.timeout(1800)
@pytest.mark.ci_allowance(1200)
def test_a_lost_node_marked_out_of_service_gives_its_replica_to_a_spare_node(
    namespace: str, image: str, dataset: str, reference: Launch, node_back: None
) -> None:
    if len(_node_names()) < 3:
        pytest.skip("needs a spare node: make cluster-up NODES=3")
    run = _launch(namespace, image, dataset)
    lost_uid, t0, stages = _lose_node_mid_training(run)
    kube.kubectl("taint", "node", LOST, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")
    nodes, log = _replaced_and_finished(run, lost_uid, t0, stages)
    assert f"{kube.NODE_NAME}-3" in nodes, nodes
    launchers.check_resumed_to_the_reference(run, log, reference)


@pytest.mark.timeout(1800)
@pytest.mark.ci_allowance(900)
def test_a_lost_node_with_none_to_take_its_place_fails_the_step_in_its_deadline_naming_why(
    namespace: str, image: str, dataset: str, node_back: None
) -> None:
    """Node 2 lost and marked out-of-service, no spare (further nodes cordoned): the replacement
    cannot be placed (one worker per node). The step fails at its deadline in one line that
    names the pod and the scheduler's reason, and deletes its job: nothing is left running."""
    spares = [n for n in _node_names() if n not in (kube.NODE_NAME, LOST)]
    run = _launch(namespace, image, dataset, timeout_s=420)
    for node in spares:
        kube.kubectl("cordon", node)
    try:
        _lose_node_mid_training(run)
        kube.kubectl(
            "taint", "node", LOST, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
        )
        done = run.done()
    finally:
        for node in spares:
            kube.kubectl("uncordon", node)
    log = run.log()
    assert done["exitCode"] != 0, log[-3000:]
    final = [line for line in log.splitlines() if "train.timeout_s" in line]
    assert final, log[-3000:]
    assert re.search(
        rf"its pod {run.job}-(master|worker)-0 unscheduled: 0/\d+ nodes are available: .*"
        r"(anti-affinity|untolerated taint)",
        final[-1],
    ), final[-1]
    kube.wait_until(
        f"job {run.job} and its pods to be deleted",
        lambda: kube.job_gone(namespace, run.job),
        180,
    )
