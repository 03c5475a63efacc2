"""Why a custom resource failed, in one message: its conditions, the main pod's exit code,
recent events of the object and the pod, and the pod's last log lines (credentials redacted)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainer.base.redact import redact
from trainer.launch.kube import KubeApi, KubeApiError
from trainer.launch.podlog import PodLog

EVENTS_SHOWN = 10
"""The newest events a failure's message shows."""


def diagnose(
    api: KubeApi,
    namespace: str,
    name: str,
    what: str,
    obj: Mapping[str, Any],
    *,
    pod: Mapping[str, Any] | None,
    pod_log: PodLog,
    container: str,
    role: str = "master",
) -> str:
    """Why the object ``namespace/name`` (``what``: ``PyTorchJob team-a/x``) failed: conditions,
    the pod's exit code, recent events, last lines."""
    conds = (obj.get("status") or {}).get("conditions") or []
    failed: Mapping[str, Any] = next((c for c in reversed(conds) if c.get("type") == "Failed"), {})
    parts = [
        f"{what} failed: {failed.get('reason', 'Failed')}: {failed.get('message', '(no message)')}",
        "conditions: " + "; ".join(_condition(c) for c in conds),
    ]
    if (exit_line := _exit_code(pod, container, role)) is not None:
        parts.append(exit_line)
    parts.append(_events(api, namespace, [name] + ([pod["metadata"]["name"]] if pod else [])))
    try:
        lines = pod_log.last_lines(pod)
    except KubeApiError as e:
        lines = [f"(log unavailable: {e})"]
    pod_name = pod["metadata"]["name"] if pod else "gone"
    parts.append(f"last {len(lines)} lines of the {role}'s log (pod {pod_name}):")
    parts += [f"  {line}" for line in lines]
    return redact("\n".join(parts))


def _events(api: KubeApi, namespace: str, names: list[str]) -> str:
    try:
        events = [e for n in names for e in api.events(namespace, n)]
    except KubeApiError as e:
        return f"recent events: unavailable ({e})"
    events.sort(key=event_time)
    shown = [
        f"  {e.get('type', '')} {e.get('reason', '')} "
        f"{(e.get('involvedObject') or {}).get('kind', '')}/"
        f"{(e.get('involvedObject') or {}).get('name', '')}: {e.get('message', '')}"
        for e in events[-EVENTS_SHOWN:]
    ]
    return "\n".join(["recent events:", *shown] if shown else ["recent events: none"])


def _condition(cond: Mapping[str, Any]) -> str:
    text = f"{cond.get('type')}={cond.get('status')}"
    if cond.get("status") == "True" and (cond.get("reason") or cond.get("message")):
        text += f" ({cond.get('reason', '')}: {cond.get('message', '')})"
    return text


def _exit_code(pod: Mapping[str, Any] | None, container: str, role: str) -> str | None:
    """How the pod's ``container`` ended, if it has."""
    if pod is None:
        return None
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != container:
            continue
        for key in ("state", "lastState"):
            ended = (status.get(key) or {}).get("terminated")
            if ended:
                return (
                    f"{role} pod {pod['metadata']['name']}: container {container} exited with "
                    f"code {ended.get('exitCode')} ({ended.get('reason', 'no reason')})"
                )
    return None


def unscheduled(pod: Mapping[str, Any] | None) -> str | None:
    """Why a Pending pod has no node yet, as the scheduler says it (``0/1 nodes are available:
    1 Insufficient nvidia.com/gpu. ...``), or ``None`` when it is scheduled or not Pending."""
    status = (pod or {}).get("status") or {}
    if status.get("phase") != "Pending":
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            text = " ".join(str(cond.get("message") or "").split())
            return redact(text) or str(cond.get("reason") or "not scheduled")
    return None


LOST_NODE_REASONS = ("DeletionByTaintManager",)
"""The ``DisruptionTarget`` reasons of a pod deleted because its node stopped answering: the
node lifecycle controller tainted the node ``NoExecute`` (``unreachable``, ``not-ready``) and the
taint-eviction controller deleted the pod once its toleration ran out."""


def lost_with_its_node(pod: Mapping[str, Any] | None) -> str | None:
    """A line for a pod that was deleted because its node was lost and that its node has not let
    go of (the kubelet there confirms a pod's end; a lost node never does): the pod object
    stays, Terminating, and a controller that names its replicas (the Training Operator's
    ``<job>-worker-0``) cannot create the replacement until it is gone. ``None`` for any other
    pod."""
    meta = (pod or {}).get("metadata") or {}
    if not meta.get("deletionTimestamp"):
        return None
    status = (pod or {}).get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("reason") in LOST_NODE_REASONS:
            node = ((pod or {}).get("spec") or {}).get("nodeName") or "its node"
            return (
                f"its pod {meta.get('name')} was evicted from node {node}, which stopped "
                f"answering, and stays Terminating until that node comes back or is marked "
                "node.kubernetes.io/out-of-service (non-graceful node shutdown); the job's "
                "replacement for it waits until then"
            )
    return None


def event_time(event: Mapping[str, Any]) -> str:
    """When an event last happened, as a string that sorts by time."""
    meta = event.get("metadata") or {}
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or meta.get("creationTimestamp")
        or ""
    )
