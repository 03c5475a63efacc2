"""Kueue: gang admission of the training jobs (``gang_queue``).

A job labelled with a LocalQueue's name is suspended by Kueue's webhook when it is created and
started only when the whole of it (every replica's pods) fits the ClusterQueue's free quota: two
jobs never each hold half their pods and wait for ever. Kueue tracks each job in a Workload
(labelled with the job's UID); while the job waits, the launcher reads it to say where the job
stands in its queue, and fails the step in one line when Kueue says the job can never be
admitted (it asks more than the queue's whole quota, or the queue does not exist).

The position is counted among the namespace's Workloads pending in the same LocalQueue, in the
order Kueue admits them (higher priority first, then older first): what ``kueuectl``'s pending
list calls the position in the LocalQueue. (Kueue's visibility API would give it too, but it is
an aggregated API that many clusters, and the test cluster, do not serve.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
"""The job's LocalQueue (``gang_queue``)."""
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
"""The job's WorkloadPriorityClass (``gang_priority_class``)."""
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
"""Kueue's label on a job's Workload: the job's UID."""

NEVER_FITS = ("> maximum capacity",)
"""Kueue's words (its flavor assigner's) for a request larger than the queue's whole quota."""
NO_QUEUE = "doesn't exist"
"""Kueue's words for a LocalQueue (or ClusterQueue) that is not there."""


def queue_of(obj: Mapping[str, Any]) -> str | None:
    """The LocalQueue a job is labelled with (None: Kueue does not manage it)."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)


def _condition(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (workload.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return None


def _pending(workload: Mapping[str, Any]) -> bool:
    done = _condition(workload, "Finished")
    reserved = _condition(workload, "QuotaReserved")
    return not (done and done.get("status") == "True") and not (
        reserved and reserved.get("status") == "True"
    )


def _order(workload: Mapping[str, Any]) -> tuple[int, str, str]:
    meta = workload.get("metadata") or {}
    priority = int((workload.get("spec") or {}).get("priority") or 0)
    return -priority, str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


@dataclass(frozen=True, slots=True)
class QueueWait:
    """Where a queued job stands."""

    queue: str
    admitted: bool
    """Kueue reserved quota for it (its pods are about to start, or run)."""
    position: int | None
    """1 for the next to be admitted; None when its Workload is not there yet."""
    reason: str
    """Kueue's message on the Workload (why it is not admitted yet), or empty."""

    @property
    def never(self) -> bool:
        """Kueue says it can never be admitted as it is."""
        return any(m in self.reason for m in NEVER_FITS) or NO_QUEUE in self.reason

    def line(self) -> str:
        """``waiting for admission in queue Q (position P): <Kueue's reason>``."""
        where = f" (position {self.position})" if self.position is not None else ""
        why = f": {self.reason}" if self.reason else ""
        return f"waiting for admission in queue {self.queue}{where}{why}"


def queue_wait(workloads: list[dict[str, Any]], job_uid: str, queue: str) -> QueueWait:
    """Where the job with ``job_uid`` stands among ``workloads`` (its namespace's)."""
    mine = [
        w
        for w in workloads
        if (w.get("metadata") or {}).get("labels", {}).get(JOB_UID_LABEL) == job_uid
    ]
    if not mine:
        return QueueWait(queue, admitted=False, position=None, reason="")
    workload = mine[0]
    reserved = _condition(workload, "QuotaReserved")
    if not _pending(workload):
        return QueueWait(queue, admitted=True, position=None, reason="")
    waiting = sorted(
        (w for w in workloads if (w.get("spec") or {}).get("queueName") == queue and _pending(w)),
        key=_order,
    )
    names = [(w.get("metadata") or {}).get("name") for w in waiting]
    name = (workload.get("metadata") or {}).get("name")
    position = names.index(name) + 1 if name in names else None
    reason = " ".join(str((reserved or {}).get("message") or "").split())
    return QueueWait(queue, admitted=False, position=position, reason=reason)
