"""The train step's PyTorchJob path on a real cluster: the launcher runs in a pod under the
``pipeline-runner`` account and our Role, in a namespace that enforces restricted Pod Security,
and the Training Operator (built from upstream, in the cluster) runs a 2-replica job (master +
worker, gloo on CPU) of the trainer's image that reads and writes the in-cluster object store.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

from tests.cluster import kube
from tests.cluster.kube import JOB_TIMEOUT_S, Launch, kill_container, launch, weights
from trainer.base import storage
from trainer.models.export import load_model


def train_config(image: str, **over: Any) -> dict[str, Any]:
    """The train step's config for a 2-node CPU PyTorchJob of the demo table."""
    return kube.train_config(image, "pytorchjob", **over)


def worker_steps(namespace: str, pod: str) -> int:
    """The highest training step a replica's log reports."""
    return kube.pod_steps(namespace, pod, "pytorch")


def job_gone(namespace: str, job: str) -> bool:
    return kube.job_gone(namespace, job, "pytorchjob")


@pytest.fixture(scope="module")
def reference(namespace: str, image: str, dataset: str) -> Launch:
    """A 2-replica job run to the end, uninterrupted: test 1, and the weights test 3 matches."""
    run = launch(namespace, image, dataset, train_config(image))
    run.exit = run.done()
    return run


def test_two_replica_job_trains_streams_the_master_log_and_stores_the_model(
    reference: Launch,
) -> None:
    log = reference.log()
    assert reference.exit is not None
    assert reference.exit["exitCode"] == 0, f"launcher failed:\n{log[-3000:]}"
    # The master's JSON log lines (loss per step) reached the launcher's own log.
    assert re.search(r'"step": \d+.*"loss"', log), log[-3000:]
    loaded = load_model(reference.model)
    assert sum(p.numel() for p in loaded.module.parameters()) > 0
    assert storage.exists(storage.join(reference.model, "metrics.json"))


def test_bad_input_fails_the_job_once_with_the_workers_error_line(
    namespace: str, image: str, dataset: str
) -> None:
    # A dataset whose record is fine (the launcher accepts it) but whose training split is not
    # Parquet: the workers refuse it with exit 2, which ExitCode must not retry.
    bad = f"minio://{kube.BUCKET}/{namespace}/bad-dataset"
    for name in ("schema.json", "stats.json", "val.parquet", "test.parquet"):
        storage.write_bytes(f"{bad}/{name}", storage.read_bytes(f"{dataset}/{name}"))
    storage.write_bytes(f"{bad}/train.parquet", b"not parquet")
    cfg = train_config(image)
    cfg["cluster"]["on_exit"] = "keep"
    run = launch(namespace, image, bad, cfg)
    done = run.done()
    log = run.log()
    assert done["exitCode"] == 2, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith("ERROR [train] E_"), last
    assert "train.parquet" in log
    # The job's conditions and events are in the message.
    assert "Failed" in log
    job = kube.get_json("pytorchjob", "-n", namespace, run.job)
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"]["conditions"])
    for pod in kube.job_pods(namespace, run.job):
        for cs in pod["status"].get("containerStatuses", []):
            assert cs["restartCount"] == 0, f"{pod['metadata']['name']} was restarted"
            assert cs["state"]["terminated"]["exitCode"] == 2
    kube.kubectl("delete", "pytorchjob", "-n", namespace, run.job)


def test_a_lost_worker_is_restarted_and_the_job_resumes_to_the_same_weights(
    namespace: str, image: str, dataset: str, reference: Launch
) -> None:
    run = launch(namespace, image, dataset, train_config(image))
    worker = f"{run.job}-worker-0"
    kube.wait_until(
        "the job to pass its first checkpoint",
        lambda: (
            kube.pod_phase(namespace, f"{run.job}-master-0") == "Running"
            and worker_steps(namespace, f"{run.job}-master-0") >= 12
        ),
        timeout=JOB_TIMEOUT_S,
        interval=2,
    )
    master_log = kube.logs(namespace, f"{run.job}-master-0", "pytorch")
    assert '"event": "done"' not in master_log, "training ended before the worker was lost"
    kube.kubectl("delete", "pod", "-n", namespace, worker, "--grace-period=0", "--force")
    done = run.done()
    log = run.log()
    assert done["exitCode"] == 0, log[-3000:]
    # The operator made a new worker (its pods are cleaned up once the job is done: the events
    # tell), and the job resumed from a checkpoint (not from step 0).
    created = [
        e
        for e in kube.events(namespace)
        if e["involvedObject"]["name"] == run.job
        and e["reason"] == "SuccessfulCreatePod"
        and worker in e["message"]
    ]
    assert sum(e.get("count") or 1 for e in created) >= 2, created
    assert re.search(r"resum", log, re.IGNORECASE), log[-3000:]
    ours, theirs = weights(run.model), weights(reference.model)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), f"{name} differs from the uninterrupted run"


def test_deadline_deletes_the_job_and_names_the_deadline(
    namespace: str, image: str, dataset: str
) -> None:
    cfg = train_config(image, train__epochs=500)
    cfg["timeout_s"] = 45
    run = launch(namespace, image, dataset, cfg)
    done = run.done()
    log = run.log()
    assert done["exitCode"] != 0, log[-3000:]
    assert re.search(r"deadline|timed out|timeout", log.strip().splitlines()[-1], re.I), log[-2000:]
    kube.wait_until(
        f"job {run.job} and its pods to be deleted", lambda: job_gone(namespace, run.job), 120
    )


def test_sigterm_to_the_launcher_deletes_the_job_and_leaves_no_pod(
    namespace: str, image: str, dataset: str
) -> None:
    run = launch(namespace, image, dataset, train_config(image, train__epochs=500))
    kube.wait_until(
        "the master to train",
        lambda: worker_steps(namespace, f"{run.job}-master-0") >= 1,
        JOB_TIMEOUT_S,
        interval=2,
    )
    kube.kubectl("delete", "pod", "-n", namespace, run.pod, "--wait=false")  # SIGTERM
    kube.wait_until(
        f"job {run.job} and its pods to be deleted", lambda: job_gone(namespace, run.job), 120
    )


def test_a_restarted_launcher_adopts_its_job(namespace: str, image: str, dataset: str) -> None:
    cfg = train_config(image, train__epochs=12)
    first = launch(namespace, image, dataset, cfg)
    kube.wait_until(
        "the master to train",
        lambda: worker_steps(namespace, f"{first.job}-master-0") >= 1,
        JOB_TIMEOUT_S,
        interval=2,
    )
    uid = kube.get_json("pytorchjob", "-n", namespace, first.job)["metadata"]["uid"]
    kill_container(namespace, first.pod)
    assert first.done(60)["exitCode"] == 137
    second = launch(namespace, image, dataset, cfg, job=first.job, base=first.base)
    done = second.done()
    log = second.log()
    assert done["exitCode"] == 0, log[-3000:]
    assert kube.get_json("pytorchjob", "-n", namespace, first.job)["metadata"]["uid"] == uid
    assert [j["metadata"]["name"] for j in kube.jobs(namespace)].count(first.job) == 1
    assert storage.exists(storage.join(second.model, "model.safetensors"))


def test_restricted_pod_security_is_enforced_and_our_pods_pass(
    namespace: str, reference: Launch
) -> None:
    # The namespace really refuses what restricted forbids ...
    bad = kube.launcher_pod("privileged-probe", namespace, kube.BUSYBOX_IMAGE, [])
    bad["spec"]["securityContext"] = {}
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    proc = kube.kubectl("apply", "-f", "-", input=json.dumps(bad), check=False)
    assert proc.returncode != 0 and "violates PodSecurity" in proc.stderr, proc.stderr
    # ... and admitted the launcher and both replicas of the reference job as they are.
    assert reference.exit is not None and reference.exit["exitCode"] == 0
