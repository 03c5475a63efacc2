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


def test_a_gpu_job_no_node_can_hold_fails_at_once_in_one_line_and_is_never_created(
    namespace: str, image: str, dataset: str
) -> None:
    """Issue 64 item 3: the launcher, under the runner's account (manifests/rbac's ClusterRole:
    list nodes), reads the nodes' allocatable before it creates the job; 3 GPUs a pod is more
    than any node here has (none on a CPU cluster, the gpu add-on's node 2), so the step fails
    in one line, exit 2, rather than waiting Pending for its deadline."""
    run = launch(namespace, image, dataset, train_config(image, gpus_per_node=3))
    done = run.done(timeout=300)
    log = run.log()
    assert done["exitCode"] == 2, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith(
        "ERROR [train] E_NO_GPU_NODE: the pods ask 3 nvidia.com/gpu each, but "
    ), last
    assert last.endswith("(train.gpus_per_node)"), last
    assert kube.job_gone(namespace, run.job), "the job was created"


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
