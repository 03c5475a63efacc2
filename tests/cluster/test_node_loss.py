"""A node lost mid-training (issue 63 items 5 and 7): a 2-node job, one worker per node, trains
with a checkpoint every 5 steps; node 2 loses its power (hack/cluster-node.sh stop: its link
down, its kubelet, containerd and every container killed). The node goes NotReady, its pod is
evicted (30 s tolerations on a multi-node test cluster), and:

- the node comes back: its kubelet confirms the evicted pod's end; a PyTorchJob's Training
  Operator creates the replacement (the same name: it waits for the old pod's end), a TrainJob's
  JobSet restarts (new pods, wherever they fit: node 2 back, or the spare); training resumes from
  the last checkpoint and ends with the uninterrupted run's weights, bit for bit;
- a third node takes its place (three nodes only): the lost node is marked out-of-service (the
  non-graceful node shutdown of Kubernetes, what a platform's node remediation does), its pod is
  deleted, the replacement lands on the spare node, and the weights are the same.

- its network cut instead, its processes alive (a partition): the worker cut off cannot reach
  its peer, the other's collective times out (``dist.timeout_s``), the job restarts and resumes
  when the network is back, and the cut-off pod writes nothing: the checkpoints' attempt records
  (the fence) name the new attempt last, and the job ends with the uninterrupted run's weights.

Each stage's time since the loss is printed (NotReady, evicted, replaced, resumed): what a node
failure costs, in test time. Skipped on a one-node cluster (make cluster-up NODES=2, or 3).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import kube, launchers
from tests.cluster.kube import GPUPIPE_RUNTIME, JOB_TIMEOUT_S, Launch, launch
from trainer.base import storage

NODE_SCRIPT = kube.ROOT / "hack" / "cluster-node.sh"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


LOST = kube.node_name(2)


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


def _needs_a_spare() -> None:
    if len(_node_names()) < 3:
        pytest.skip("needs a spare node: make cluster-up NODES=3 (make test-cluster's count)")


@pytest.fixture
def nodes_back() -> Iterator[None]:
    """Whatever the test did to nodes 2.., they are powered, linked, Ready, in service and
    schedulable again afterwards."""
    yield
    for k in range(2, len(_node_names()) + 1):
        subprocess.run([str(NODE_SCRIPT), "heal", str(k)], check=False, timeout=60)
        if _ready(kube.node_name(k)) != "True":
            subprocess.run([str(NODE_SCRIPT), "start", str(k)], check=False, timeout=300)
    for name in _node_names():
        kube.kubectl("taint", "node", name, "node.kubernetes.io/out-of-service-", check=False)
        kube.kubectl("uncordon", name, check=False)


def _node(cmd: str, k: int = 2) -> None:
    subprocess.run([str(NODE_SCRIPT), cmd, str(k)], check=True, timeout=300)


KINDS = ("pytorchjob", "trainjob")
_references: dict[str, Launch] = {}


def _config(image: str, kind: str, **over: Any) -> dict[str, Any]:
    """The 2-node job of kube.train_config, a TrainJob on the test cluster's own runtime (a
    lost node restarts its JobSet: hack/cluster/addons/trainer/)."""
    cfg = kube.train_config(image, kind, **over)
    if kind == "trainjob":
        cfg["cluster"]["runtime"] = GPUPIPE_RUNTIME
    return cfg


def _reference(namespace: str, image: str, dataset: str, kind: str) -> Launch:
    """The same job, uninterrupted, wherever its workers land (placement does not change the
    weights: tests/cluster/test_nodes.py); once per kind and module."""
    if kind not in _references:
        _references[kind] = launchers.run_to_the_end(
            namespace, image, dataset, _config(image, kind)
        )
    return _references[kind]


def _pods(run: Launch) -> list[dict[str, Any]]:
    return kube.job_pods(run.namespace, run.job, run.kind)


def _on_node(run: Launch, name: str) -> dict[str, Any] | None:
    return next((p for p in _pods(run) if p["spec"].get("nodeName") == name), None)


def _lead(run: Launch) -> str | None:
    """The pod whose log counts the steps: the master, or the TrainJob's newest node-0 pod."""
    if run.kind == "pytorchjob":
        return f"{run.job}-master-0"
    live = [
        p
        for p in _pods(run)
        if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "0"
        and not p["metadata"].get("deletionTimestamp")
    ]
    live.sort(key=lambda p: p["metadata"]["creationTimestamp"])
    return live[-1]["metadata"]["name"] if live else None


def _lead_steps(run: Launch) -> int:
    pod = _lead(run)
    return kube.pod_steps(run.namespace, pod, run.container) if pod else 0


def _lose_node_mid_training(
    run: Launch, how: str = "stop", k: int = 2
) -> tuple[set[str], float, dict[str, float]]:
    """Wait for the job to pass a checkpoint with a pod on node K, then lose node K (``how``:
    hack/cluster-node.sh's ``stop``, its power, or ``cut``, its network); wait for NotReady and
    the eviction. The uids of the job's pods before the loss, its time, the stages."""
    name = kube.node_name(k)
    kube.wait_until(
        f"the job to pass its first checkpoints with a pod on {name}",
        lambda: _on_node(run, name) is not None and _lead_steps(run) >= 12,
        timeout=JOB_TIMEOUT_S,
        interval=2,
    )
    lost = _on_node(run, name)
    assert lost is not None
    lead = _lead(run)
    assert lead and '"event": "done"' not in kube.logs(run.namespace, lead, run.container)
    before = {p["metadata"]["uid"] for p in _pods(run)}
    t0 = time.monotonic()
    _node(how, k)
    stages: dict[str, float] = {}
    kube.wait_until(f"{name} to be NotReady", lambda: _ready(name) != "True", 180, interval=1)
    stages["NotReady"] = time.monotonic() - t0
    print(f"node loss: {stages}", flush=True)
    pod = lost["metadata"]["name"]

    def evicted() -> bool:
        found = kube.get_json("pod", "-n", run.namespace, pod)
        return bool(found["metadata"].get("deletionTimestamp"))

    kube.wait_until(f"pod {pod} to be evicted", evicted, 180, interval=1)
    stages["evicted"] = time.monotonic() - t0
    print(f"node loss: {stages}", flush=True)
    return before, t0, stages


def _launch(
    namespace: str, image: str, dataset: str, kind: str, on: tuple[int, int] = (1, 2), **over: Any
) -> Launch:
    """The job, one worker per node, on the two nodes ``on`` (every other node cordoned until
    both workers are placed: a spare must be free for the replacement); its launcher (the train
    step's pod) on node 1, which this test keeps: a lost step pod is KFP's retry
    (tests/cluster/test_kfp.py), not this test's."""
    others = [n for n in _node_names() if n not in {kube.node_name(k) for k in on}]
    for node in others:
        kube.kubectl("cordon", node)
    try:
        cfg = _config(image, kind, cluster__one_worker_per_node=True, **over)
        run = launch(namespace, image, dataset, cfg, node=kube.NODE_NAME)
        kube.wait_until(
            f"both workers placed on nodes {on[0]} and {on[1]}",
            lambda: len([p for p in _pods(run) if p["spec"].get("nodeName")]) >= 2,
            JOB_TIMEOUT_S,
            interval=1,
        )
    finally:
        for node in others:
            kube.kubectl("uncordon", node)
    return run


def _replaced_and_finished(
    run: Launch, before: set[str], t0: float, stages: dict[str, float]
) -> tuple[set[str], str]:
    """Wait for a replacement pod (a uid the job did not have before the loss) on a node, then
    for the launcher. The nodes the job's new pods are on, and the launcher's log."""

    def replaced() -> bool:
        return any(
            p["metadata"]["uid"] not in before
            and p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            for p in _pods(run)
        )

    kube.wait_until("the lost pod's replacement to be placed", replaced, JOB_TIMEOUT_S, interval=1)
    stages["replaced"] = time.monotonic() - t0
    print(f"node loss: {stages}", flush=True)
    nodes = {
        p["spec"]["nodeName"]
        for p in _pods(run)
        if p["spec"].get("nodeName") and p["metadata"]["uid"] not in before
    }
    log = launchers.finished(run)
    stages["finished"] = time.monotonic() - t0
    print(f"node loss, seconds after the node went: {stages}")
    return nodes, log


@pytest.mark.timeout(2400)
@pytest.mark.ci_allowance(1200)
@pytest.mark.parametrize("kind", KINDS)
def test_a_lost_node_back_takes_its_replica_again_and_the_job_resumes_to_the_same_weights(
    namespace: str, image: str, dataset: str, nodes_back: None, kind: str
) -> None:
    reference = _reference(namespace, image, dataset, kind)
    run = _launch(namespace, image, dataset, kind)
    before, t0, stages = _lose_node_mid_training(run)
    _node("start")
    stages["node back"] = time.monotonic() - t0
    _, log = _replaced_and_finished(run, before, t0, stages)
    launchers.check_resumed_to_the_reference(run, log, reference)


@pytest.mark.timeout(2400)
@pytest.mark.ci_allowance(1200)
def test_a_lost_node_marked_out_of_service_gives_its_replica_to_a_spare_node(
    namespace: str, image: str, dataset: str, nodes_back: None
) -> None:
    _needs_a_spare()
    reference = _reference(namespace, image, dataset, "pytorchjob")
    run = _launch(namespace, image, dataset, "pytorchjob")
    before, t0, stages = _lose_node_mid_training(run)
    kube.kubectl("taint", "node", LOST, OUT_OF_SERVICE)
    nodes, log = _replaced_and_finished(run, before, t0, stages)
    assert kube.node_name(3) in nodes, nodes
    launchers.check_resumed_to_the_reference(run, log, reference)


@pytest.mark.timeout(1800)
@pytest.mark.ci_allowance(900)
def test_a_lost_node_with_none_to_take_its_place_fails_the_step_in_its_deadline_naming_why(
    namespace: str, image: str, dataset: str, nodes_back: None
) -> None:
    """Node 2 lost and marked out-of-service, no spare (further nodes cordoned): the replacement
    cannot be placed (one worker per node). The step fails at its deadline in one line that
    names the pod and the scheduler's reason, and deletes its job: nothing is left running."""
    spares = [n for n in _node_names() if n not in (kube.NODE_NAME, LOST)]
    run = _launch(namespace, image, dataset, "pytorchjob", timeout_s=330)
    for node in spares:
        kube.kubectl("cordon", node)
    try:
        _lose_node_mid_training(run)
        kube.kubectl("taint", "node", LOST, OUT_OF_SERVICE)
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


def _attempts(run: Launch) -> list[dict[str, Any]]:
    """The checkpoints' attempt records (the fence), oldest first."""
    folder = f"{run.base}/work/checkpoints/attempts"
    names = sorted(n for n in storage.list_dir(folder) if n.endswith(".json"))
    return [storage.read_json(f"{folder}/{n}") for n in names]


def _gave_up(run: Launch, pod: str, uid: str) -> bool:
    """Whether the pod's training container ended in failure: with ``restartPolicy: ExitCode``
    the operator replaces a pod whose container exits retryable (a new uid, or none a moment)."""
    found = kube.kubectl("get", "pod", "-n", run.namespace, pod, "-o", "json", check=False)
    if found.returncode != 0:
        return True
    now = json.loads(found.stdout)
    if now["metadata"]["uid"] != uid:
        return True
    for cs in now["status"].get("containerStatuses", []):
        for state in (cs.get("lastState") or {}, cs.get("state") or {}):
            if state.get("terminated", {}).get("exitCode", 0) != 0:
                return True
    return False


@pytest.mark.timeout(2400)
@pytest.mark.ci_allowance(1200)
def test_a_partitioned_node_does_not_hang_the_job_and_its_stale_master_writes_nothing(
    namespace: str, image: str, dataset: str, nodes_back: None
) -> None:
    """Item 7: the job's master on node 2, its worker on node 3 (node 1, the control plane's,
    cordoned while they are placed); node 2's network cut, its processes left running. The
    worker's collective with the cut-off master times out (``dist.timeout_s``: 60 s here) and
    it exits to be restarted, while node 2 is still cut: the job does not hang. When the network
    is back, the kubelet ends the evicted master, a new one resumes from the last checkpoint,
    and the job ends with the uninterrupted run's weights. The old master, alive through the
    cut, never took the checkpoints back: the attempt records end with the new attempt's."""
    _needs_a_spare()
    reference = _reference(namespace, image, dataset, "pytorchjob")
    run = _launch(namespace, image, dataset, "pytorchjob", on=(2, 3), dist__timeout_s=60)
    master = f"{run.job}-master-0"
    kube.wait_until(
        "the workers on nodes 2 and 3",
        lambda: (
            _on_node(run, kube.node_name(2)) is not None
            and _on_node(run, kube.node_name(3)) is not None
        ),
        JOB_TIMEOUT_S,
        interval=1,
    )
    k = (
        2
        if (_on_node(run, kube.node_name(2)) or {}).get("metadata", {}).get("name") == master
        else 3
    )
    worker = f"{run.job}-worker-0"
    worker_uid = kube.get_json("pod", "-n", namespace, worker)["metadata"]["uid"]
    before, t0, stages = _lose_node_mid_training(run, "cut", k)
    generations = [a["generation"] for a in _attempts(run)]
    kube.wait_until(
        "the worker's collective with the cut-off master to time out (it exits, retryable)",
        lambda: _gave_up(run, worker, worker_uid),
        180,
        interval=2,
    )
    stages["worker out"] = time.monotonic() - t0
    assert _ready(kube.node_name(k)) != "True", "the network came back before the worker gave up"
    _node("heal", k)
    stages["network back"] = time.monotonic() - t0
    _, log = _replaced_and_finished(run, before, t0, stages)
    launchers.check_resumed_to_the_reference(run, log, reference)
    attempts = _attempts(run)
    print(f"attempts: {json.dumps(attempts)}")
    newest = attempts[-1]["generation"]
    assert newest > max(generations), (generations, attempts)
    # The newest attempt, the fence every save checks, is the master that finished (the
    # replacement): no process of the old one, alive through the cut, took the checkpoints after.
    # (The launcher's log streams the master's: the old one's, then the new one's.)
    taken = [int(g) for g in re.findall(r"checkpoint attempt (\d+) writes", log)]
    assert taken and taken[-1] == newest, (taken, attempts)
