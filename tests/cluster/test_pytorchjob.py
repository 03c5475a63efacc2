"""The train step's PyTorchJob path on a real cluster: the launcher runs in a pod under the
``pipeline-runner`` account and our Role, in a namespace that enforces restricted Pod Security,
and the Training Operator (built from upstream, in the cluster) runs a 2-replica job (master +
worker, gloo on CPU) of the trainer's image that reads and writes the in-cluster object store.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster import kube, launchers
from tests.cluster.kube import JOB_TIMEOUT_S, Launch, launch


def train_config(image: str, **over: Any) -> dict[str, Any]:
    """The train step's config for a 2-node CPU PyTorchJob of the demo table."""
    return kube.train_config(image, "pytorchjob", **over)


def worker_steps(namespace: str, pod: str) -> int:
    """The highest training step a replica's log reports."""
    return kube.pod_steps(namespace, pod, "pytorch")


def master_steps(namespace: str, job: str) -> int:
    """The highest training step the master's log reports."""
    return worker_steps(namespace, f"{job}-master-0")


PYTORCHJOB = launchers.JobKind(
    kind="pytorchjob", title="job", lead="the master", lead_steps=master_steps, config=train_config
)


@pytest.fixture(scope="module")
def reference(namespace: str, image: str, dataset: str) -> Launch:
    """A 2-replica job run to the end, uninterrupted: test 1, and the weights test 3 matches."""
    return launchers.run_to_the_end(namespace, image, dataset, train_config(image))


def test_two_replica_job_trains_streams_the_master_log_and_stores_the_model(
    reference: Launch,
) -> None:
    # The master's JSON log lines (loss per step) reached the launcher's own log.
    launchers.check_trained_and_stored(reference)


def test_bad_input_fails_the_job_once_with_the_workers_error_line(
    namespace: str, image: str, dataset: str
) -> None:
    # The workers' exit 2 is one that ExitCode must not retry.
    run, log = launchers.launch_on_bad_input(PYTORCHJOB, namespace, image, dataset)
    # The job's conditions and events are in the message.
    assert "Failed" in log
    job = PYTORCHJOB.get(namespace, run.job)
    assert any(c["type"] == "Failed" and c["status"] == "True" for c in job["status"]["conditions"])
    launchers.check_failed_once_and_delete(PYTORCHJOB, run)


def test_a_lost_worker_is_restarted_and_the_job_resumes_to_the_same_weights(
    namespace: str, image: str, dataset: str, reference: Launch
) -> None:
    run = launch(namespace, image, dataset, train_config(image))
    worker = f"{run.job}-worker-0"
    kube.wait_until(
        "the job to pass its first checkpoint",
        lambda: (
            kube.pod_phase(namespace, f"{run.job}-master-0") == "Running"
            and master_steps(namespace, run.job) >= 12
        ),
        timeout=JOB_TIMEOUT_S,
        interval=2,
    )
    master_log = kube.logs(namespace, f"{run.job}-master-0", "pytorch")
    assert '"event": "done"' not in master_log, "training ended before the worker was lost"
    launchers.force_delete_pod(namespace, worker)
    log = launchers.finished(run)
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
    launchers.check_resumed_to_the_reference(run, log, reference)


def test_deadline_deletes_the_job_and_names_the_deadline(
    namespace: str, image: str, dataset: str
) -> None:
    launchers.check_deadline_deletes_the_job(PYTORCHJOB, namespace, image, dataset)


def test_sigterm_to_the_launcher_deletes_the_job_and_leaves_no_pod(
    namespace: str, image: str, dataset: str
) -> None:
    run = launch(namespace, image, dataset, train_config(image, train__epochs=500))
    launchers.sigterm_while_training(PYTORCHJOB, run)
    PYTORCHJOB.wait_gone(run)


def test_a_restarted_launcher_adopts_its_job(namespace: str, image: str, dataset: str) -> None:
    launchers.check_a_restarted_launcher_adopts_its_job(PYTORCHJOB, namespace, image, dataset)


def test_restricted_pod_security_is_enforced_and_our_pods_pass(
    namespace: str, reference: Launch
) -> None:
    launchers.check_restricted_is_enforced_and_admitted(namespace, reference)
