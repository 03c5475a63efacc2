"""Gang admission with Kueue (issue 64 items 4-6, hack/cluster/addons/kueue.sh): the train step's
launcher, under the runner's Role, creates its job with `gang_queue`; Kueue (built from upstream,
in the cluster) admits a job only when all of its pods fit the ClusterQueue's quota.

Each test's queue has room for three of the test jobs' pods (a quarter CPU each): a 2-pod job
fits, a second waits whole (no pod of it exists) until the first is done, and a 4-pod job never
fits. Skipped, saying so, where the cluster was brought up without the ``kueue`` add-on.

The deadlock a queue prevents is reproduced first, without Kueue (it runs on every cluster): on
a node with room for two job pods (two of a made-up extended resource), two 2-pod jobs each hold
one pod and neither trains; then the same two jobs through a queue with that room as its quota.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.cluster import kube
from tests.cluster.kube import launch

QUEUE = "gpupipe"
ROOM_PODS = 3
"""The quota: room for this many of the jobs' pods (JOB_POD_SETTINGS' requests)."""


@pytest.fixture(scope="module")
def queue(namespace: str) -> Iterator[str]:
    """A ClusterQueue with room for ROOM_PODS job pods and the LocalQueue ``gpupipe`` in the
    test's namespace (manifests/kueue's shapes, the add-on's ResourceFlavor)."""
    with kube.kueue_queue(namespace, QUEUE, kube.pods_quota(ROOM_PODS)) as name:
        yield name


def _config(image: str, kind: str, **over: Any) -> dict[str, Any]:
    cfg = kube.train_config(image, kind, train__epochs=2, **over)
    cfg["cluster"]["gang_queue"] = QUEUE
    if kind == "trainjob":
        cfg["cluster"]["runtime"] = kube.GPUPIPE_RUNTIME
    return cfg


@pytest.mark.ci_allowance(600)
def test_two_jobs_with_room_for_three_pods_run_one_whole_after_the_other(
    queue: str, namespace: str, image: str, dataset: str
) -> None:
    """Issue 64 item 6: without a queue, two 2-pod jobs where three pods fit can each hold one
    pod and wait for ever at the rendezvous. With one, the first is admitted whole; the second
    waits whole (none of its pods exists) and its step says where, then runs; both finish."""
    first = launch(namespace, image, dataset, _config(image, "pytorchjob"))
    kube.wait_until(
        f"job {first.job}'s pods", lambda: len(kube.job_pods(namespace, first.job)) == 2, 180
    )
    second = launch(namespace, image, dataset, _config(image, "pytorchjob"))
    overlap: list[str] = []
    done = threading.Event()

    def first_succeeded() -> bool:
        job = kube.get_json("pytorchjob", "-n", namespace, first.job)
        conditions = (job.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Succeeded" and c["status"] == "True" for c in conditions)

    def watch() -> None:  # no pod of the second while the first runs: whole jobs only
        while not done.is_set():
            pods = kube.job_pods(namespace, second.job)
            if pods and not first_succeeded():
                overlap.append(", ".join(sorted(p["metadata"]["name"] for p in pods)))
            if pods:
                return
            time.sleep(2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        for run in (first, second):
            exit_state = run.done()
            assert exit_state["exitCode"] == 0, run.log()[-3000:]
    finally:
        done.set()
        watcher.join(30)
    assert overlap == [], f"the second job had pods while the first ran: {overlap}"
    log = second.log()
    assert f"waiting for admission in queue {queue} (position 1): " in log, log[-3000:]
    assert "insufficient unused quota for " in log, log[-3000:]
    assert f"admitted by queue {queue}" in log, log[-3000:]


@pytest.mark.parametrize("kind", ["pytorchjob", "trainjob"], ids=["operator-job", "trainer-job"])
def test_a_job_larger_than_its_queue_fails_at_once_in_one_line_and_is_deleted(
    queue: str, namespace: str, image: str, dataset: str, kind: str
) -> None:
    """4 pods where the queue has room for 3: Kueue says `> maximum capacity`, and the step
    fails in one line (exit 2) instead of waiting for its deadline; the job is deleted."""
    run = launch(namespace, image, dataset, _config(image, kind, nnodes=4))
    exit_state = run.done(timeout=300)
    log = run.log()
    assert exit_state["exitCode"] == 2, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith("ERROR [train] E_QUEUE_REFUSED: Kueue can never admit "), last
    assert f"in queue {queue}: " in last and "> maximum capacity" in last, last
    assert last.endswith("(train.cluster.gang_queue)"), last
    kube.wait_until(
        f"{kind} {run.job} to be deleted", lambda: kube.job_gone(namespace, run.job, kind), 120
    )


SLOT = "gpupipe.test/slot"
"""A made-up extended resource the node advertises two of: room for exactly two job pods that
ask one each, whatever else the node runs (its CPU is shared with make test in CI)."""
HOLD = "gpupipe.test/hold"


@pytest.fixture
def two_slots() -> Iterator[str]:
    with kube.extended_resource(kube.NODE_NAME, SLOT, 2) as name:
        yield name


def _slot_config(image: str, **cluster: Any) -> dict[str, Any]:
    """A 2-pod PyTorchJob whose pods ask one slot each as their GPU (``gpu_resource``), training
    on the CPU as the job's env allows (``GPUPIPE_ALLOW_NO_CUDA``)."""
    cfg = kube.train_config(image, "pytorchjob", train__epochs=2, gpus_per_node=1)
    cfg["cluster"] |= {"gpu_resource": SLOT, "env": {"GPUPIPE_ALLOW_NO_CUDA": "1"}, **cluster}
    return cfg


def _held_job(namespace: str, dataset: str, settings: dict[str, Any], name: str) -> dict[str, Any]:
    """The PyTorchJob the train step's launcher would create for ``settings`` (its own builder,
    its worker config in the store), each pod held by a scheduling gate until the test lets it
    be scheduled."""
    from trainer.base import storage
    from trainer.base.typedconfig import from_dict, to_json
    from trainer.launch.jobspec import JobSpec
    from trainer.launch.pytorchjob import build_pytorchjob
    from trainer.steps.train import TrainStepConfig, plan_worker_config, record_fixed

    settings = {**settings, "cluster": {**settings["cluster"], "namespace": namespace}}
    cfg = from_dict(TrainStepConfig, record_fixed(settings))
    base = f"minio://{kube.BUCKET}/{namespace}/{name}"
    worker, _ = plan_worker_config(
        cfg, dataset_uri=dataset, model_uri=f"{base}/model", work_uri=f"{base}/work"
    )
    config_uri = f"{base}/work/worker-config.json"
    storage.write_text(config_uri, to_json(worker))
    run = cfg.training_run(job_name=name, config_uri=config_uri)
    job = build_pytorchjob(JobSpec(namespace=namespace, run=run, cluster=cfg.cluster))
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        replica["template"]["spec"]["schedulingGates"] = [{"name": HOLD}]
    return job


def _release(namespace: str, job: str, replica: str) -> str:
    """Let the job's ``replica`` pod be scheduled (its gate removed); its name."""
    (pod,) = [
        p["metadata"]["name"]
        for p in kube.job_pods(namespace, job)
        if p["metadata"]["labels"].get("training.kubeflow.org/replica-type") == replica
    ]
    gates = json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}])
    kube.kubectl("patch", "pod", "-n", namespace, pod, "--type=json", "-p", gates)
    return pod


def _unschedulable(namespace: str, pod: str) -> str:
    """The scheduler's message where it found no room for ``pod`` (empty otherwise)."""
    conditions = kube.get_json("pod", "-n", namespace, pod)["status"].get("conditions") or []
    return next(
        (
            c.get("message", "")
            for c in conditions
            if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
        ),
        "",
    )


@pytest.mark.ci_allowance(300)
def test_without_a_queue_two_jobs_each_hold_one_of_two_slots_and_neither_trains(
    two_slots: str, namespace: str, image: str, dataset: str
) -> None:
    """Issue 64 item 6, the deadlock first, without Kueue: room for two pods, two 2-pod jobs.
    The interleaving a loaded scheduler made in CI (each job's first pod placed before either's
    second) is forced here: the pods start held by a scheduling gate, both masters are let go
    first, then both workers. Each job then holds one slot and waits for the other's: the
    masters run and train nothing, the workers stay Pending with the scheduler's reason."""
    names = [kube.unique("gpupipe-deadlock") for _ in range(2)]
    try:
        for name in names:
            kube.apply(_held_job(namespace, dataset, _slot_config(image), name))
        kube.wait_until(
            "both jobs' pods",
            lambda: all(len(kube.job_pods(namespace, n)) == 2 for n in names),
            120,
        )
        masters = [_release(namespace, n, "master") for n in names]
        kube.wait_until(
            "both masters running",
            lambda: all(kube.pod_phase(namespace, m) == "Running" for m in masters),
            180,
        )
        workers = [_release(namespace, n, "worker") for n in names]
        kube.wait_until(
            "the scheduler to find no slot for either worker",
            lambda: all(_unschedulable(namespace, w) for w in workers),
            60,
        )
        time.sleep(30)  # and nothing moves
        for master, worker in zip(masters, workers, strict=True):
            assert kube.pod_phase(namespace, master) == "Running", master
            assert kube.pod_phase(namespace, worker) == "Pending", worker
            assert kube.pod_steps(namespace, master, "pytorch") == 0, kube.logs(namespace, master)
            assert f"Insufficient {SLOT}" in _unschedulable(namespace, worker)
    finally:
        for name in names:
            kube.kubectl("delete", "pytorchjob", "-n", namespace, name, "--wait=false", check=False)
        kube.wait_until(
            "the two jobs to be deleted",
            lambda: all(kube.job_gone(namespace, n) for n in names),
            120,
        )


@pytest.mark.ci_allowance(600)
def test_with_a_queue_the_same_two_jobs_run_whole_one_after_the_other(
    two_slots: str, namespace: str, image: str, dataset: str
) -> None:
    """The same two jobs through a queue whose quota is the two slots, launched by the train
    step's launcher (``gang_queue``): Kueue admits the first whole; the second waits whole, its
    step saying where and why, then runs; both finish."""
    quota = {"cpu": "64", "memory": "256Gi", SLOT: "2"}
    with kube.kueue_queue(namespace, "gpupipe-slots", quota) as queue:
        runs = [
            launch(namespace, image, dataset, _slot_config(image, gang_queue=queue))
            for _ in range(2)
        ]
        for run in runs:
            exit_state = run.done()
            assert exit_state["exitCode"] == 0, run.log()[-3000:]
    waited = [run.log() for run in runs if "waiting for admission" in run.log()]
    assert len(waited) == 1, [run.log()[-2000:] for run in runs]
    assert f"waiting for admission in queue {queue} (position 1): " in waited[0], waited[0][-3000:]
    assert f"insufficient unused quota for {SLOT}" in waited[0], waited[0][-3000:]
