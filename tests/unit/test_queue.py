"""Where a queued job stands in its Kueue queue (trainer/launch/queue.py), from the Workloads as
Kueue writes them: the order Kueue admits in (priority, then age), and its reasons."""

from __future__ import annotations

from typing import Any

from trainer.launch.queue import JOB_UID_LABEL, queue_wait


def workload(
    name: str, uid: str, created: str, *, queue: str = "q", priority: int = 0, **conditions: Any
) -> dict[str, Any]:
    conds = [{"type": t, "status": s, "message": m} for t, (s, m) in conditions.items()]
    return {
        "metadata": {"name": name, "creationTimestamp": created, "labels": {JOB_UID_LABEL: uid}},
        "spec": {"queueName": queue, "priority": priority},
        "status": {"conditions": conds},
    }


PENDING = {
    "QuotaReserved": ("False", "insufficient unused quota for cpu in flavor f, 1 more needed")
}


def test_the_position_counts_the_pending_ahead_by_priority_then_age() -> None:
    loads = [
        workload("a", "ua", "2026-12-07T10:00:00Z", **PENDING),
        workload("b", "ub", "2026-12-07T10:01:00Z", priority=100, **PENDING),  # jumps ahead
        workload("c", "uc", "2026-12-07T10:02:00Z", **PENDING),
        workload("d", "ud", "2026-12-07T09:00:00Z", QuotaReserved=("True", "")),  # admitted
        workload("e", "ue", "2026-12-07T08:00:00Z", queue="other", **PENDING),  # another queue
        workload("f", "uf", "2026-12-07T07:00:00Z", Finished=("True", ""), **PENDING),
    ]
    assert queue_wait(loads, "ub", "q").position == 1
    assert queue_wait(loads, "ua", "q").position == 2
    wait = queue_wait(loads, "uc", "q")
    assert (wait.position, wait.admitted, wait.never) == (3, False, False)
    assert wait.line() == (
        "waiting for admission in queue q (position 3): "
        "insufficient unused quota for cpu in flavor f, 1 more needed"
    )
    assert queue_wait(loads, "ud", "q").admitted


def test_kueues_never_is_told_apart_from_not_yet() -> None:
    too_big = {"QuotaReserved": ("False", "couldn't assign flavors to pod set main: insufficient"
               " quota for cpu in flavor f, previously considered podsets requests (0) + current"
               " podset request (6) > maximum capacity (4)")}  # fmt: skip
    assert queue_wait([workload("a", "ua", "t", **too_big)], "ua", "q").never
    no_queue = {"QuotaReserved": ("False", "LocalQueue q doesn't exist")}
    assert queue_wait([workload("a", "ua", "t", **no_queue)], "ua", "q").never


def test_a_job_whose_workload_is_not_there_yet_waits_without_a_position() -> None:
    wait = queue_wait([], "ua", "q")
    assert (wait.admitted, wait.position, wait.reason, wait.never) == (False, None, "", False)
    assert wait.line() == "waiting for admission in queue q"
