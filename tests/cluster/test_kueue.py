"""Gang admission with Kueue (issue 64 items 4-6, hack/cluster/addons/kueue.sh): the train step's
launcher, under the runner's Role, creates its job with `gang_queue`; Kueue (built from upstream,
in the cluster) admits a job only when all of its pods fit the ClusterQueue's quota.

Each test's queue has room for three of the test jobs' pods (a quarter CPU each): a 2-pod job
fits, a second waits whole (no pod of it exists) until the first is done, and a 4-pod job never
fits. Skipped, saying so, where the cluster was brought up without the ``kueue`` add-on.
"""

from __future__ import annotations

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
    with kube.kueue_queue(namespace, QUEUE, ROOM_PODS) as name:
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
