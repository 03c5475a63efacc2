"""Whether any node can ever hold a GPU job's pod, read before the job is created.

A pod that asks more GPUs than any node has stays Pending until the step's deadline (hours, by
default); the scheduler's reason says so, but only once the pod exists and only as "0/N nodes are
available". The launchers read the nodes' allocatable first and refuse such a job in one line.
Allocatable, not free: GPUs held by other jobs come back, and a job that must wait for them
waits (the launcher logs the scheduler's reason meanwhile). Where a cluster autoscaler adds GPU
nodes when pods ask for them, none may exist yet: ``cluster.gpu_node_check`` false turns the
check off. Where the step's account may not list nodes (no ClusterRole), the job is created
unchecked, as before.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from trainer.base.errors import InputError
from trainer.launch.jobspec import JobSpec
from trainer.launch.kube import KubeApi, KubeApiError
from trainer.launch.kubefields import parse_quantity

log = logging.getLogger(__name__)


def _allocatable(node: Mapping[str, Any], resource: str) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    if value is None:
        return 0
    try:
        return int(parse_quantity(str(value), resource))
    except (InputError, ValueError, ArithmeticError):
        return 0


def gpu_shortfall(
    nodes: list[dict[str, Any]], *, resource: str, per_pod: int, selector: Mapping[str, str]
) -> str | None:
    """Why no node can hold a pod that asks ``per_pod`` of ``resource`` on nodes labelled
    ``selector``; ``None`` when one can (by its allocatable, whatever other pods hold now)."""
    if per_pod <= 0:
        return None
    labels = {id(n): (n.get("metadata") or {}).get("labels") or {} for n in nodes}
    matching = [n for n in nodes if all(labels[id(n)].get(k) == v for k, v in selector.items())]
    where = f" with the labels {dict(selector)}" if selector else ""
    if not matching:
        return (
            f"the pods ask {per_pod} {resource} each on a node{where}, but none of the "
            f"cluster's {len(nodes)} node(s) has those labels"
        )
    best = max(matching, key=lambda n: _allocatable(n, resource))
    most = _allocatable(best, resource)
    if most >= per_pod:
        return None
    if most == 0:
        has = f"none of its {len(matching)} node(s){where} has any"
    else:
        name = (best.get("metadata") or {}).get("name", "?")
        has = f"the most a node{where} has is {most} ({name})"
    return f"the pods ask {per_pod} {resource} each, but {has}"


def check_gpu_nodes(api: KubeApi, spec: JobSpec) -> None:
    """Refuse ``spec``'s job when no node can hold one of its pods' GPUs (:func:`gpu_shortfall`).

    Raises:
        InputError: ``E_NO_GPU_NODE``, what the pods ask and the most any node has.
    """
    per_pod, cluster = spec.run.gpus_per_node, spec.cluster
    if per_pod <= 0 or not cluster.gpu_node_check:
        return
    try:
        nodes = api.list_nodes()
    except KubeApiError as e:
        # Never a failure of the run: the check only saves waiting for the deadline.
        log.info("the nodes' GPUs were not checked before the job was created: %s", e)
        return
    why = gpu_shortfall(
        nodes, resource=cluster.gpu_resource, per_pod=per_pod, selector=cluster.node_selector
    )
    if why is None:
        return
    raise InputError(
        "E_NO_GPU_NODE",
        f"{why}: the job would wait for ever; ask fewer GPUs per node, or another gpu_type or "
        "node selector (cluster.gpu_node_check false where an autoscaler adds GPU nodes)",
        f"{spec.run.step}.gpus_per_node",
    )
